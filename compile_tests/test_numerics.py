"""Numerics of every kdtree op against the float64 references (kdtree_ops.testing.reference).

Inputs come from kdtree_ops.testing.cases (random best-first trees, fragmented slots, strided and aliased caches).
Every attention check runs both ops: `tree_verify_attention`, and `tree_verify_attention_out` into a
NaN-poisoned buffer that must come back fully written. Each test takes a `device` from DEVICES: the CPU
always, CUDA when present (marked `cuda`; those run on the GPU machine with its kernel's dtypes and head dims).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kdtree_ops.testing.cases import make_verify_case
from kdtree_ops.testing.reference import (
    record_divergence_reference,
    tree_mask_from_dense_reference,
    tree_mask_from_parents_reference,
    tree_verify_attention_reference,
)
from kdtree_ops.shapes import mask_words
from kdtree_ops.testing.trees import ancestor_mask, ancestor_matrix, random_tree

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DEVICE_PARAMS = [pytest.param(d, marks=pytest.mark.cuda) if d == "cuda" else d for d in DEVICES]

# Dtypes each device's kernel serves (fp32 is CPU-only by the contract).
DTYPES = {"cpu": [torch.float32, torch.bfloat16, torch.float16], "cuda": [torch.bfloat16, torch.float16]}
# Errors relative to the output's scale (outputs are averages of unit-variance values over many keys, 0.1-0.3,
# so an absolute tolerance is loose): relative L2 = |out - ref| / |ref| over the whole output, and the largest
# elementwise error over max |ref|. Inputs are exact in their dtype and the reference is float64, so the error
# is the kernel's: fp32 accumulation plus the output's rounding (bf16 keeps 8 bits, fp16 11); the CUDA kernels
# also round P to the input dtype before P·V. Measured on 200 random CPU cases (worst rel L2 / max): fp32
# 3.3e-7 / 7.3e-7, bf16 1.9e-3 / 3.7e-3, fp16 2.3e-4 / 4.7e-4. A 2 % sm_scale error gives rel L2 >= 2.6e-3 on
# every case (median 1.7e-2): these bounds fail it (bf16 on most cases, fp32 and fp16 on all).
TOLERANCES = {
    ("cpu", torch.float32): dict(rel_l2=1e-5, max_rel=2e-5),
    ("cpu", torch.bfloat16): dict(rel_l2=4e-3, max_rel=8e-3),
    ("cpu", torch.float16): dict(rel_l2=6e-4, max_rel=1.2e-3),
    ("cuda", torch.bfloat16): dict(rel_l2=5e-3, max_rel=1.6e-2),
    ("cuda", torch.float16): dict(rel_l2=2e-3, max_rel=3e-3),
}
# (Dqk, Dv) per device: small on the CPU to keep the suite fast; the CUDA kernels' instantiated sizes there.
GQA_HEAD_DIMS = {"cpu": [(8, 8), (16, 16), (32, 32), (24, 16)], "cuda": [(64, 64), (128, 128), (256, 256)]}
MLA_HEAD_DIMS = {"cpu": [(40, 32), (72, 64)], "cuda": [(576, 512)]}
# (Hq, Hkv): MHA, GQA of several group sizes, MQA.
GQA_HEADS = [(1, 1), (3, 3), (4, 2), (8, 2), (6, 3), (4, 1), (8, 1)]


def assert_close_to_reference(got: torch.Tensor, ref: torch.Tensor, tol: dict, name: str):
    """got within `tol` of the float64 reference, relative to the reference's scale (see TOLERANCES)."""
    diff = got.double() - ref
    rel_l2 = (diff.norm() / ref.norm().clamp_min(1e-30)).item()
    max_rel = (diff.abs().max() / ref.abs().max().clamp_min(1e-30)).item() if diff.numel() else 0.0
    assert rel_l2 <= tol["rel_l2"] and max_rel <= tol["max_rel"], (
        f"{name}: relative L2 error {rel_l2:.3g} (allowed {tol['rel_l2']}), max error / max |ref| {max_rel:.3g} "
        f"(allowed {tol['max_rel']})")


def run_and_check(ops, case, device: str, tol=None):
    """Runs both attention ops on `case`, checks them against the reference; returns the op's output."""
    dtype = case.q.dtype
    tol = tol or TOLERANCES[(device, dtype)]
    ref = tree_verify_attention_reference(*case.args())
    out = ops.tree_verify_attention(*case.args())
    assert out.shape == ref.shape and out.dtype == dtype and out.device == case.q.device
    assert out.is_contiguous()
    assert not out.isnan().any(), "tree_verify_attention: NaN in the output"
    assert_close_to_reference(out, ref, tol, "tree_verify_attention")

    written = torch.full_like(out, float("nan"))
    ops.tree_verify_attention_out(*case.args(), out=written)
    assert not written.isnan().any(), "tree_verify_attention_out left entries of out unwritten"
    assert_close_to_reference(written, ref, tol, "tree_verify_attention_out")

    real = sum(case.tree_sizes)
    assert torch.count_nonzero(out[real:]) == 0, "padding rows past qo_indptr[B] must be zeros"
    return out


@st.composite
def verify_cases(draw, device: str):
    """Keyword arguments of make_verify_case covering the contract's variety."""
    batch = draw(st.integers(0, 3))
    kind = draw(st.sampled_from(["gqa", "gqa", "mla"]))
    if kind == "mla":
        heads = (draw(st.sampled_from([1, 2, 4, 16])), 1)
        dims = draw(st.sampled_from(MLA_HEAD_DIMS[device]))
        layout = "mla"
    else:
        heads = draw(st.sampled_from(GQA_HEADS))
        dims = draw(st.sampled_from(GQA_HEAD_DIMS[device]))
        layout = draw(st.sampled_from(["contiguous", "strided"]))
    tree_sizes = draw(st.lists(st.integers(0, 70), min_size=batch, max_size=batch))
    return dict(
        tree_sizes=tree_sizes,
        prefix_lens=draw(st.lists(st.integers(0, 90), min_size=batch, max_size=batch)),
        num_q_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim_qk=dims[0],
        head_dim_v=dims[1],
        dtype=draw(st.sampled_from(DTYPES[device])),
        device=device,
        draft_mode=draw(st.sampled_from(["cache", "separate"])),
        layout=layout,
        index_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        logit_cap=draw(st.sampled_from([0.0, 0.0, 0.7, 5.0, 30.0])),
        pad_rows=draw(st.integers(0, 3)),
        extra_slots=draw(st.integers(0, 5)),
        mask_words=mask_words(max(tree_sizes, default=0)) + draw(st.integers(0, 1)),
        max_depth=draw(st.sampled_from([None, 3, 8])),
        generator=torch.Generator().manual_seed(draw(st.integers(0, 2**31))),
    )


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@settings(max_examples=4 * settings().max_examples)  # the central property: worth the most examples
@given(data=st.data())
def test_attention_matches_reference(ops, device, data):
    run_and_check(ops, make_verify_case(**data.draw(verify_cases(device))), device)


def _case(device, dtype=None, **overrides):
    """A small GQA case; `overrides` replace any make_verify_case argument."""
    gqa = GQA_HEAD_DIMS[device][0]
    kwargs = dict(tree_sizes=[6, 9], prefix_lens=[11, 4], num_q_heads=4, num_kv_heads=2, head_dim_qk=gqa[0],
                  head_dim_v=gqa[1], dtype=dtype or DTYPES[device][0], device=device)
    kwargs.update(overrides)
    return make_verify_case(**kwargs)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("pad_rows", [0, 3])
def test_empty_batch(ops, device, pad_rows):
    """B = 0: N = 0 (nothing to do) or only padding rows (all zeros)."""
    case = _case(device, tree_sizes=[], prefix_lens=[], pad_rows=pad_rows)
    assert case.q.shape[0] == pad_rows and case.qo_indptr.tolist() == [0]
    out = run_and_check(ops, case, device)
    assert out.shape == (pad_rows, 4, case.v_cache.shape[2])


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("draft_mode", ["cache", "separate"])
def test_empty_requests(ops, device, draft_mode):
    """Requests with T_b = 0 (with and without a prefix) between real ones."""
    run_and_check(ops, _case(device, tree_sizes=[0, 5, 0, 7, 0], prefix_lens=[3, 8, 0, 2, 6], draft_mode=draft_mode,
                             pad_rows=2), device)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("draft_mode", ["cache", "separate"])
def test_1024_token_tree(ops, device, draft_mode):
    """DDTree's largest node budget: 1024 draft tokens (32 mask words), next to a small request."""
    case = _case(device, tree_sizes=[1024, 3], prefix_lens=[37, 5], num_q_heads=2, num_kv_heads=1,
                 draft_mode=draft_mode, generator=torch.Generator().manual_seed(1024))
    assert case.tree_mask.shape[1] == 32
    run_and_check(ops, case, device)


def _pack_rows(rows: list[list[bool]], words: int) -> torch.Tensor:
    """[len(rows), words] int32: bit j % 32 of word j // 32 set where rows[i][j]."""
    packed = torch.zeros(len(rows), words, dtype=torch.int64)
    for i, row in enumerate(rows):
        for j, seen in enumerate(row):
            if seen:
                packed[i, j // 32] |= 1 << (j % 32)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("kind", ["gqa", "mla"])
@pytest.mark.parametrize("pattern", ["whole_block", "random"])
def test_masks_beyond_ancestors(ops, device, kind, pattern):
    """The mask is any set of the request's draft tokens, later ones included: DDTREE's DFlash drafter runs its
    block bidirectionally through the op (whole_block: every row sees all of its request's tokens), and a row may
    see a sibling or a descendant (random bits)."""
    gen = torch.Generator().manual_seed(41)
    sizes, prefixes = [8, 40, 3], [21, 0, 70]
    if kind == "gqa":
        case = _case(device, tree_sizes=sizes, prefix_lens=prefixes, draft_mode="separate", generator=gen)
    else:
        dqk, dv = MLA_HEAD_DIMS[device][0]
        case = _case(device, tree_sizes=sizes, prefix_lens=prefixes, num_q_heads=8, num_kv_heads=1, head_dim_qk=dqk,
                     head_dim_v=dv, layout="mla", generator=gen)
    rows = []
    for t in sizes:
        for _ in range(t):
            rows.append([True] * t if pattern == "whole_block" else (torch.rand(t, generator=gen) < 0.5).tolist())
    case.tree_mask[: len(rows)] = _pack_rows(rows, case.tree_mask.shape[1]).to(case.tree_mask.device)
    run_and_check(ops, case, device)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("draft_mode", ["cache", "separate"])
def test_rows_that_see_nothing_are_zero(ops, device, draft_mode):
    """No prefix and a mask row without bits: nothing is visible, and the row is zeros, never NaN."""
    case = _case(device, tree_sizes=[5, 4], prefix_lens=[0, 3], draft_mode=draft_mode)
    case.tree_mask[1] = 0  # request 0, token 1: no prefix, no tree columns
    case.tree_mask[3] = 0
    case.tree_mask[6] = 0  # request 1, token 1: its prefix stays visible
    out = run_and_check(ops, case, device)
    assert torch.count_nonzero(out[1]) == 0 and torch.count_nonzero(out[3]) == 0
    assert torch.count_nonzero(out[6]) > 0  # request 1 still sees its prefix with an empty mask row


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_kv_indices_longer_than_used(ops, device, index_dtype):
    """Entries of kv_indices past kv_indptr[B] (a graph buffer sized for the largest context) are ignored."""
    case = _case(device, index_dtype=index_dtype, extra_slots=50)
    assert case.kv_indices.numel() == int(case.kv_indptr[-1]) + 50
    run_and_check(ops, case, device)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("draft_mode", ["cache", "separate"])
@pytest.mark.parametrize("num_q_heads", [1, 2, 16])
def test_mla_576_512(ops, device, draft_mode, num_q_heads):
    """DeepSeek-style MLA: one latent KV head of 576, values the first 512 of it (v_cache aliases k_cache)."""
    dtype = torch.bfloat16
    case = make_verify_case(tree_sizes=[16, 9], prefix_lens=[40, 0], num_q_heads=num_q_heads, num_kv_heads=1,
                            head_dim_qk=576, head_dim_v=512, layout="mla", dtype=dtype, draft_mode=draft_mode,
                            device=device, pad_rows=1)
    assert case.v_cache.data_ptr() == case.k_cache.data_ptr()
    run_and_check(ops, case, device)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_logit_cap_changes_the_result(ops, device):
    """logit_cap applies (capped output differs from uncapped) and matches the reference."""
    capped = _case(device, logit_cap=0.3)
    uncapped = _case(device, logit_cap=0.0)
    a = run_and_check(ops, capped, device)
    b = run_and_check(ops, uncapped, device)
    assert (a.double() - b.double()).abs().max() > 1e-2


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_strided_layout_reads_only_its_views(ops, device):
    """The strided layout's padding holds NaN: any stray read would poison the output."""
    case = _case(device, layout="strided", pad_rows=2)
    assert not case.k_cache.is_contiguous() and not case.v_cache.is_contiguous() and not case.q.is_contiguous()
    assert case.k_cache._base.isnan().any()
    run_and_check(ops, case, device)


# --- mask helpers ---------------------------------------------------------------------------------------


# Bit j % 32 of word j // 32 of row i is set iff token i sees token j (itself and its ancestors), written out
# by hand so the bit order does not rest on kdtree_ops.testing.trees' packing, which the inputs and references share.
# name: (parents, {row: its int32 words}).
LITERAL_MASKS = {
    "chain_of_3": ([-1, 0, 1], {0: [0b1], 1: [0b11], 2: [0b111]}),
    "branching": ([-1, 0, 0, 1], {0: [0b1], 1: [0b11], 2: [0b101], 3: [0b1011]}),
    # 31 children of the root, then token 32 (a child of the root) and 33 (its child) in the second word;
    # bit 31 is the int32 sign bit.
    "second_word": ([-1] + [0] * 32 + [32], {1: [0b11, 0], 31: [-(2**31) + 1, 0], 32: [1, 1], 33: [1, 0b11]}),
}


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("name", list(LITERAL_MASKS))
def test_tree_mask_from_parents_literal(ops, device, name):
    parents, rows = LITERAL_MASKS[name]
    words = len(next(iter(rows.values())))
    qo_indptr = torch.tensor([0, len(parents)], dtype=torch.int32, device=device)
    got = ops.tree_mask_from_parents(torch.tensor(parents, dtype=torch.int32, device=device), qo_indptr, words)
    assert got.shape == (len(parents), words)
    assert {row: got[row].tolist() for row in rows} == rows


@st.composite
def batches_of_trees(draw):
    """(parents lists, pad rows, extra words) for a batch of random trees."""
    sizes = draw(st.lists(st.integers(0, 100), min_size=0, max_size=4))
    seed = draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    trees = [random_tree(t, max_depth=draw(st.sampled_from([None, 2, 6])) if t <= 7 else None,
                         branching=draw(st.integers(2, 5)), generator=gen) for t in sizes]
    return trees, draw(st.integers(0, 3)), draw(st.integers(0, 1))


def _flatten(trees, pad_rows):
    parents = torch.tensor([p for tree in trees for p in tree] + [-1] * pad_rows, dtype=torch.int32)
    qo = [0]
    for tree in trees:
        qo.append(qo[-1] + len(tree))
    return parents, torch.tensor(qo, dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@given(batch=batches_of_trees())
def test_tree_mask_from_parents(ops, device, batch):
    trees, pad_rows, extra_words = batch
    words = mask_words(max(map(len, trees), default=0)) + extra_words
    parents, qo_indptr = _flatten(trees, pad_rows)
    got = ops.tree_mask_from_parents(parents.to(device), qo_indptr.to(device), words)
    assert got.shape == (parents.shape[0], words) and got.dtype == torch.int32 and got.device.type == device
    expected = tree_mask_from_parents_reference(parents, qo_indptr, words)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    for b, tree in enumerate(trees):  # and per tree, the trees module's own packing
        rows = got[qo_indptr[b] : qo_indptr[b + 1]].cpu()
        torch.testing.assert_close(rows, ancestor_mask(tree, words), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@given(batch=batches_of_trees(), data=st.data())
def test_tree_mask_from_dense(ops, device, batch, data):
    """SGLang's FULL_MASK layout (junk in the prefix columns, gaps between requests) back to the ancestor bits."""
    trees, pad_rows, extra_words = batch
    index_dtype = data.draw(st.sampled_from([torch.int32, torch.int64]))
    mask_dtype = data.draw(st.sampled_from([torch.bool, torch.uint8]))
    prefix_lens = [data.draw(st.integers(0, 20)) for _ in trees]
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    chunks, starts, offset = [], [], 0
    for tree, prefix in zip(trees, prefix_lens):
        gap = torch.randint(0, 2, (data.draw(st.integers(0, 3)),), generator=gen, dtype=torch.uint8)
        t = len(tree)
        dense = torch.cat([torch.randint(0, 2, (t, prefix), generator=gen, dtype=torch.uint8),
                           ancestor_matrix(tree).to(torch.uint8)], dim=1)
        chunks += [gap, dense.reshape(-1)]
        starts.append(offset + gap.numel())
        offset += gap.numel() + dense.numel()
    custom_mask = torch.cat(chunks + [torch.zeros(0, dtype=torch.uint8)]).to(mask_dtype)
    mask_indptr = torch.tensor(starts + [offset], dtype=index_dtype)
    parents, qo_indptr = _flatten(trees, pad_rows)
    prefix = torch.tensor(prefix_lens, dtype=index_dtype)
    num_tokens = parents.shape[0]
    words = mask_words(max(map(len, trees), default=0)) + extra_words

    got = ops.tree_mask_from_dense(custom_mask.to(device), mask_indptr.to(device), qo_indptr.to(device),
                                   prefix.to(device), num_tokens, words)
    assert got.shape == (num_tokens, words) and got.dtype == torch.int32 and got.device.type == device
    expected = tree_mask_from_dense_reference(custom_mask, mask_indptr, qo_indptr, prefix, num_tokens, words)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    torch.testing.assert_close(got.cpu(), tree_mask_from_parents_reference(parents, qo_indptr, words), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_masks_from_helpers_drive_attention(ops, device):
    """The op's mask from tree_mask_from_parents gives the case's own (reference) result."""
    case = _case(device, tree_sizes=[33, 0, 12], prefix_lens=[5, 2, 9], pad_rows=2)
    case.tree_mask = ops.tree_mask_from_parents(case.parents, case.qo_indptr, case.tree_mask.shape[1])
    run_and_check(ops, case, device)


# --- record_divergence ----------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_record_divergence_accumulates(ops, device, out_dtype):
    gen = torch.Generator().manual_seed(7)
    stats = torch.zeros(3, dtype=torch.float32, device=device)
    expected = torch.zeros(3, dtype=torch.float32)
    for step, (shape, bad) in enumerate([((5, 4, 8), 0), ((3, 7), 2), ((0, 4), 0), ((6, 2, 2), 3)]):
        ref = torch.randn(shape, generator=gen)
        out = (ref + 0.1 * (step + 1) * torch.randn(shape, generator=gen)).to(out_dtype)
        flat = out.view(-1)
        specials = [float("nan"), float("inf"), float("-inf")]
        for i in range(bad):
            flat[i * 3] = specials[i % 3]
        ops.record_divergence(out.to(device), ref.to(device), stats)
        expected = record_divergence_reference(out, ref, expected)
        torch.testing.assert_close(stats.cpu(), expected, rtol=1e-6, atol=0)
    assert stats[1].item() == 5 and stats[2].item() == 4


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_record_divergence_keeps_a_larger_running_max(ops, device):
    stats = torch.tensor([10.0, 2.0, 3.0], device=device)
    ops.record_divergence(torch.ones(4, device=device), torch.zeros(4, device=device), stats)
    assert stats.cpu().tolist() == [10.0, 2.0, 4.0]
    ops.record_divergence(torch.full((2, 2), 12.5, device=device), torch.zeros(2, 2, device=device), stats)
    assert stats.cpu().tolist() == [12.5, 2.0, 5.0]
