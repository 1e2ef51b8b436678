"""torch.compile(fullgraph=True) over the kdtree ops: each op is one opaque extern call in Inductor's code,
nothing breaks the graph, one compile serves every N, B, T (dynamic shapes), the traced graph's node targets
match a snapshot, and the mask helpers and the `_out` variant compile too. (`mode="reduce-overhead"`, which
records CUDA graphs, is in the GPU suite test_cuda_graphs.py.)
"""

from __future__ import annotations

import re

import expecttest
import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

import kdtree_ops.ops as ops
from kdtree_ops.testing.cases import make_verify_case
from kdtree_ops.testing.reference import tree_verify_attention_reference
from kdtree_ops.testing.trees import ancestor_matrix, random_tree

GQA = dict(num_q_heads=4, num_kv_heads=2, head_dim_qk=16, head_dim_v=16)
# Batches of different N, B and T (and prefix lengths, so S and len(kv_indices) vary too).
VARYING_BATCHES = [([5, 9], [7, 3]), ([3, 12, 7], [2, 9, 5]), ([20, 2, 6, 11], [4, 0, 13, 6]), ([31, 17], [1, 2])]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def extern_calls(code: str, op: str) -> int:
    """Calls of torch.ops.kdtree.<op> in Inductor's generated code (statements only: not the comments that
    name the source nodes, nor the metadata asserts that quote the op's name)."""
    return len(re.findall(rf"^\s*(?:\w+ = )?torch\.ops\.kdtree\.{op}\.default\(", code, flags=re.M))


def _case(tree_sizes, prefix_lens, seed=0, **kwargs):
    return make_verify_case(tree_sizes=tree_sizes, prefix_lens=prefix_lens, **{**GQA, **kwargs},
                            generator=torch.Generator().manual_seed(seed))


def _check_close(out, case, rtol=1e-4, atol=1e-5):
    ref = tree_verify_attention_reference(*case.args())
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


def attention_then_projection(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale,
                              logit_cap=0.0, k_draft=None, v_draft=None):
    """What a model does around the op: scale q, attend, flatten heads for the output projection."""
    out = ops.tree_verify_attention(q * 1.0, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, tree_mask,
                                    sm_scale, logit_cap, k_draft, v_draft)
    return out.flatten(1) * 2.0


def test_one_extern_call_in_inductor_code():
    case = _case([5, 9], [7, 3])
    fn = torch.compile(attention_then_projection, backend="inductor", fullgraph=True)
    out, codes = run_and_get_code(fn, *case.args())
    code = "\n".join(codes)
    assert extern_calls(code, "tree_verify_attention") == 1, code
    _check_close(out.view(case.q.shape[0], 4, 16) / 2.0, case)


def test_no_graph_breaks():
    case = _case([5, 9], [7, 3], draft_mode="separate", logit_cap=3.0)

    def verify(*args):
        return ops.tree_verify_attention(*args).sum(-1)

    explained = torch._dynamo.explain(verify)(*case.args())
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    torch.compile(verify, backend="inductor", fullgraph=True)(*case.args())
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.parametrize("draft_mode", ["cache", "separate"])
def test_one_compile_across_n_b_t(draft_mode):
    counter = CompileCounterWithBackend("inductor")
    fn = torch.compile(attention_then_projection, backend=counter, fullgraph=True)
    for i, (sizes, prefixes) in enumerate(VARYING_BATCHES):
        case = _case(sizes, prefixes, seed=i, draft_mode=draft_mode)
        # N, S, B+1 and len(kv_indices) change from call to call.
        for t in (case.q, case.k_cache, case.v_cache, case.qo_indptr, case.kv_indptr, case.kv_indices,
                  case.tree_mask, case.k_draft, case.v_draft):
            if t is not None:
                torch._dynamo.mark_dynamic(t, 0)
        out = fn(*case.args())
        _check_close(out.view(case.q.shape[0], 4, 16) / 2.0, case)
    assert counter.frame_count == 1, f"{counter.frame_count} compiles for {len(VARYING_BATCHES)} batch shapes"
    assert not counters["graph_break"]


class TracedGraphSnapshot(expecttest.TestCase):
    """The ATen graph that AOTAutograd hands Inductor: node targets only, so the snapshot survives torch
    versions; the op must stay a single opaque node (no decomposition, no copy around it)."""

    def test_node_targets(self):
        graphs = []

        def capture(gm, example_inputs):
            graphs.append(gm)
            return gm

        def verify(parents, q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices):
            tree_mask = ops.tree_mask_from_parents(parents, qo_indptr, 1)
            out = ops.tree_verify_attention(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, 0.25)
            return out.flatten(1)

        case = _case([5, 9], [7, 3])
        args = (case.parents,) + case.args()[:6]
        compiled = torch.compile(verify, backend=aot_autograd(fw_compiler=capture), fullgraph=True)
        torch.testing.assert_close(compiled(*args), verify(*args))
        targets = [str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"]
        self.assertExpectedInline(str(targets), """\
['kdtree.tree_mask_from_parents.default', 'kdtree.tree_verify_attention.default', 'aten.view.default']""")


def _dense_mask_inputs(sizes, prefix_lens, pad, seed):
    gen = torch.Generator().manual_seed(seed)
    trees = [random_tree(t, generator=gen) for t in sizes]
    rows = [torch.cat([torch.ones(len(t), lp, dtype=torch.bool), ancestor_matrix(t)], 1).flatten()
            for t, lp in zip(trees, prefix_lens)]
    starts = torch.tensor([0] + [r.numel() for r in rows], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    qo_indptr = torch.tensor([0] + sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    parents = torch.tensor([p for t in trees for p in t] + [-1] * pad, dtype=torch.int32)
    prefix_lens = torch.tensor(prefix_lens, dtype=torch.int32)
    return torch.cat(rows).to(torch.uint8), starts[:-1], qo_indptr, prefix_lens, parents


def test_mask_helpers_compiled():
    """Both mask builders in one graph, dynamic over N and B: they agree with each other and with eager."""
    counter = CompileCounterWithBackend("inductor")

    def masks(custom_mask, mask_indptr, qo_indptr, prefix_lens, parents):
        from_parents = ops.tree_mask_from_parents(parents, qo_indptr, 2)
        from_dense = ops.tree_mask_from_dense(custom_mask, mask_indptr, qo_indptr, prefix_lens, parents.shape[0], 2)
        return from_parents, from_dense

    fn = torch.compile(masks, backend=counter, fullgraph=True)
    code = None
    for i, (sizes, prefixes, pad) in enumerate([([5, 40], [3, 8], 2), ([7, 3, 33], [0, 4, 2], 3),
                                                 ([12, 9, 1, 20], [5, 5, 6, 1], 0)]):
        inputs = _dense_mask_inputs(sizes, prefixes, pad, seed=i)
        for t in inputs:
            torch._dynamo.mark_dynamic(t, 0)
        if i == 0:
            (got_parents, got_dense), codes = run_and_get_code(fn, *inputs)
            code = "\n".join(codes)
        else:
            got_parents, got_dense = fn(*inputs)
        want_parents, want_dense = masks(*inputs)
        torch.testing.assert_close(got_parents, want_parents, rtol=0, atol=0)
        torch.testing.assert_close(got_dense, want_dense, rtol=0, atol=0)
        torch.testing.assert_close(got_parents, got_dense, rtol=0, atol=0)
        assert got_parents[sum(sizes):].eq(0).all(), "padding rows must be zero"
    assert extern_calls(code, "tree_mask_from_parents") == 1 and extern_calls(code, "tree_mask_from_dense") == 1
    assert counter.frame_count == 1 and not counters["graph_break"]


def test_out_variant_compiled():
    """The `_out` variant writes a caller's buffer (a graph input, as SGLang's output tensor) in place;
    Inductor re-inplaces its functionalized form back into one direct call, and the input sees the write."""

    def verify_into(out, stats, *args):
        ops.tree_verify_attention_out(*args, out=out)
        ops.record_divergence(out, out * 1.0, stats)  # a second mutating op on the same graph
        return out.sum()

    counter = CompileCounterWithBackend("inductor")
    fn = torch.compile(verify_into, backend=counter, fullgraph=True)
    for i, (sizes, prefixes) in enumerate(VARYING_BATCHES[:3]):
        case = _case(sizes, prefixes, seed=i, layout="strided")
        out = torch.full(ops.attention_output_shape(case.q, case.v_cache), float("nan"))
        stats = torch.zeros(3)
        for t in (out, case.q, case.k_cache, case.v_cache, case.qo_indptr, case.kv_indptr, case.kv_indices,
                  case.tree_mask):
            torch._dynamo.mark_dynamic(t, 0)
        if i == 0:
            total, codes = run_and_get_code(fn, out, stats, *case.args())
            code = "\n".join(codes)
            assert extern_calls(code, "tree_verify_attention_out") == 1, code
            assert extern_calls(code, "record_divergence") == 1, code
        else:
            total = fn(out, stats, *case.args())
        _check_close(out, case)
        torch.testing.assert_close(total, out.sum())
        torch.testing.assert_close(stats, torch.tensor([0.0, 0.0, 1.0]))
    assert counter.frame_count == 1 and not counters["graph_break"]
