"""torch.cuda.CUDAGraph capture of the kdtree ops, then replay with new inputs within the captured bucket.

What SGLang's graph runner does: capture once per bucket (B requests, N query rows, kv_indices capacity,
cache pool), then before each replay copy the batch into the static buffers. Here each bucket captures
    tree mask  (tree_mask_from_parents | tree_mask_from_dense in the graph, or a mask copied in)
    -> tree_verify_attention_out into a static `out`
    -> record_divergence(out, expected, stats)
and every round brings new trees (sizes and shapes), new per-request prefix lengths and new fragmented
slots. After each replay, `out` must equal eager on the same static buffers exactly (same shapes: same
kernels, same split), match the float64 reference, and have zero padding rows; `stats` must have counted
every replay. Last, torch.compile(mode="reduce-overhead") records the op in CUDA-graph trees.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import pytest
import torch
from torch._dynamo.utils import counters

from kdtree_ops.testing.cases import make_verify_case
from kdtree_ops.testing.reference import tree_verify_attention_reference
from kdtree_ops.shapes import mask_words
from kdtree_ops.testing.trees import ancestor_matrix

pytestmark = pytest.mark.cuda

TOLERANCES = {  # relative L2 and max abs error against the float64 reference (see test_cuda_numerics.py)
    torch.bfloat16: dict(rel_l2=1e-2, max_abs=3e-2),
    torch.float16: dict(rel_l2=2e-3, max_abs=4e-3),
}


@dataclass(frozen=True)
class Bucket:
    """One captured graph: head shapes, dtype, draft mode, layout, mask source, and the bucket's sizes."""

    name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    dtype: torch.dtype
    draft_mode: str  # "cache" | "separate"
    layout: str  # "contiguous" | "strided" | "mla"
    mask_source: str  # "parents" | "dense" | "copied"
    batch: int  # B
    rows: int  # N (query rows; each round pads to it)
    max_prefix: int  # L_b drawn from [0, max_prefix]
    rounds: list = field(default=None, hash=False)  # explicit [(tree_sizes, prefix_lens)], else random
    num_rounds: int = 4


def _gqa(name, hq, hkv, d, dtype, draft, layout, mask, batch=4, rows=96, max_prefix=700, **kw):
    return Bucket(name, hq, hkv, d, d, dtype, draft, layout, mask, batch, rows, max_prefix, **kw)


def _mla(name, h, dtype, draft, mask, batch=3, rows=72, max_prefix=900, **kw):
    return Bucket(name, h, 1, 576, 512, dtype, draft, "mla", mask, batch, rows, max_prefix, **kw)


BF16, FP16 = torch.bfloat16, torch.float16
BUCKETS = [
    # GQA: head dims 64/128/256, group sizes 1..16, both dtypes, both draft modes, both layouts, every mask source
    _gqa("gqa_d64_g1", 4, 4, 64, BF16, "cache", "contiguous", "parents"),
    _gqa("gqa_d64_g3", 6, 2, 64, FP16, "separate", "strided", "dense"),
    _gqa("gqa_d128_g4", 32, 8, 128, BF16, "separate", "contiguous", "dense"),
    _gqa("gqa_d128_g8", 16, 2, 128, FP16, "cache", "strided", "copied"),
    _gqa("gqa_d128_g16", 16, 1, 128, BF16, "cache", "contiguous", "parents"),
    _gqa("gqa_d256_g2", 8, 4, 256, BF16, "separate", "strided", "parents"),
    _gqa("gqa_d256_g16", 16, 1, 256, FP16, "cache", "contiguous", "dense"),
    # MLA 576/512, v a view of k, 8..128 heads
    _mla("mla_h8", 8, BF16, "cache", "parents"),
    _mla("mla_h16", 16, BF16, "separate", "dense"),
    _mla("mla_h32", 32, FP16, "cache", "copied"),
    _mla("mla_h64", 64, BF16, "separate", "parents"),
    _mla("mla_h128", 128, FP16, "separate", "dense", batch=2, rows=64, max_prefix=2000),
    # big: 1024-token trees, 64k prefixes
    _gqa("gqa_tree1024", 32, 8, 128, BF16, "cache", "contiguous", "parents", batch=1, rows=1024,
         max_prefix=4096, rounds=[([1024], [4096]), ([700], [17]), ([1], [2500])]),
    _gqa("gqa_prefix64k", 32, 8, 128, BF16, "separate", "strided", "dense", batch=2, rows=128,
         max_prefix=65536, rounds=[([64, 64], [65536, 100]), ([10, 40], [3000, 65536]), ([0, 64], [0, 40000])]),
    _mla("mla_tree1024", 16, BF16, "separate", "dense", batch=2, rows=1040, max_prefix=2048,
         rounds=[([1024, 16], [2048, 2048]), ([300, 0], [5, 2048]), ([1000, 16], [1024, 0])]),
]


def _rounds(bucket: Bucket) -> list[tuple[list[int], list[int]]]:
    """Per round (tree_sizes, prefix_lens): the full bucket first, then random fills (some requests idle)."""
    if bucket.rounds is not None:
        return bucket.rounds
    g = torch.Generator().manual_seed(zlib.crc32(bucket.name.encode()))
    per = bucket.rows // bucket.batch
    rounds = [([per] * bucket.batch, [bucket.max_prefix] * bucket.batch)]
    for _ in range(bucket.num_rounds - 1):
        sizes = torch.randint(0, per + 1, (bucket.batch,), generator=g)
        sizes[torch.randint(0, bucket.batch, (1,), generator=g)] = 0  # an idle request in every round
        rounds.append((sizes.tolist(), torch.randint(0, bucket.max_prefix + 1, (bucket.batch,), generator=g).tolist()))
    return rounds


def _clone_keep_layout(t, memo):
    """A copy of `t` at a new address with t's strides; views of one base share one new base (aliases kept)."""
    if t is None:
        return None
    base = t if t._base is None else t._base
    if id(base) not in memo:
        memo[id(base)] = base.clone()
    new = memo[id(base)]
    return new.as_strided(t.shape, t.stride(), t.storage_offset() - base.storage_offset() + new.storage_offset())


def _dense_mask(case):
    """SGLang's FULL_MASK of a case: flat bool, request b's [T_b, L_b + T_b] rows at mask_indptr[b]."""
    parts, offsets, qo = [], [0], case.qo_indptr.tolist()
    for b, (t, l) in enumerate(zip(case.tree_sizes, case.prefix_lens)):
        rows = torch.ones(t, l + t, dtype=torch.bool)
        rows[:, l:] = ancestor_matrix(case.parents[qo[b] : qo[b] + t].tolist())
        parts.append(rows.flatten())
        offsets.append(offsets[-1] + t * (l + t))
    return torch.cat(parts), torch.tensor(offsets, dtype=torch.int64)


class StaticInputs:
    """The bucket's static buffers, sized for the largest round, and how a round is copied into them."""

    def __init__(self, cases, words):
        largest = max(cases, key=lambda c: c.k_cache.shape[0])
        memo = {}
        self.q = _clone_keep_layout(largest.q, memo)
        self.k_cache = _clone_keep_layout(largest.k_cache, memo)
        self.v_cache = _clone_keep_layout(largest.v_cache, memo)
        self.k_draft = _clone_keep_layout(largest.k_draft, memo)
        self.v_draft = _clone_keep_layout(largest.v_draft, memo)
        self.tree_mask = _clone_keep_layout(largest.tree_mask, memo)
        self.qo_indptr = largest.qo_indptr.clone()
        self.kv_indptr = largest.kv_indptr.clone()
        self.parents = largest.parents.clone()
        capacity = max(c.kv_indices.numel() for c in cases) + 5
        self.kv_indices = torch.zeros(capacity, dtype=largest.kv_indices.dtype, device="cuda")
        dense = [_dense_mask(c) for c in cases]
        self.custom_mask = torch.zeros(max(m.numel() for m, _ in dense) + 7, dtype=torch.bool, device="cuda")
        self.mask_indptr = torch.zeros(len(largest.tree_sizes) + 1, dtype=torch.int64, device="cuda")
        self.prefix_lens = torch.zeros(len(largest.tree_sizes), dtype=torch.int64, device="cuda")
        self.words, self.sm_scale, self.logit_cap = words, largest.sm_scale, largest.logit_cap
        self._dense = {id(c): m for c, m in zip(cases, dense)}

    def load(self, case):
        """Copies one round's inputs in (new trees, prefix lengths, slots; stale data elsewhere is left)."""
        for name in ("q", "k_draft", "v_draft", "tree_mask", "qo_indptr", "kv_indptr", "parents"):
            src = getattr(case, name)
            if src is not None:
                getattr(self, name).copy_(src)
        slots = case.k_cache.shape[0]
        self.k_cache[:slots].copy_(case.k_cache)
        self.v_cache[:slots].copy_(case.v_cache)
        self.kv_indices[: case.kv_indices.numel()].copy_(case.kv_indices)
        custom_mask, mask_indptr = self._dense[id(case)]
        self.custom_mask[: custom_mask.numel()].copy_(custom_mask)
        self.mask_indptr.copy_(mask_indptr)
        self.prefix_lens.copy_(torch.tensor(case.prefix_lens, dtype=torch.int64))

    def mask(self, ops, source):
        if source == "parents":
            return ops.tree_mask_from_parents(self.parents, self.qo_indptr, self.words)
        if source == "dense":
            return ops.tree_mask_from_dense(self.custom_mask, self.mask_indptr, self.qo_indptr, self.prefix_lens,
                                            self.q.shape[0], self.words)
        return self.tree_mask

    def args(self, mask):
        return (self.q, self.k_cache, self.v_cache, self.qo_indptr, self.kv_indptr, self.kv_indices, mask,
                self.sm_scale, self.logit_cap, self.k_draft, self.v_draft)


@pytest.fixture(scope="module")
def ops():
    import kdtree_ops.ops

    return kdtree_ops.ops


@pytest.mark.parametrize("bucket", BUCKETS, ids=lambda b: b.name)
def test_capture_then_replay_new_batches(ops, bucket):
    rounds = _rounds(bucket)
    words = mask_words(max(max(sizes) for sizes, _ in rounds))
    cases = [
        make_verify_case(
            tree_sizes=sizes, prefix_lens=prefixes, num_q_heads=bucket.num_q_heads, num_kv_heads=bucket.num_kv_heads,
            head_dim_qk=bucket.head_dim_qk, head_dim_v=bucket.head_dim_v, dtype=bucket.dtype, device="cuda",
            draft_mode=bucket.draft_mode, layout=bucket.layout, pad_rows=bucket.rows - sum(sizes), mask_words=words,
            generator=torch.Generator().manual_seed(1000 + r))
        for r, (sizes, prefixes) in enumerate(rounds)
    ]
    static = StaticInputs(cases, words)
    out = torch.full(cases[0].q.shape[:2] + (bucket.head_dim_v,), float("nan"), dtype=bucket.dtype, device="cuda")
    expected = torch.zeros_like(out)
    stats = torch.zeros(3, dtype=torch.float32, device="cuda")

    def step():
        ops.tree_verify_attention_out(*static.args(static.mask(ops, bucket.mask_source)), out=out)
        ops.record_divergence(out, expected, stats)

    # Warm up on a side stream (as torch's graph docs ask), then capture with the first round loaded.
    static.load(cases[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    stats.zero_()
    out.fill_(float("nan"))

    tol = TOLERANCES[bucket.dtype]
    for r, case in enumerate(cases):
        static.load(case)
        expected.copy_(ops.tree_verify_attention(*case.args()))  # eager on the round's own tensors
        out.fill_(float("nan"))  # the replay must write every entry
        graph.replay()
        eager = ops.tree_verify_attention(*static.args(static.mask(ops, bucket.mask_source)))
        torch.cuda.synchronize()
        where = f"round {r}: trees {case.tree_sizes[:6]} prefixes {case.prefix_lens[:6]}"
        assert torch.isfinite(out).all(), f"{where}: the replay left non-finite entries in out"
        assert torch.equal(out, eager), (
            f"{where}: replay differs from eager on the same buffers by {(out.double() - eager.double()).abs().max()}")
        ref = tree_verify_attention_reference(*case.args())
        diff = out.double() - ref
        rel = (diff.norm() / ref.norm().clamp_min(1e-30)).item()
        assert rel < tol["rel_l2"] and diff.abs().max().item() < tol["max_abs"], \
            f"{where}: relative L2 {rel:.3g}, max abs {diff.abs().max().item():.3g} against the reference"
        assert torch.count_nonzero(out[sum(case.tree_sizes):]) == 0, f"{where}: padding rows must be zeros"
        if bucket.mask_source != "copied":  # the in-graph helper rebuilt the mask of this round
            mask = static.mask(ops, bucket.mask_source)
            real = sum(case.tree_sizes)
            torch.testing.assert_close(mask[:real], case.tree_mask[:real].contiguous(), rtol=0, atol=0)
            assert torch.count_nonzero(mask[real:]) == 0

    got = stats.tolist()
    assert got[2] == len(cases), f"record_divergence counted {got[2]} replays of {len(cases)}"
    assert got[1] == 0, "non-finite outputs during replays"
    assert got[0] <= tol["max_abs"], f"replays diverged from eager on the rounds' own tensors by {got[0]}"


def test_helpers_capture_with_changing_batch(ops):
    """The mask helpers alone in a graph: B fixed, trees and rows change every replay (device-side lengths)."""
    from kdtree_ops.testing.reference import tree_mask_from_parents_reference
    from kdtree_ops.testing.trees import random_tree

    rows, batch, words = 600, 5, 8
    parents = torch.full((rows,), -1, dtype=torch.int32, device="cuda")
    qo_indptr = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    ops.tree_mask_from_parents(parents, qo_indptr, words)  # warm-up
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        mask = ops.tree_mask_from_parents(parents, qo_indptr, words)
    g = torch.Generator().manual_seed(4)
    for _ in range(5):
        sizes = torch.randint(0, 120, (batch,), generator=g).tolist()
        flat = [p for t in sizes for p in random_tree(t, generator=g)] + [-1] * (rows - sum(sizes))
        qo = torch.tensor([0] + sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
        parents.copy_(torch.tensor(flat, dtype=torch.int32))
        qo_indptr.copy_(qo)
        graph.replay()
        torch.cuda.synchronize()
        expected = tree_mask_from_parents_reference(torch.tensor(flat, dtype=torch.int32), qo, words)
        torch.testing.assert_close(mask.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("draft_mode", ["cache", "separate"])
def test_reduce_overhead_no_cudagraph_skips(ops, draft_mode):
    """CUDA-graph trees record the op (no skip) and replays with new trees, slots and values match eager."""

    def verify(*args):
        return ops.tree_verify_attention(*args).flatten(1) * 2.0

    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(verify, mode="reduce-overhead", fullgraph=True)
    for seed in range(4):  # same shapes, new trees, slots and values: replays of one recorded graph
        case = make_verify_case(tree_sizes=[24, 9, 40], prefix_lens=[300, 64, 17], num_q_heads=8, num_kv_heads=2,
                                head_dim_qk=128, head_dim_v=128, dtype=torch.bfloat16, draft_mode=draft_mode,
                                pad_rows=7, device="cuda", generator=torch.Generator().manual_seed(seed))
        got = fn(*case.args()).clone()
        # The same kernel on the same inputs (its split and merge order are fixed), and an exact doubling: equal bits.
        assert torch.equal(got, verify(*case.args())), f"replay {seed} differs from eager"
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert not counters["graph_break"]
