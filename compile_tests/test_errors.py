"""Bad inputs raise RuntimeError with a message that names the offending argument and what was expected (CPU).

The case lists (SHAPE_CASES, VALUE_CASES, OUT_CASES, PARENTS_CASES, DENSE_CASES, DIVERGENCE_CASES) are written
for any device, dtype and head dims: test_cuda_errors.py runs them on CUDA, each in its own process. Last, the
kernel-support answer (has_kernel_for) is checked against what the CPU op does.
"""

from __future__ import annotations

import pytest
import torch

from kdtree_ops.testing.cases import make_verify_case
from kdtree_ops.testing.reference import tree_verify_attention_reference
from test_numerics import TOLERANCES, assert_close_to_reference

NAMES = ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "tree_mask", "sm_scale", "logit_cap",
         "k_draft", "v_draft")


def base_args(draft_mode="cache", **overrides) -> dict:
    """Keyword arguments of a valid call (two requests of 5 and 40 tokens, N = 45, GQA 4/2, 55 kv slots), by schema
    name; `overrides` go to make_verify_case (dtype, device, head dims)."""
    kwargs = dict(tree_sizes=[5, 40], prefix_lens=[7, 3], num_q_heads=4, num_kv_heads=2, head_dim_qk=8,
                  head_dim_v=8, draft_mode=draft_mode)
    kwargs.update(overrides)
    return dict(zip(NAMES, make_verify_case(**kwargs).args()))


def call(ops, args: dict, out=None):
    if out is None:
        return ops.tree_verify_attention(**args)
    return ops.tree_verify_attention_out(**args, out=out)


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


def indptr(*values):
    """A replacement index vector: int32 on the device of the call's qo_indptr."""
    return lambda a: a["qo_indptr"].new_tensor(values)


def randn_as(a, *shape):
    """Random values of the call's dtype on its device (never zeros)."""
    return torch.randn(*shape, device=a["q"].device).to(a["q"].dtype)


def other_float(dtype):
    return torch.float16 if dtype != torch.float16 else torch.bfloat16


# Bad calls to tree_verify_attention, changed from base_args' valid call on any device, dtype and head dims (the
# CUDA suite, test_cuda_errors.py, runs them on CUDA tensors): (id, {argument: replacement or function of the
# valid args}, message pattern). SHAPE_CASES break shapes, dtypes or strides: checked on every call, on every
# device, inside CUDA graphs too.
SHAPE_CASES = [
    ("q_int", {"q": lambda a: a["q"].to(torch.int32)}, r"q must be float32, bfloat16 or float16"),
    ("q_2d", {"q": lambda a: a["q"][:, 0]}, r"q must be 3-D"),
    ("k_cache_dtype", {"k_cache": lambda a: a["k_cache"].double()},
     r"k_cache must have the dtype of q \(\w+\) or be an fp8 KV cache"),
    ("fp8_k_cache_with_other_v_cache", {"k_cache": lambda a: a["k_cache"].to(torch.float8_e4m3fn)},
     r"v_cache must have the dtype of the fp8 k_cache \(Float8_e4m3fn\)"),
    ("v_cache_dtype", {"v_cache": lambda a: a["v_cache"].to(other_float(a["q"].dtype))},
     r"v_cache must have the dtype of q"),
    ("heads_not_multiple", {"q": lambda a: a["q"][:, :3]},
     r"query heads of q \(3\) must be a multiple of the KV heads of k_cache \(2\)"),
    ("k_cache_head_dim", {"k_cache": lambda a: torch.cat([a["k_cache"]] * 2, dim=-1)}, r"k_cache head dim"),
    ("v_cache_slots", {"v_cache": lambda a: a["v_cache"][:-1]}, r"v_cache must be \[S, Hkv, Dv\]"),
    ("k_cache_inner_stride", {"k_cache": lambda a: a["k_cache"].transpose(1, 2).contiguous().transpose(1, 2)},
     r"k_cache must have a contiguous last dimension"),
    ("qo_indptr_int64", {"qo_indptr": lambda a: a["qo_indptr"].long()}, r"qo_indptr must be int32"),
    ("kv_indptr_int64", {"kv_indptr": lambda a: a["kv_indptr"].long()}, r"kv_indptr must be int32"),
    ("kv_indptr_length", {"kv_indptr": lambda a: torch.cat([a["kv_indptr"], a["kv_indptr"][-1:]])},
     r"kv_indptr must be \[B\+1\] = \[3\]"),
    ("kv_indices_float", {"kv_indices": lambda a: a["kv_indices"].float()}, r"kv_indices must be 1-D int32 or int64"),
    ("kv_indices_strided", {"kv_indices": lambda a: torch.stack([a["kv_indices"]] * 2, dim=1)[:, 0]},
     r"kv_indices must be contiguous"),
    ("tree_mask_int64", {"tree_mask": lambda a: a["tree_mask"].long()}, r"tree_mask must be int32"),
    ("tree_mask_rows", {"tree_mask": lambda a: a["tree_mask"][:-1]}, r"tree_mask must be \[N, W\] with N = 45"),
    ("tree_mask_no_words", {"tree_mask": lambda a: a["tree_mask"][:, :0]},
     r"tree_mask needs at least one int32 word per row"),
    # 33 words would be trees past 1024 tokens (a DDTree budget of 1024 or more): no kernel takes them, so the
    # width is a shape error on every device (the CUDA kernel once clamped it to 32 words and computed wrong rows).
    ("tree_mask_33_words", {"tree_mask": lambda a: torch.cat([a["tree_mask"], torch.zeros_like(a["tree_mask"][:, :1])
                                                              .repeat(1, 33 - a["tree_mask"].shape[1])], 1)},
     r"tree_mask must have at most 32 int32 words per row \(trees of up to 1024 tokens\), got \[45, 33\]"),
    ("k_draft_without_v_draft", {"k_draft": lambda a: randn_as(a, 45, 2, a["k_cache"].shape[2])},
     r"pass k_draft and v_draft together"),
    ("negative_logit_cap", {"logit_cap": -1.0}, r"logit_cap must be finite and >= 0"),
    ("sm_scale_nan", {"sm_scale": float("nan")}, r"sm_scale must be finite"),
]
# VALUE_CASES break the index tensors' values: checked on every CPU call; on CUDA only with KDTREE_OPS_DEBUG=1
# and never while capturing (reading them is a host sync).
VALUE_CASES = [
    ("too_few_mask_words", {"tree_mask": lambda a: a["tree_mask"][:, :1]},
     r"request 1 has 40 draft tokens but tree_mask has only 1 words"),
    ("qo_indptr_decreasing", {"qo_indptr": indptr(0, 40, 5), "kv_indptr": indptr(0, 45, 55)},
     r"qo_indptr must be non-decreasing \(request 1\)"),
    ("kv_indptr_decreasing", {"kv_indptr": indptr(0, 40, 12)}, r"kv_indptr must be non-decreasing \(request 1\)"),
    ("indptr_not_from_zero", {"qo_indptr": indptr(1, 5, 45)}, r"qo_indptr\[0\] and kv_indptr\[0\] must be 0"),
    ("qo_indptr_past_n", {"qo_indptr": indptr(0, 5, 46)}, r"qo_indptr\[B\] = 46 exceeds the N = 45 rows of q"),
    ("kv_indptr_past_indices", {"kv_indptr": indptr(0, 12, 56)}, r"kv_indptr\[B\] = 56 exceeds the 55 entries"),
    ("slot_out_of_range", {"kv_indices": lambda a: torch.cat([a["kv_indices"][:-1], a["kv_indices"][-1:] * 0 + 10**6])},
     r"kv_indices\[54\] = 1000000 is out of range for a cache of \d+ slots"),
    ("negative_slot", {"kv_indices": lambda a: torch.cat([a["kv_indices"][:1] * 0 - 1, a["kv_indices"][1:]])},
     r"kv_indices\[0\] = -1 is out of range"),
    ("fewer_slots_than_draft_tokens", {"kv_indptr": indptr(0, 12, 50)},
     r"request 1 has 38 kv slots, fewer than its 40"),
]
ATTENTION_CASES = SHAPE_CASES + VALUE_CASES


def apply_change(args: dict, change: dict) -> dict:
    """base_args' valid call with `change` applied (see SHAPE_CASES)."""
    args = dict(args)
    for name, value in change.items():
        args[name] = value(args) if callable(value) else value
    return args


# Bad `out` buffers of tree_verify_attention_out, as functions of the valid args: (id, out, message pattern).
OUT_CASES = [
    ("shape", lambda a: randn_as(a, 45, 4, a["v_cache"].shape[2] + 1), r"out must be \[N, Hq, Dv\] = \[45, 4, \d+\]"),
    ("dtype", lambda a: randn_as(a, 45, 4, a["v_cache"].shape[2]).double(), r"out must have the dtype of q"),
    ("non_contiguous", lambda a: randn_as(a, 45, a["v_cache"].shape[2], 4).transpose(1, 2),
     r"out must be contiguous"),
]


@pytest.mark.parametrize("change, pattern", [c[1:] for c in ATTENTION_CASES], ids=[c[0] for c in ATTENTION_CASES])
@pytest.mark.parametrize("variant", ["functional", "out"])
def test_attention_rejects(ops, change, pattern, variant):
    valid = base_args()
    out = torch.empty(45, 4, 8) if variant == "out" else None
    call(ops, valid, out)  # the unchanged call is valid
    with pytest.raises(RuntimeError, match=pattern):
        call(ops, apply_change(valid, change), out)


def test_draft_tensors_checked(ops):
    args = base_args("separate")
    with pytest.raises(RuntimeError, match=r"k_draft must be \[N, Hkv, Dqk\]"):
        call(ops, {**args, "k_draft": args["k_draft"][:, :1]})
    with pytest.raises(RuntimeError, match=r"v_draft must have the dtype of q"):
        call(ops, {**args, "v_draft": args["v_draft"].double()})


@pytest.mark.parametrize("make_out, pattern", [c[1:] for c in OUT_CASES], ids=[c[0] for c in OUT_CASES])
def test_attention_out_rejects(ops, make_out, pattern):
    args = base_args()
    with pytest.raises(RuntimeError, match=pattern):
        call(ops, args, make_out(args))


def test_mismatched_devices_cpu_kernel(ops):
    """The shared argument check rejects a tensor on another device.

    On a machine without CUDA the only other device is "meta", and a call with any meta tensor dispatches to
    the fake (meta) implementation, not the CPU kernel; so the CPU kernel is called directly here, as the
    dispatcher would call it with a CPU q and a k_cache elsewhere.
    """
    args = base_args()
    args["k_cache"] = args["k_cache"].to("meta")
    cpu_kernel = torch.ops.kdtree.tree_verify_attention.default
    with pytest.raises(RuntimeError, match=r"k_cache must be on the device of q \(cpu\), got meta"):
        cpu_kernel.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args.values())


# --- mask helpers and record_divergence ----------------------------------------------------------------


# Bad calls of the mask helpers and record_divergence: (id, arguments, message pattern, is a value check).
# Value checks read the index tensors: always on the CPU, on CUDA only with KDTREE_OPS_DEBUG=1 outside capture.
PARENTS_CASES = [
    ("parent_is_self", (i32([-1, 0, 2]), i32([0, 3]), 1),
     r"parents\[2\] = 2 \(token 2 of request 0\) must be -1 \(root\) or", True),
    ("parent_after_child", (i32([-1, 0, -1, 5]), i32([0, 2, 4]), 1), r"parents\[3\] = 5 \(token 1 of request 1\)",
     True),
    ("parent_below_minus_one", (i32([-1, -2]), i32([0, 2]), 1), r"parents\[1\] = -2", True),
    ("parents_int64", (i32([-1, 0]).long(), i32([0, 2]), 1), r"parents must be int32", False),
    ("parents_2d", (i32([[-1, 0]]), i32([0, 2]), 1), r"parents must be 1-D", False),
    ("qo_indptr_int64", (i32([-1, 0]), i32([0, 2]).long(), 1), r"qo_indptr must be int32", False),
    ("qo_indptr_empty", (i32([-1, 0]), i32([]), 1), r"qo_indptr must be \[B\+1\] with at least one entry", False),
    ("qo_indptr_past_n", (i32([-1, 0]), i32([0, 3]), 1), r"qo_indptr\[B\] = 3 exceeds the N rows of parents = 2", True),
    ("qo_indptr_decreasing", (i32([-1, 0]), i32([0, 2, 1]), 1), r"qo_indptr must be non-decreasing", True),
    ("too_few_words", (i32([-1] * 33), i32([0, 33]), 1), r"request 0 has 33 draft tokens but words = 1", True),
    ("negative_words", (i32([-1]), i32([0, 1]), -1), r"words must be >= 0", False),
]


def dense_args(**changes):
    """A valid tree_mask_from_dense call: two requests (T = 2, 3; L = 1, 0), then `changes`."""
    args = dict(custom_mask=torch.ones(2 * 3 + 3 * 3, dtype=torch.bool), mask_indptr=i32([0, 6, 15]),
                qo_indptr=i32([0, 2, 5]), prefix_lens=i32([1, 0]), num_tokens=6, words=1)
    args.update(changes)
    return args


DENSE_CASES = [
    ("rows_past_num_tokens", dict(num_tokens=4), r"qo_indptr\[B\] = 5 exceeds num_tokens = 4", True),
    ("too_few_words", dict(qo_indptr=i32([0, 2, 35]), num_tokens=40, custom_mask=torch.ones(2000, dtype=torch.bool)),
     r"request 1 has 33 draft tokens but words = 1", True),
    ("mask_float", dict(custom_mask=torch.ones(15)), r"custom_mask must be uint8 or bool", False),
    ("mask_2d", dict(custom_mask=torch.ones(3, 5, dtype=torch.bool)), r"custom_mask must be 1-D", False),
    ("mask_too_short", dict(custom_mask=torch.ones(14, dtype=torch.bool)),
     r"request 1's mask .* does not fit in custom_mask", True),
    ("mask_indptr_short", dict(mask_indptr=i32([0])), r"mask_indptr must have at least B = 2 entries", False),
    ("prefix_lens_short", dict(prefix_lens=i32([1])), r"prefix_lens must have at least B = 2 entries", False),
    ("negative_prefix", dict(prefix_lens=i32([-1, 0])), r"prefix_lens\[0\] = -1 must be >= 0", True),
    ("mask_indptr_float", dict(mask_indptr=torch.tensor([0.0, 6.0])), r"mask_indptr must be int32 or int64", False),
    ("qo_indptr_int64", dict(qo_indptr=i32([0, 2, 5]).long()), r"qo_indptr must be int32", False),
    ("negative_num_tokens", dict(num_tokens=-1), r"num_tokens must be >= 0", False),
    ("negative_words", dict(words=-1), r"words must be >= 0", False),
]

DIVERGENCE_CASES = [
    ("stats_float64", (torch.ones(3), torch.ones(3), torch.zeros(3, dtype=torch.float64)),
     r"stats must be float32 \[3\]"),
    ("stats_length", (torch.ones(3), torch.ones(3), torch.zeros(4)), r"stats must be float32 \[3\]"),
    ("shape_mismatch", (torch.ones(3), torch.ones(4), torch.zeros(3)), r"ref must have the shape of out"),
    ("out_int", (torch.ones(3, dtype=torch.int32), torch.ones(3), torch.zeros(3)), r"out must be floating point"),
    ("ref_int", (torch.ones(3), torch.ones(3, dtype=torch.int64), torch.zeros(3)), r"ref must be floating point"),
]


@pytest.mark.parametrize("args, pattern", [c[1:3] for c in PARENTS_CASES], ids=[c[0] for c in PARENTS_CASES])
def test_tree_mask_from_parents_rejects(ops, args, pattern):
    with pytest.raises(RuntimeError, match=pattern):
        ops.tree_mask_from_parents(*args)


@pytest.mark.parametrize("changes, pattern", [c[1:3] for c in DENSE_CASES], ids=[c[0] for c in DENSE_CASES])
def test_tree_mask_from_dense_rejects(ops, changes, pattern):
    ops.tree_mask_from_dense(**dense_args())  # the unchanged call is valid
    with pytest.raises(RuntimeError, match=pattern):
        ops.tree_mask_from_dense(**dense_args(**changes))


@pytest.mark.parametrize("args, pattern", [c[1:] for c in DIVERGENCE_CASES], ids=[c[0] for c in DIVERGENCE_CASES])
def test_record_divergence_rejects(ops, args, pattern):
    with pytest.raises(RuntimeError, match=pattern):
        ops.record_divergence(*args)


# --- the kernel-support answer against what the op does -------------------------------------------------

# (q dtype, KV dtype) x (Dqk, Dv) x Hkv: answers that hold and answers that do not, each checked by a real call.
SUPPORT_DTYPES = [(torch.float32, None), (torch.bfloat16, None), (torch.float16, None),
                  (torch.bfloat16, torch.float8_e4m3fn), (torch.float32, torch.bfloat16), (torch.int8, None)]
SUPPORT_HEAD_DIMS = [(8, 8), (24, 16), (96, 80)]
SUPPORT_KV_HEADS = [1, 3]


def support_case(device, dtype, kv_dtype, dims, num_kv_heads):
    """A small call with this configuration (q of `dtype`, caches of `kv_dtype`) on `device`."""
    build_dtype = dtype if dtype.is_floating_point and dtype.itemsize >= 2 else torch.float32
    case = make_verify_case(tree_sizes=[3, 9], prefix_lens=[5, 2], num_q_heads=2 * num_kv_heads,
                            num_kv_heads=num_kv_heads, head_dim_qk=dims[0], head_dim_v=dims[1], dtype=build_dtype,
                            device=device, generator=torch.Generator().manual_seed(sum(dims) + num_kv_heads))
    case.q = case.q.to(dtype)
    if kv_dtype is not None:
        case.k_cache, case.v_cache = case.k_cache.to(kv_dtype), case.v_cache.to(kv_dtype)
    return case


@pytest.mark.parametrize("dtype, kv_dtype", SUPPORT_DTYPES, ids=lambda t: str(t).removeprefix("torch."))
def test_has_kernel_for_matches_the_cpu_op(ops, dtype, kv_dtype):
    """Where has_kernel_for says yes the CPU op runs and matches the reference; where it says no, it raises."""
    for dims in SUPPORT_HEAD_DIMS:
        for hkv in SUPPORT_KV_HEADS:
            case = support_case("cpu", dtype, kv_dtype, dims, hkv)
            reason = ops.kernel_unsupported_reason("cpu", dtype, *dims, hkv, kv_dtype=kv_dtype)
            assert ops.has_kernel_for("cpu", dtype, *dims, hkv, kv_dtype=kv_dtype) == (reason == "")
            if reason == "":
                out = ops.tree_verify_attention(*case.args())
                assert_close_to_reference(out, tree_verify_attention_reference(*case.args()),
                                          TOLERANCES[("cpu", dtype)], f"{dims} with {hkv} KV heads")
            else:
                with pytest.raises(RuntimeError, match="must be float32, bfloat16 or float16|must have the dtype of q"):
                    ops.tree_verify_attention(*case.args())


def test_cuda_answer_of_a_cpu_only_build(ops):
    """A build without CUDA kernels says no to every CUDA query, and says why (a CUDA build's answers are checked
    against real calls on the GPU, test_cuda_errors.py)."""
    if ops.cuda_kernels_built():  # then every op has its CUDA kernel, not only the one the answer reads
        for op in ("tree_verify_attention", "tree_verify_attention_out", "tree_mask_from_parents",
                   "tree_mask_from_dense", "record_divergence"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"kdtree::{op}", "CUDA"), op
        return
    for device in ("cuda", "cuda:0", "cuda:3"):
        for dtype in (torch.bfloat16, torch.float16):
            for dims, hkv in (((128, 128), 8), ((64, 64), 1), ((576, 512), 1)):
                reason = ops.kernel_unsupported_reason(device, dtype, *dims, hkv)
                assert "has no CUDA kernels" in reason, reason
                assert not ops.has_kernel_for(device, dtype, *dims, hkv)
