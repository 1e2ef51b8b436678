"""fp8 KV caches on CUDA (GQA and MLA, e4m3 and e5m2): every kernel path against the float64 reference on the
dequantized cache, beside SGLang's Triton fp8 path on the same inputs, over both fp8 paths (KDTREE_OPS_FP8_PATH).

The widen path (the default) lands an fp8 cache row as bytes and widens it in place to q's dtype, times its scale,
rounded once (csrc/cuda/fp8_cache.cuh): the tile then holds what a cache of q's dtype holding the dequantized values
would, so the CUDA tolerances of test_cuda_numerics apply (the reference dequantizes exactly, so the widening's
rounding is inside them: 2^-9 relative in bf16). The overlap path converts the stored values exactly into q's dtype
off the math's path and folds the scales into the softmax and O in fp32 (tree_verify_fp8_scales.cuh): no rounding of a
dequantized value, so the same tolerances hold. Draft rows (k_draft/v_draft) are in q's dtype and unscaled. A
forgotten scale is off by |1 - scale| >= 0.2, a scale on the draft rows likewise: both fail; so does the overlap
path's v_scale applied twice or not at all where a segment reaches the draft rows (every case here has draft rows in
k_draft/v_draft on one request and in the cache on another, prefixes that do and do not end on a tile boundary, and
long prefixes split over several CTAs whose pieces end before the draft rows).

Paths: on the H200 the wide and narrow wgmma GQA kernels, the paired MLA kernel (V read from the K tile; the widen path
on both fp8 paths) and the key-split one (V apart from K, or a v_scale other than k_scale), and with
KDTREE_OPS_PORTABLE_MMA=1 the mma.sync kernels; the GPU suite runs this file again under each emulated architecture
class. The overlap path is verified on sm_90a only (an H100 run, examples/results/2026-12-06-gpu): its tests lift the
gate (KDTREE_OPS_UNVERIFIED=1) for the emulated classes, as the suite does. It copies fp8 rows 16 bytes at a time, so a
pool with 8-byte row or head strides takes the widen path (test_fp8_strides_of_8_bytes_take_the_widen_path).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from kdtree_ops.testing.cases import make_verify_case
from kdtree_ops.testing.reference import tree_verify_attention_reference
from requires import require
from test_cuda_numerics import TOLERANCES

pytestmark = pytest.mark.cuda

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
DTYPES = [torch.bfloat16, torch.float16]
# (k_scale, v_scale): apart from 1 and from each other, not powers of two (so the widening's multiply rounds).
SCALES = (0.05, 0.3)


FP8_PATHS = ["widen", "overlap"]


@pytest.fixture(autouse=True, params=FP8_PATHS, ids=lambda path: f"fp8_{path}")  # the GPU suite selects fp8_overlap
def fp8_path(request, monkeypatch):
    """Every test of this file on each fp8 path: KDTREE_OPS_FP8_PATH is read at each call."""
    monkeypatch.setenv("KDTREE_OPS_FP8_PATH", request.param)
    if request.param == "overlap":
        monkeypatch.setenv("KDTREE_OPS_UNVERIFIED", "1")
    return request.param


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fp8_case(kv_dtype, dtype=torch.bfloat16, scales=SCALES, seed=0, **kwargs):
    base = dict(dtype=dtype, kv_dtype=kv_dtype, k_scale=scales[0], v_scale=scales[1], device="cuda",
                generator=gen(seed))
    base.update(kwargs)
    return make_verify_case(**base)


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(ops, case, tol=None):
    """Both ops (the _out one into a NaN-poisoned buffer) against the reference; returns (out, relative error)."""
    dtype = case.q.dtype
    tol = tol or TOLERANCES[dtype]
    ref = tree_verify_attention_reference(*case.scaled_args())
    out = torch.full(ref.shape, float("nan"), dtype=dtype, device="cuda")
    ops.tree_verify_attention_out(*case.scaled_args(), out=out)
    functional = ops.tree_verify_attention(*case.scaled_args())
    torch.cuda.synchronize()
    for name, got in (("tree_verify_attention_out", out), ("tree_verify_attention", functional)):
        assert torch.isfinite(got).all(), f"{name}: non-finite output (unwritten rows of the poisoned buffer?)"
        rel = relative_error(got, ref)
        max_abs = (got.double() - ref).abs().max().item() if ref.numel() else 0.0
        assert rel < tol["rel_l2"] and max_abs < tol["max_abs"], (
            f"{name}: relative L2 error {rel:.3g} (allowed {tol['rel_l2']}), max abs {max_abs:.3g} "
            f"(allowed {tol['max_abs']}), {case.k_cache.dtype}, trees {case.tree_sizes[:6]}")
    assert torch.count_nonzero(out[sum(case.tree_sizes):]) == 0, "padding rows past qo_indptr[B] must be zeros"
    return out, relative_error(out, ref)


@pytest.mark.parametrize("path", ["default", "portable"])
@pytest.mark.parametrize("draft_mode", ["cache", "separate"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_fp8_gqa(ops, head_dim, kv_dtype, dtype, draft_mode, path, monkeypatch):
    """Requests of 1, 37, 64 and 0 tokens over prefixes of 300, 0, 129, 50 (the wide wgmma kernel by default)."""
    if path == "portable":
        monkeypatch.setenv("KDTREE_OPS_PORTABLE_MMA", "1")
    case = fp8_case(kv_dtype, dtype, tree_sizes=[1, 37, 64, 0], prefix_lens=[300, 0, 129, 50], num_q_heads=8,
                    num_kv_heads=2, head_dim_qk=head_dim, head_dim_v=head_dim, draft_mode=draft_mode,
                    pad_rows=3, extra_slots=5, seed=head_dim)
    check(ops, case)


@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_gqa_short_trees(ops, head_dim, kv_dtype):
    """Short trees (at most 64 packed rows a request): the narrow wgmma kernel; strided pools, int64 slots."""
    case = fp8_case(kv_dtype, tree_sizes=[16, 16, 9], prefix_lens=[900, 40, 2000], num_q_heads=8, num_kv_heads=2,
                    head_dim_qk=head_dim, head_dim_v=head_dim, draft_mode="separate", layout="strided",
                    index_dtype=torch.int64, seed=head_dim + 1)
    check(ops, case)


def test_fp8_strides_of_8_bytes_take_the_widen_path(ops, fp8_path):
    """A pool of 72-byte rows (head dim 64 and 8 bytes of padding, as the strided layout makes it): the overlap path's
    landing ring copies 16 bytes at a time, so each such call takes the widen path and says so in a warning (every
    call here: warn-always); the widen path takes it silently. Both match the reference."""
    case = fp8_case(torch.float8_e4m3fn, tree_sizes=[16, 9], prefix_lens=[300, 40], num_q_heads=8, num_kv_heads=2,
                    head_dim_qk=64, head_dim_v=64, draft_mode="separate", layout="strided", seed=72)
    assert case.k_cache.stride(1) % 16 == 8, case.k_cache.stride()  # the precondition: rows of 8-byte multiples
    warn_always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check(ops, case)
    finally:
        torch.set_warn_always(warn_always)
    fallbacks = [str(w.message) for w in caught if "take the widen path" in str(w.message)]
    assert len(fallbacks) == (2 if fp8_path == "overlap" else 0), fallbacks  # the _out op and the functional one
    for message in fallbacks:
        assert "KDTREE_OPS_FP8_PATH=overlap" in message and "multiples of 16 bytes" in message, message


@pytest.mark.parametrize("draft_mode", ["cache", "separate"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("num_heads", [16, 128])
def test_fp8_mla(ops, num_heads, kv_dtype, dtype, draft_mode):
    """Absorbed MLA over an fp8 latent cache, V its first 512 columns, one scale (as SGLang's MLA pool has)."""
    case = fp8_case(kv_dtype, dtype, scales=(0.07, 0.07), tree_sizes=[64, 0, 17], prefix_lens=[1000, 5, 0],
                    num_q_heads=num_heads, num_kv_heads=1, head_dim_qk=576, head_dim_v=512, layout="mla",
                    draft_mode=draft_mode, pad_rows=2, seed=num_heads)
    assert case.v_cache.data_ptr() == case.k_cache.data_ptr()
    check(ops, case)


@pytest.mark.parametrize("portable", [False, True], ids=["default", "portable"])
@pytest.mark.parametrize("layout", ["mla_two_scales", "contiguous"])
def test_fp8_mla_v_loaded_apart(ops, layout, portable, monkeypatch):
    """V not read from the K tile: a v_scale other than k_scale on the aliased latent cache (the K tile is widened
    with k_scale, so the kernels load V rows of their own), or V stored apart from K."""
    if portable:
        monkeypatch.setenv("KDTREE_OPS_PORTABLE_MMA", "1")
    mla = layout == "mla_two_scales"
    case = fp8_case(torch.float8_e4m3fn, scales=(0.05, 0.11), tree_sizes=[64, 9, 30], prefix_lens=[900, 0, 130],
                    num_q_heads=16, num_kv_heads=1, head_dim_qk=576, head_dim_v=512,
                    layout="mla" if mla else "contiguous", draft_mode="separate", pad_rows=2, seed=57)
    check(ops, case)


@pytest.mark.parametrize("kind", ["gqa", "mla"])
def test_fp8_long_prefix_split_and_logit_cap(ops, kind):
    """A 32k prefix split over many CTAs (partials and their merge) with logit capping."""
    dims = dict(num_q_heads=32, num_kv_heads=8, head_dim_qk=128, head_dim_v=128, layout="contiguous") \
        if kind == "gqa" else dict(num_q_heads=16, num_kv_heads=1, head_dim_qk=576, head_dim_v=512, layout="mla")
    scales = SCALES if kind == "gqa" else (0.2, 0.2)
    case = fp8_case(torch.float8_e4m3fn, scales=scales, tree_sizes=[64, 5], prefix_lens=[32768, 700],
                    logit_cap=30.0, draft_mode="separate", seed=11, **dims)
    check(ops, case)


def test_fp8_unit_scales_equal_the_same_cache_in_bf16(ops, fp8_path):
    """Scales of 1: the converted tile is exactly the bf16 cache of the same values (on the overlap path the folded
    scales multiply by 1), so on the widen path the outputs are bit-equal; the overlap path's configurations may
    differ (the 99 KB class's hd128 tiles take 32 keys, and more shared memory may change the split of long prefixes),
    so there both calls pass the float64 check."""
    case = fp8_case(torch.float8_e4m3fn, scales=(1.0, 1.0), tree_sizes=[40, 7], prefix_lens=[600, 33],
                    num_q_heads=16, num_kv_heads=4, head_dim_qk=128, head_dim_v=128, draft_mode="separate", seed=3)
    fp8_out, _ = check(ops, case)
    case.k_cache, case.v_cache = case.k_cache.to(torch.bfloat16), case.v_cache.to(torch.bfloat16)
    case.k_scale = case.v_scale = 1.0
    bf16_out = ops.tree_verify_attention(*case.scaled_args())
    if fp8_path == "widen":
        assert torch.equal(fp8_out, bf16_out)
    else:  # other tiles (99 KB), another shared-memory size (so maybe another split of the keys): both checked above
        check(ops, case)


@pytest.mark.parametrize("portable", [False, True], ids=["default", "portable"])
def test_fp8_draft_rows_at_every_tile_offset(ops, portable, monkeypatch):
    """The folded scales where a segment meets the draft rows: prefixes ending 0, 1, 31, 32, 63 keys past a 64-key tile
    boundary and 0, 1, 31, 32, 63, 64 past a 128-key one (the first tile with draft rows holds no cache column, some,
    or all but one), a
    request whose prefix splits over pieces, and k_scale far from v_scale, so that a v_scale applied twice, missed, or
    put on a draft column, and a k_scale left on a draft score, all fail."""
    if portable:
        monkeypatch.setenv("KDTREE_OPS_PORTABLE_MMA", "1")
    case = fp8_case(torch.float8_e4m3fn, scales=(0.04, 2.5), tree_sizes=[9, 20, 33, 5, 64, 12, 3],
                    prefix_lens=[128, 129, 159, 160, 191, 192, 9000], num_q_heads=8, num_kv_heads=2, head_dim_qk=128,
                    head_dim_v=128, draft_mode="separate", pad_rows=2, seed=77)
    check(ops, case)


@pytest.mark.parametrize("kind", ["gqa", "mla"])
def test_fp8_no_worse_than_sglang_triton(ops, kind):
    """The same fp8 inputs through SGLang's Triton extend kernel (what its backend runs for an fp8 pool): both errors
    against the float64 reference, measured together; the op's may not be larger."""
    require("sglang", "pip install -e '.[test,sglang]'")
    from kdtree_ops.bench.baselines import IMPLEMENTATIONS

    dims = dict(num_q_heads=32, num_kv_heads=8, head_dim_qk=128, head_dim_v=128, layout="contiguous", scales=SCALES) \
        if kind == "gqa" else dict(num_q_heads=16, num_kv_heads=1, head_dim_qk=576, head_dim_v=512, layout="mla",
                                   scales=(0.2, 0.2))
    case = fp8_case(torch.float8_e4m3fn, tree_sizes=[64, 64], prefix_lens=[4096, 1000], draft_mode="separate",
                    seed=21, **dims)
    ref = tree_verify_attention_reference(*case.scaled_args())
    _, ours = check(ops, case)
    triton = relative_error(IMPLEMENTATIONS["sglang_triton"](case)(), ref)
    print(f"fp8 {kind}: relative L2 error kdtree {ours:.3e}, SGLang Triton {triton:.3e}")
    assert ours <= triton, f"kdtree {ours:.3e} vs SGLang Triton {triton:.3e}"
