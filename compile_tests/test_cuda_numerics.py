"""CUDA numerics of the kdtree ops at the GPU kernels' shapes, against the float64 references.

test_numerics.py already runs its random (hypothesis) checks on CUDA with small shapes; this suite covers
what is specific to the GPU kernels, deterministically: every instantiated head dim (GQA 64/128/256, MLA
576/512) crossed with group sizes 1..16, bf16/fp16, both draft modes and the cache layouts; MLA at 8..128
heads; and a few big calls — 1024-token trees, 64k prefixes, many requests — where split-KV and the
combine matter. Outputs go into NaN-poisoned buffers that must come back fully written; padding rows
must be zeros. Errors are measured in float64 as relative L2 and max abs against the reference computed
from the same (rounded) inputs.
"""

from __future__ import annotations

import pytest
import torch

from kdtree_ops.testing.cases import make_verify_case
from kdtree_ops.testing.reference import (
    record_divergence_reference,
    tree_mask_from_dense_reference,
    tree_mask_from_parents_reference,
    tree_verify_attention_reference,
)
from kdtree_ops.shapes import mask_words
from kdtree_ops.testing.trees import ancestor_matrix, random_tree

pytestmark = pytest.mark.cuda

# Relative L2 error and max abs error allowed per dtype. bf16 keeps 8 significant bits: rounding the output
# alone gives 1.6e-3 relative (the grid's cases, in float64); the kernels also round P to the input dtype before
# P·V: emulated in float64 (P rounded to bf16, then the output), 2.0e-3 to 2.3e-3 for 40 to 4096 keys and head
# dims 64 to 256. fp16 keeps 11 bits (2e-4). A 2 % sm_scale error gives 1.0e-2 to 1.1e-2 on the grid's cases, so the
# relative L2 bound is what catches it (half of it for bf16); max abs is an outlier bound (outputs are 0.1-0.3).
TOLERANCES = {
    torch.bfloat16: dict(rel_l2=5e-3, max_abs=3e-2),
    torch.float16: dict(rel_l2=2e-3, max_abs=4e-3),
}
DTYPES = [torch.bfloat16, torch.float16]
GQA_HEAD_DIMS = [64, 128, 256]
GROUP_SIZES = [1, 2, 3, 4, 6, 8, 16]
MLA_HEADS = [8, 16, 32, 64, 128]
DRAFT_MODES = ["cache", "separate"]
GQA_LAYOUTS = ["contiguous", "strided"]


@pytest.fixture(scope="module")
def ops():
    import kdtree_ops.ops

    return kdtree_ops.ops


def check_case(ops, case, tol=None):
    """Both attention ops on `case` (the _out one into a NaN-poisoned buffer) against the reference."""
    dtype = case.q.dtype
    tol = tol or TOLERANCES[dtype]
    ref = tree_verify_attention_reference(*case.args())
    out = torch.full(ref.shape, float("nan"), dtype=dtype, device="cuda")
    ops.tree_verify_attention_out(*case.args(), out=out)
    functional = ops.tree_verify_attention(*case.args())
    torch.cuda.synchronize()
    for name, got in (("tree_verify_attention_out", out), ("tree_verify_attention", functional)):
        assert got.shape == ref.shape and got.dtype == dtype and got.is_contiguous()
        assert torch.isfinite(got).all(), f"{name}: non-finite output (unwritten rows of the poisoned buffer?)"
        diff = got.double() - ref
        rel = (diff.norm() / ref.norm().clamp_min(1e-30)).item()
        max_abs = diff.abs().max().item() if diff.numel() else 0.0
        assert rel < tol["rel_l2"] and max_abs < tol["max_abs"], (
            f"{name}: relative L2 error {rel:.3g} (allowed {tol['rel_l2']}), max abs error {max_abs:.3g} "
            f"(allowed {tol['max_abs']}) for trees {case.tree_sizes[:8]} prefixes {case.prefix_lens[:8]}")
    real = sum(case.tree_sizes)
    assert torch.count_nonzero(out[real:]) == 0, "padding rows past qo_indptr[B] must be zeros"
    return out


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- the grid: every head dim x group size x dtype x draft mode x layout -----------------------------------


@pytest.mark.parametrize("layout", GQA_LAYOUTS)
@pytest.mark.parametrize("draft_mode", DRAFT_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group", GROUP_SIZES)
@pytest.mark.parametrize("head_dim", GQA_HEAD_DIMS)
def test_gqa_grid(ops, head_dim, group, dtype, draft_mode, layout):
    """Requests of 1, 37, 64 and 0 draft tokens over prefixes of 300, 0, 129 and 50, plus padding rows."""
    num_kv_heads = 1 if group == 16 else 2
    case = make_verify_case(
        tree_sizes=[1, 37, 64, 0], prefix_lens=[300, 0, 129, 50], num_q_heads=group * num_kv_heads,
        num_kv_heads=num_kv_heads, head_dim_qk=head_dim, head_dim_v=head_dim, dtype=dtype, device="cuda",
        draft_mode=draft_mode, layout=layout, index_dtype=torch.int64 if group % 2 else torch.int32,
        pad_rows=3, extra_slots=7, generator=gen(head_dim * 100 + group))
    check_case(ops, case)


@pytest.mark.parametrize("draft_mode", DRAFT_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_heads", MLA_HEADS)
def test_mla_heads(ops, num_heads, dtype, draft_mode):
    """Absorbed MLA: one latent head of 576, v_cache = k_cache[..., :512], 8..128 query heads."""
    case = make_verify_case(
        tree_sizes=[64, 0, 17], prefix_lens=[1000, 5, 0], num_q_heads=num_heads, num_kv_heads=1,
        head_dim_qk=576, head_dim_v=512, dtype=dtype, device="cuda", draft_mode=draft_mode, layout="mla",
        pad_rows=2, extra_slots=3, generator=gen(num_heads))
    assert case.v_cache.data_ptr() == case.k_cache.data_ptr()
    check_case(ops, case)


@pytest.mark.parametrize("draft_mode", DRAFT_MODES)
def test_mla_v_apart_from_k(ops, draft_mode):
    """MLA head dims with V stored apart from K (not its first 512 columns): the kernel that loads V over K."""
    case = make_verify_case(
        tree_sizes=[64, 9, 30], prefix_lens=[900, 0, 130], num_q_heads=16, num_kv_heads=1, head_dim_qk=576,
        head_dim_v=512, dtype=torch.bfloat16, device="cuda", draft_mode=draft_mode, layout="contiguous",
        pad_rows=2, generator=gen(57))
    assert case.v_cache.data_ptr() != case.k_cache.data_ptr()
    check_case(ops, case)


@pytest.mark.parametrize("logit_cap", [0.5, 30.0])
@pytest.mark.parametrize("kind", ["gqa", "mla"])
def test_logit_cap(ops, kind, logit_cap):
    dims = dict(num_q_heads=32, num_kv_heads=8, head_dim_qk=128, head_dim_v=128, layout="contiguous") \
        if kind == "gqa" else dict(num_q_heads=16, num_kv_heads=1, head_dim_qk=576, head_dim_v=512, layout="mla")
    case = make_verify_case(tree_sizes=[48, 20], prefix_lens=[700, 33], dtype=torch.bfloat16, device="cuda",
                            logit_cap=logit_cap, generator=gen(5), **dims)
    check_case(ops, case)


def test_empty_and_idle_requests(ops):
    """Many requests with T_b = 0 and/or L_b = 0 among real ones, and a batch of only padding rows."""
    sizes = [0, 1, 0, 0, 30, 2, 0, 64, 0]
    prefixes = [0, 0, 90, 7, 0, 1, 0, 513, 3000]
    for draft_mode in DRAFT_MODES:
        check_case(ops, make_verify_case(
            tree_sizes=sizes, prefix_lens=prefixes, num_q_heads=8, num_kv_heads=2, head_dim_qk=128,
            head_dim_v=128, dtype=torch.bfloat16, device="cuda", draft_mode=draft_mode, pad_rows=5,
            generator=gen(9)))
    only_padding = make_verify_case(tree_sizes=[0, 0], prefix_lens=[40, 0], num_q_heads=16, num_kv_heads=1,
                                    head_dim_qk=576, head_dim_v=512, layout="mla", dtype=torch.bfloat16,
                                    device="cuda", pad_rows=4)
    check_case(ops, only_padding)


# --- scores that jump in later tiles: the kernels move a row's reference maximum only by more than 2^8 ------


JUMP_CASES = {
    # name: make_verify_case arguments. Dqk 128 and 64 run the overlapped wgmma loop (wide and narrow
    # configurations), Dqk 256 and MLA the other one.
    "hd128": dict(tree_sizes=[64, 20], prefix_lens=[3000, 700], num_q_heads=32, num_kv_heads=8,
                  head_dim_qk=128, head_dim_v=128),
    "hd64_short_trees": dict(tree_sizes=[16, 16, 16], prefix_lens=[900, 2000, 300], num_q_heads=8,
                             num_kv_heads=2, head_dim_qk=64, head_dim_v=64, draft_mode="separate"),
    "hd256": dict(tree_sizes=[40], prefix_lens=[1500], num_q_heads=16, num_kv_heads=2, head_dim_qk=256,
                  head_dim_v=256, dtype=torch.float16),
    "mla": dict(tree_sizes=[64, 9], prefix_lens=[2500, 600], num_q_heads=16, num_kv_heads=1, head_dim_qk=576,
                head_dim_v=512, layout="mla"),
}


@pytest.mark.parametrize("portable", [False, True], ids=["default", "portable"])
@pytest.mark.parametrize("name", list(JUMP_CASES))
def test_scores_jump_in_later_tiles(ops, name, portable, monkeypatch):
    """Eight keys a third into each prefix get K scaled by 10, eight at two thirds by 20 (MLA: the 64 rope
    columns, by 4 times as much, so that V stays as it is): most rows' maxima then jump by far more than 2^8
    after earlier tiles set them, and O must be rescaled there (unit-variance scores rarely move that far)."""
    if portable:
        monkeypatch.setenv("KDTREE_OPS_PORTABLE_MMA", "1")
    kwargs = dict(dtype=torch.bfloat16, device="cuda", generator=gen(len(name) + 7))
    kwargs.update(JUMP_CASES[name])
    case = make_verify_case(**kwargs)
    kv_indptr, kv_indices = case.kv_indptr.tolist(), case.kv_indices.long()
    columns = slice(512, 576) if kwargs.get("layout") == "mla" else slice(None)
    for b, prefix in enumerate(kwargs["prefix_lens"]):
        for fraction, factor in ((1 / 3, 10.0), (2 / 3, 20.0)):
            if kwargs.get("layout") == "mla":
                factor *= 4
            first = kv_indptr[b] + int(prefix * fraction)
            slots = kv_indices[first:first + 8]
            case.k_cache[slots, :, columns] *= factor
    check_case(ops, case)


# --- big calls: where splits and the combine matter ----------------------------------------------------


BIG_CASES = {
    # name: make_verify_case arguments (dtype bf16 unless given)
    "gqa_tree1024_cache": dict(tree_sizes=[1024], prefix_lens=[4096], num_q_heads=32, num_kv_heads=8,
                               head_dim_qk=128, head_dim_v=128, draft_mode="cache"),
    "gqa_tree1024_separate_strided": dict(tree_sizes=[1024, 5], prefix_lens=[1500, 20000], num_q_heads=16,
                                          num_kv_heads=1, head_dim_qk=64, head_dim_v=64, draft_mode="separate",
                                          layout="strided"),
    "gqa_prefix64k": dict(tree_sizes=[64, 16], prefix_lens=[65536, 30000], num_q_heads=32, num_kv_heads=8,
                          head_dim_qk=128, head_dim_v=128, draft_mode="cache", index_dtype=torch.int64),
    # One row tile split into 205 pieces (1025 KV tiles, at most 256 pieces: 5 tiles each): a slice's merge streams
    # 205 parts, each with its log-sum-exps, through merge_slices' ring of four.
    "gqa_hd64_256_pieces": dict(tree_sizes=[1], prefix_lens=[65536], num_q_heads=2, num_kv_heads=1, head_dim_qk=64,
                                head_dim_v=64, draft_mode="cache"),
    # Row tiles of two pieces with one piece per CTA (56 row tiles of 10 KV tiles on the H200's 132 CTAs): on the
    # wide wgmma kernel each pair runs on the two CTAs of a cluster and merges through distributed shared memory.
    "gqa_two_piece_row_tiles": dict(tree_sizes=[32] * 7, prefix_lens=[1200] * 7, num_q_heads=32, num_kv_heads=8,
                                    head_dim_qk=128, head_dim_v=128, draft_mode="cache"),
    # The same with row tiles of one, two and three pieces, a short tree (padding rows in its tile) and separate
    # draft K/V: pairs that start on an odd CTA merge through the workspace instead.
    "gqa_mixed_piece_counts": dict(tree_sizes=[32, 32, 7, 32, 32, 32],
                                   prefix_lens=[1200, 2500, 1500, 700, 1200, 900], num_q_heads=32, num_kv_heads=8,
                                   head_dim_qk=128, head_dim_v=128, draft_mode="separate", pad_rows=5),
    "gqa_hd256_fp16": dict(tree_sizes=[512, 100], prefix_lens=[8192, 0], num_q_heads=16, num_kv_heads=2,
                           head_dim_qk=256, head_dim_v=256, draft_mode="separate", dtype=torch.float16),
    "gqa_many_requests": dict(tree_sizes="random64", prefix_lens="random4096", num_q_heads=32, num_kv_heads=8,
                              head_dim_qk=128, head_dim_v=128, draft_mode="cache", pad_rows=11),
    "mla_tree1024": dict(tree_sizes=[1024], prefix_lens=[2048], num_q_heads=16, num_kv_heads=1, head_dim_qk=576,
                         head_dim_v=512, layout="mla", draft_mode="cache"),
    "mla_prefix64k": dict(tree_sizes=[64], prefix_lens=[65536], num_q_heads=16, num_kv_heads=1, head_dim_qk=576,
                          head_dim_v=512, layout="mla", draft_mode="separate"),
    "mla_h128_fp16": dict(tree_sizes=[256, 32], prefix_lens=[8192, 100], num_q_heads=128, num_kv_heads=1,
                          head_dim_qk=576, head_dim_v=512, layout="mla", draft_mode="separate",
                          dtype=torch.float16),
}


@pytest.mark.parametrize("name", list(BIG_CASES))
def test_big(ops, name):
    kwargs = dict(dtype=torch.bfloat16, device="cuda", generator=gen(len(name)))
    kwargs.update(BIG_CASES[name])
    if kwargs["tree_sizes"] == "random64":  # 48 requests, T in 1..64, L in 0..4096
        g = gen(48)
        kwargs["tree_sizes"] = torch.randint(1, 65, (48,), generator=g).tolist()
        kwargs["prefix_lens"] = torch.randint(0, 4097, (48,), generator=g).tolist()
    check_case(ops, make_verify_case(**kwargs))


# --- the portable path where wgmma is the default -------------------------------------------------------


PORTABLE_CASES = {
    # name: make_verify_case arguments. On Hopper the default is the wgmma kernel; these run the mma.sync
    # kernel that sm_80 and sm_120 use, on every family.
    "hd64_g8_separate": dict(tree_sizes=[37, 64], prefix_lens=[300, 0], num_q_heads=16, num_kv_heads=2,
                             head_dim_qk=64, head_dim_v=64, draft_mode="separate"),
    "hd128_g4_strided": dict(tree_sizes=[1, 64, 0], prefix_lens=[5000, 129, 50], num_q_heads=32, num_kv_heads=8,
                             head_dim_qk=128, head_dim_v=128, layout="strided", pad_rows=3),
    "hd256_g16_fp16": dict(tree_sizes=[100], prefix_lens=[2000], num_q_heads=16, num_kv_heads=1,
                           head_dim_qk=256, head_dim_v=256, dtype=torch.float16),
    "mla_h16_separate": dict(tree_sizes=[64, 17], prefix_lens=[3000, 0], num_q_heads=16, num_kv_heads=1,
                             head_dim_qk=576, head_dim_v=512, layout="mla", draft_mode="separate"),
    "mla_h128_cache": dict(tree_sizes=[20], prefix_lens=[500], num_q_heads=128, num_kv_heads=1, head_dim_qk=576,
                           head_dim_v=512, layout="mla"),
}


@pytest.mark.parametrize("name", list(PORTABLE_CASES))
def test_portable_mma_path(ops, name, monkeypatch):
    """KDTREE_OPS_PORTABLE_MMA=1 (read at each launch) selects the mma.sync kernels."""
    monkeypatch.setenv("KDTREE_OPS_PORTABLE_MMA", "1")
    kwargs = dict(dtype=torch.bfloat16, device="cuda", generator=gen(len(name) + 1))
    kwargs.update(PORTABLE_CASES[name])
    check_case(ops, make_verify_case(**kwargs))


# --- helpers at the kernels' limits --------------------------------------------------------------------


def _batch_of_trees(sizes, seed, chain_at=None):
    g = gen(seed)
    trees = [random_tree(t, generator=g) for t in sizes]
    if chain_at is not None:  # the deepest tree: a 1024-token chain
        trees[chain_at] = list(range(-1, len(trees[chain_at]) - 1))
    parents = [p for tree in trees for p in tree]
    qo = [0]
    for tree in trees:
        qo.append(qo[-1] + len(tree))
    return trees, torch.tensor(parents, dtype=torch.int32), torch.tensor(qo, dtype=torch.int32)


@pytest.mark.parametrize("extra_words", [0, 3])
def test_tree_mask_from_parents_big(ops, extra_words):
    sizes = [1024, 0, 1, 1024, 333, 31, 32, 33, 700, 0]
    trees, parents, qo = _batch_of_trees(sizes, seed=11, chain_at=3)
    words = mask_words(1024) + extra_words
    padded = torch.cat([parents, torch.full((9,), -1, dtype=torch.int32)])
    got = ops.tree_mask_from_parents(padded.cuda(), qo.cuda(), words)
    expected = tree_mask_from_parents_reference(padded, qo, words)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_tree_mask_from_dense_big(ops, mask_dtype, index_dtype):
    sizes, prefixes = [1024, 0, 77, 513], [3000, 12, 0, 5]
    trees, parents, qo = _batch_of_trees(sizes, seed=12)
    g = gen(13)
    chunks, starts, offset = [], [], 0
    for tree, prefix in zip(trees, prefixes):
        rows = torch.cat([torch.randint(0, 2, (len(tree), prefix), generator=g, dtype=torch.uint8),
                          ancestor_matrix(tree).to(torch.uint8)], dim=1).flatten()
        chunks.append(rows)
        starts.append(offset)
        offset += rows.numel()
    custom_mask = torch.cat(chunks).to(mask_dtype)
    mask_indptr = torch.tensor(starts + [offset], dtype=index_dtype)
    prefix_lens = torch.tensor(prefixes, dtype=index_dtype)
    num_tokens, words = int(qo[-1]) + 6, 33
    got = ops.tree_mask_from_dense(custom_mask.cuda(), mask_indptr.cuda(), qo.cuda(), prefix_lens.cuda(),
                                   num_tokens, words)
    expected = tree_mask_from_dense_reference(custom_mask, mask_indptr, qo, prefix_lens, num_tokens, words)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    padded = torch.cat([parents, torch.full((6,), -1, dtype=torch.int32)])
    torch.testing.assert_close(got.cpu(), tree_mask_from_parents_reference(padded, qo, words), rtol=0, atol=0)


@pytest.mark.parametrize("ref_dtype", [torch.float32, torch.bfloat16])
def test_record_divergence_big(ops, ref_dtype):
    """Millions of elements across many blocks, mixed dtypes, a strided `out`, specials in out."""
    g = torch.Generator(device="cuda").manual_seed(3)
    ref = torch.randn(4096, 1000, device="cuda", generator=g).to(ref_dtype)
    out_base = (ref.float() + 1e-3 * torch.randn(4096, 1000, device="cuda", generator=g)).to(torch.bfloat16)
    out = out_base.t()  # non-contiguous: the op copies
    ref = ref.t()
    out[7, 9] = float("nan")
    out[100, 4000] = float("inf")
    out[999, 0] = 3e4  # the largest finite divergence
    stats = torch.zeros(3, device="cuda")
    expected = torch.zeros(3)
    for _ in range(3):
        ops.record_divergence(out, ref, stats)
        expected = record_divergence_reference(out.cpu(), ref.cpu(), expected)
    torch.testing.assert_close(stats.cpu(), expected, rtol=1e-6, atol=0)
    assert stats[1].item() == 6 and stats[2].item() == 3
