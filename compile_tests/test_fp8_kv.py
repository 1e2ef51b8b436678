"""fp8 KV caches on the CPU: k_cache/v_cache in float8_e4m3fn or float8_e5m2 with per-tensor scales (the
key/value is stored value x k_scale/v_scale), k_draft/v_draft in q's dtype and unscaled.

Accuracy: the reference (kdtree_ops.testing.reference) dequantizes the very fp8 values the kernel reads, in float64.
Converting an fp8 value to fp32 is exact, and its product with a float32 scale needs at most 4 + 24 significant
bits, so the kernel's one rounding of it costs 2^-24 relative: far below its fp32 accumulation. The error left is
the one test_numerics bounds for caches in q's dtype (fp32 accumulation plus the output's rounding to q's dtype),
so its TOLERANCES apply unchanged; the fp8 quantization error itself is not in the comparison (it is the
cache's, not the kernel's). A kernel that forgot a scale would be off by |1 - scale| (here >= 0.2) and fail.
"""

from __future__ import annotations

import pytest
import torch

from kdtree_ops.testing.cases import make_verify_case
from kdtree_ops.testing.reference import tree_verify_attention_reference
from test_numerics import TOLERANCES, assert_close_to_reference

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
Q_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (k_scale, v_scale): apart from 1 and from each other, so a scale applied to the wrong side, twice or not at
# all shows; small scales make the stored values large (|x / 0.05| up to ~90, inside e4m3's 448).
SCALES = [(0.05, 0.3), (2.5, 0.8)]


def fp8_case(kv_dtype, dtype, scales, seed=0, **overrides):
    k_scale, v_scale = scales
    kwargs = dict(tree_sizes=[9, 33, 0], prefix_lens=[40, 7, 5], num_q_heads=8, num_kv_heads=2, head_dim_qk=24,
                  head_dim_v=16, dtype=dtype, kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale, pad_rows=2,
                  generator=torch.Generator().manual_seed(seed))
    kwargs.update(overrides)
    return make_verify_case(**kwargs)


def check(ops, case):
    """Both ops (the _out form into a NaN-poisoned buffer) against the float64 reference on the dequantized cache."""
    ref = tree_verify_attention_reference(*case.scaled_args())
    tol = TOLERANCES[("cpu", case.q.dtype)]
    assert_close_to_reference(ops.tree_verify_attention(*case.scaled_args()), ref, tol, "tree_verify_attention")
    out = torch.full(ops.attention_output_shape(case.q, case.v_cache), float("nan"), dtype=case.q.dtype)
    ops.tree_verify_attention_out(*case.scaled_args(), out=out)
    assert_close_to_reference(out, ref, tol, "tree_verify_attention_out")
    return ref


@pytest.mark.parametrize("scales", SCALES, ids=["small", "large"])
@pytest.mark.parametrize("dtype", Q_DTYPES, ids=str)
@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("draft_mode", ["cache", "separate"])
def test_fp8_gqa(ops, kv_dtype, dtype, scales, draft_mode):
    case = fp8_case(kv_dtype, dtype, scales, draft_mode=draft_mode)
    assert case.k_cache.dtype == case.v_cache.dtype == kv_dtype
    if draft_mode == "separate":
        assert case.k_draft.dtype == dtype  # the draft rows stay in q's dtype
    check(ops, case)


@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("draft_mode", ["cache", "separate"])
def test_fp8_mla_alias(ops, kv_dtype, draft_mode):
    """MLA: v_cache is a view of the fp8 latent cache; one scale for both, as SGLang passes it."""
    case = fp8_case(kv_dtype, torch.bfloat16, (0.125, 0.125), num_q_heads=8, num_kv_heads=1, head_dim_qk=40,
                    head_dim_v=32, layout="mla", draft_mode=draft_mode)
    assert case.v_cache.data_ptr() == case.k_cache.data_ptr()
    check(ops, case)


@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
def test_fp8_strided_int64(ops, kv_dtype):
    """Strided pools whose padding holds NaN (a stray read shows), int64 slots and junk slots after the last."""
    check(ops, fp8_case(kv_dtype, torch.float32, SCALES[0], layout="strided", index_dtype=torch.int64,
                        extra_slots=6, logit_cap=4.0))


def test_scales_reach_cache_rows_only(ops):
    """Separate draft rows are unscaled: scaling them too would change the output by far more than the tolerance;
    so would leaving the cache rows unscaled."""
    case = fp8_case(torch.float8_e4m3fn, torch.float32, (0.05, 0.3), draft_mode="separate", seed=3)
    ref = check(ops, case)
    k_draft, v_draft = case.k_draft, case.v_draft
    case.k_draft, case.v_draft = k_draft * 0.05, v_draft * 0.3
    draft_scaled = tree_verify_attention_reference(*case.scaled_args())
    case.k_draft, case.v_draft, case.k_scale, case.v_scale = k_draft, v_draft, 1.0, 1.0
    cache_unscaled = tree_verify_attention_reference(*case.scaled_args())
    for wrong in (draft_scaled, cache_unscaled):
        assert (wrong - ref).norm() > 0.1 * ref.norm()


def test_default_scales_are_one(ops):
    """Positional calls without scales keep their meaning: stored values taken as they are."""
    case = fp8_case(torch.float8_e5m2, torch.float32, (1.0, 1.0))
    got = ops.tree_verify_attention(*case.args())
    assert_close_to_reference(got, tree_verify_attention_reference(*case.args()), TOLERANCES[("cpu", torch.float32)],
                              "defaults")


def test_kernel_support_cpu(ops):
    for kv_dtype in FP8:
        for dtype in Q_DTYPES:
            assert ops.has_kernel_for("cpu", dtype, 24, 16, 2, kv_dtype=kv_dtype), (dtype, kv_dtype)
    assert "KV cache" in ops.kernel_unsupported_reason("cpu", torch.bfloat16, 24, 16, 2, kv_dtype=torch.float16)


def _bad(case, **changes):
    args = dict(zip(("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "tree_mask", "sm_scale",
                     "logit_cap", "k_draft", "v_draft", "k_scale", "v_scale"), case.scaled_args()))
    args.update({k: (v(args) if callable(v) else v) for k, v in changes.items()})
    return args


# (id, draft_mode, changes, message pattern)
BAD_CASES = [
    ("mixed_fp8", "cache", {"v_cache": lambda a: a["v_cache"].float().to(torch.float8_e5m2)},
     r"v_cache must have the dtype of the fp8 k_cache \(Float8_e4m3fn\), got Float8_e5m2"),
    ("fp8_v_with_q_dtype_k", "cache", {"k_cache": lambda a: a["k_cache"].float()},
     r"v_cache must have the dtype of q \(Float\)"),
    ("fp8_k_draft", "separate", {"k_draft": lambda a: a["k_draft"].to(torch.float8_e4m3fn)},
     r"k_draft must have the dtype of q \(Float\), got Float8_e4m3fn"),
    ("fp8_v_draft", "separate", {"v_draft": lambda a: a["v_draft"].to(torch.float8_e4m3fn)},
     r"v_draft must have the dtype of q \(Float\), got Float8_e4m3fn"),
    ("k_scale_zero", "cache", {"k_scale": 0.0}, r"k_scale must be finite and > 0"),
    ("k_scale_negative", "cache", {"k_scale": -0.5}, r"k_scale must be finite and > 0"),
    ("k_scale_inf", "cache", {"k_scale": float("inf")}, r"k_scale must be finite and > 0"),
    ("v_scale_nan", "cache", {"v_scale": float("nan")}, r"v_scale must be finite and > 0"),
    ("v_scale_zero", "cache", {"v_scale": 0.0}, r"v_scale must be finite and > 0"),
    ("scale_with_q_dtype_cache", "cache",
     {"k_cache": lambda a: a["k_cache"].float(), "v_cache": lambda a: a["v_cache"].float()},
     r"k_scale and v_scale multiply fp8 KV caches only; with a Float k_cache they must be 1.0"),
]


@pytest.mark.parametrize("draft_mode, changes, pattern", [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
@pytest.mark.parametrize("form", ["functional", "out"])
def test_bad_fp8_inputs(ops, draft_mode, changes, pattern, form):
    args = _bad(fp8_case(torch.float8_e4m3fn, torch.float32, SCALES[0], draft_mode=draft_mode), **changes)
    with pytest.raises(RuntimeError, match=pattern):
        if form == "functional":
            ops.tree_verify_attention(**args)
        else:
            ops.tree_verify_attention_out(**args, out=torch.empty(ops.attention_output_shape(args["q"], args["v_cache"])))


OPCHECK_SAMPLES = [
    ("e4m3_gqa", dict(kv_dtype=torch.float8_e4m3fn)),
    ("e5m2_separate", dict(kv_dtype=torch.float8_e5m2, draft_mode="separate")),
    ("e4m3_mla", dict(kv_dtype=torch.float8_e4m3fn, num_kv_heads=1, head_dim_qk=24, layout="mla")),
]


# opcheck's test_schema cannot take fp8 inputs in torch 2.14: its SchemaCheckMode compares every input before and
# after the call through a multiplication that has no fp8 kernel ("mul_cpu_reduced_float" not implemented for
# 'Float8_e4m3fn'). The other three utilities run (the fake against the real kernel, autograd registration, AOT
# dispatch with dynamic shapes); what test_schema guards (no input mutated, the output aliasing no input) is
# checked directly on the fp8 bytes below.
OPCHECK_UTILS = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")


def _opcheck_case(overrides):
    overrides = {**overrides}
    return fp8_case(overrides.pop("kv_dtype"), torch.bfloat16, SCALES[1], tree_sizes=[5, 9], prefix_lens=[7, 3],
                    num_q_heads=4, pad_rows=0, **overrides)


@pytest.mark.parametrize("overrides", [s for _, s in OPCHECK_SAMPLES], ids=[n for n, _ in OPCHECK_SAMPLES])
def test_opcheck_fp8(ops, overrides):
    case = _opcheck_case(overrides)
    torch.library.opcheck(torch.ops.kdtree.tree_verify_attention.default, case.scaled_args(), test_utils=OPCHECK_UTILS)
    out = torch.empty(ops.attention_output_shape(case.q, case.v_cache), dtype=case.q.dtype)
    torch.library.opcheck(torch.ops.kdtree.tree_verify_attention_out.default, case.scaled_args(), {"out": out},
                          test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("overrides", [s for _, s in OPCHECK_SAMPLES], ids=[n for n, _ in OPCHECK_SAMPLES])
def test_schema_fp8_no_mutation_no_alias(ops, overrides):
    """What opcheck's test_schema would check: the functional op mutates no input (bytes compared, so NaN padding
    compares too) and returns a fresh tensor; the _out form writes only `out`."""
    case = _opcheck_case(overrides)
    inputs = [a for a in case.scaled_args() if isinstance(a, torch.Tensor)]
    before = [a.contiguous().view(torch.uint8).clone() for a in inputs]
    got = ops.tree_verify_attention(*case.scaled_args())
    out = torch.full_like(got, float("nan"))
    ops.tree_verify_attention_out(*case.scaled_args(), out=out)
    for a, b in zip(inputs, before):
        assert torch.equal(a.contiguous().view(torch.uint8), b)
        assert got.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
    assert torch.equal(out, got)


def test_compile_fullgraph_with_scales(ops):
    """torch.compile(fullgraph=True): the scales (Python floats, also as keywords) reach the one opaque call."""
    torch._dynamo.reset()

    def verify(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, k_scale, v_scale):
        out = ops.tree_verify_attention(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale,
                                        k_scale=k_scale, v_scale=v_scale)
        return out.flatten(1) * 2.0

    compiled = torch.compile(verify, backend="inductor", fullgraph=True)
    for scales in SCALES:
        case = fp8_case(torch.float8_e4m3fn, torch.bfloat16, scales)
        a = case.args()
        got = compiled(*a[:8], case.k_scale, case.v_scale)
        ref = tree_verify_attention_reference(*case.scaled_args())
        assert_close_to_reference(got.view(ref.shape) / 2.0, ref, TOLERANCES[("cpu", torch.bfloat16)], str(scales))
    torch._dynamo.reset()


# --- the CUDA fp8 path switch (KDTREE_OPS_FP8_PATH), host-only: no GPU needed ------------------------------------

OVERLAP_FAMILIES = [f"tree_verify_attention {h}" for h in ("hd64", "hd128", "hd256", "mla")]
ARCH_CLASSES = ["sm_90a", "sm_100", "sm_80", "99 KB"]


def test_fp8_overlap_path_is_gated_per_class_until_a_gpu_run_passes_it(ops, monkeypatch):
    """The overlap path (issue 47) has rows of its own in the verified-families table ("fp8 overlap"): verified on
    sm_90a (an H100 run), not on the classes whose emulated runs are not made yet. Without KDTREE_OPS_UNVERIFIED the
    gate refuses it there, naming the path, the switch and the way back to the widen path; with it set the gate lets
    it run. The widen path's verified entries are untouched."""
    table = {(f["family"], f["cache"]): f["verified"] for f in ops.verified_families()}
    monkeypatch.delenv("KDTREE_OPS_UNVERIFIED", raising=False)
    unverified = [cls for cls in ARCH_CLASSES if cls != "sm_90a"]
    for family in OVERLAP_FAMILIES:
        assert table[(family, "fp8 overlap")] == {cls: cls == "sm_90a" for cls in ARCH_CLASSES}, family
        assert ops.unverified_reason(family, "fp8 overlap", "sm_90a") == ""
        assert table[(family, "fp8")]["sm_90a"], family  # the default path stays verified
        assert ops.unverified_reason(family, "fp8", "sm_90a") == ""
        for cls in unverified:
            reason = ops.unverified_reason(family, "fp8 overlap", cls)
            for words in (family, "fp8 overlap path (KDTREE_OPS_FP8_PATH=overlap)", f"for the {cls} class",
                          "not yet verified on a GPU", "KDTREE_OPS_UNVERIFIED=1", "KDTREE_OPS_FP8_PATH=widen"):
                assert words in reason, (words, reason)
    monkeypatch.setenv("KDTREE_OPS_UNVERIFIED", "1")
    for family in OVERLAP_FAMILIES:
        for cls in ARCH_CLASSES:
            assert ops.unverified_reason(family, "fp8 overlap", cls) == ""
    with pytest.raises(ValueError, match="no architecture class"):
        ops.unverified_reason(OVERLAP_FAMILIES[0], "fp8 overlap", "sm_42")


def test_fp8_path_switch_values(ops, monkeypatch):
    """KDTREE_OPS_FP8_PATH, read at each call: unset, empty or "widen" is the widen path, "overlap" the overlap path,
    anything else an error naming the variable and the values it takes. The CPU kernels never read it."""
    monkeypatch.delenv("KDTREE_OPS_FP8_PATH", raising=False)
    assert ops.fp8_path() == "widen"
    for value, path in (("", "widen"), ("widen", "widen"), ("overlap", "overlap")):
        monkeypatch.setenv("KDTREE_OPS_FP8_PATH", value)
        assert ops.fp8_path() == path, value
    monkeypatch.setenv("KDTREE_OPS_FP8_PATH", "sideways")
    with pytest.raises(ValueError, match=r"KDTREE_OPS_FP8_PATH=sideways names no fp8 path: use widen \(the default\) "
                                         r"or overlap"):
        ops.fp8_path()
    case = fp8_case(torch.float8_e4m3fn, torch.bfloat16, SCALES[0])
    check(ops, case)  # the CPU op over an fp8 cache runs whatever the variable says
