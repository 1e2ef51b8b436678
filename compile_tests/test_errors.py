"""Bad inputs raise RuntimeError with a message that names the offending argument and what was expected."""

from __future__ import annotations

import pytest
import torch

from kdtree_ops.cases import make_verify_case

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
NAMES = ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "tree_mask", "sm_scale", "logit_cap",
         "k_draft", "v_draft")


def base_args(draft_mode="cache", **overrides) -> dict:
    """Keyword arguments of a valid call (two requests, GQA 4/2), by schema name."""
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


# (id, {argument: replacement or function of the valid args}, message pattern)
ATTENTION_CASES = [
    ("q_int", {"q": lambda a: a["q"].to(torch.int32)}, r"q must be float32, bfloat16 or float16"),
    ("q_2d", {"q": lambda a: a["q"][:, 0]}, r"q must be 3-D"),
    ("k_cache_dtype", {"k_cache": lambda a: a["k_cache"].double()}, r"k_cache must have the dtype of q"),
    ("v_cache_dtype", {"v_cache": lambda a: a["v_cache"].half()}, r"v_cache must have the dtype of q"),
    ("heads_not_multiple", {"q": lambda a: torch.randn(a["q"].shape[0], 3, 8)},
     r"query heads of q \(3\) must be a multiple of the KV heads of k_cache \(2\)"),
    ("k_cache_head_dim", {"k_cache": lambda a: torch.randn(a["k_cache"].shape[0], 2, 16)}, r"k_cache head dim"),
    ("v_cache_slots", {"v_cache": lambda a: a["v_cache"][:-1]}, r"v_cache must be \[S, Hkv, Dv\]"),
    ("k_cache_inner_stride", {"k_cache": lambda a: a["k_cache"].transpose(1, 2).contiguous().transpose(1, 2)},
     r"k_cache must have a contiguous last dimension"),
    ("qo_indptr_int64", {"qo_indptr": lambda a: a["qo_indptr"].long()}, r"qo_indptr must be int32"),
    ("kv_indptr_int64", {"kv_indptr": lambda a: a["kv_indptr"].long()}, r"kv_indptr must be int32"),
    ("kv_indptr_length", {"kv_indptr": lambda a: torch.cat([a["kv_indptr"], a["kv_indptr"][-1:]])},
     r"kv_indptr must be \[B\+1\] = \[3\]"),
    ("kv_indices_float", {"kv_indices": lambda a: a["kv_indices"].float()}, r"kv_indices must be 1-D int32 or int64"),
    ("tree_mask_int64", {"tree_mask": lambda a: a["tree_mask"].long()}, r"tree_mask must be int32"),
    ("tree_mask_rows", {"tree_mask": lambda a: a["tree_mask"][:-1]}, r"tree_mask must be \[N, W\] with N = 45"),
    ("too_few_mask_words", {"tree_mask": lambda a: a["tree_mask"][:, :1]},
     r"request 1 has 40 draft tokens but tree_mask has only 1 words"),
    ("k_draft_without_v_draft", {"k_draft": lambda a: torch.randn(45, 2, 8)},
     r"pass k_draft and v_draft together"),
    ("qo_indptr_decreasing", {"qo_indptr": i32([0, 40, 5]), "kv_indptr": i32([0, 45, 55])},
     r"qo_indptr must be non-decreasing \(request 1\)"),
    ("kv_indptr_decreasing", {"kv_indptr": i32([0, 40, 12])}, r"kv_indptr must be non-decreasing \(request 1\)"),
    ("indptr_not_from_zero", {"qo_indptr": i32([1, 5, 45])}, r"qo_indptr\[0\] and kv_indptr\[0\] must be 0"),
    ("qo_indptr_past_n", {"qo_indptr": i32([0, 5, 46])}, r"qo_indptr\[B\] = 46 exceeds the N = 45 rows of q"),
    ("kv_indptr_past_indices", {"kv_indptr": i32([0, 12, 56])}, r"kv_indptr\[B\] = 56 exceeds the 55 entries"),
    ("slot_out_of_range", {"kv_indices": lambda a: torch.cat([a["kv_indices"][:-1], a["kv_indices"][-1:] * 0 + 10**6])},
     r"kv_indices\[54\] = 1000000 is out of range for a cache of \d+ slots"),
    ("negative_slot", {"kv_indices": lambda a: torch.cat([a["kv_indices"][:1] * 0 - 1, a["kv_indices"][1:]])},
     r"kv_indices\[0\] = -1 is out of range"),
    ("fewer_slots_than_draft_tokens", {"kv_indptr": i32([0, 12, 50])}, r"request 1 has 38 kv slots, fewer than its 40"),
    ("negative_logit_cap", {"logit_cap": -1.0}, r"logit_cap must be finite and >= 0"),
]


@pytest.mark.parametrize("change, pattern", [c[1:] for c in ATTENTION_CASES], ids=[c[0] for c in ATTENTION_CASES])
@pytest.mark.parametrize("variant", ["functional", "out"])
def test_attention_rejects(ops, change, pattern, variant):
    args = base_args()
    for name, value in change.items():
        args[name] = value(args) if callable(value) else value
    out = torch.empty(45, 4, 8) if variant == "out" else None
    with pytest.raises(RuntimeError, match=pattern):
        call(ops, args, out)


def test_draft_tensors_checked(ops):
    args = base_args("separate")
    with pytest.raises(RuntimeError, match=r"k_draft must be \[N, Hkv, Dqk\]"):
        call(ops, {**args, "k_draft": args["k_draft"][:, :1]})
    with pytest.raises(RuntimeError, match=r"v_draft must have the dtype of q"):
        call(ops, {**args, "v_draft": args["v_draft"].double()})


@pytest.mark.parametrize(
    "out, pattern",
    [
        (torch.empty(45, 4, 9), r"out must be \[N, Hq, Dv\] = \[45, 4, 8\]"),
        (torch.empty(45, 4, 8, dtype=torch.float64), r"out must have the dtype of q"),
        (torch.empty(45, 8, 4).transpose(1, 2), r"out must be contiguous"),
    ],
    ids=["shape", "dtype", "non_contiguous"],
)
def test_attention_out_rejects(ops, out, pattern):
    with pytest.raises(RuntimeError, match=pattern):
        call(ops, base_args(), out)


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


if "cuda" in DEVICES:  # defined only where it can run: the CPU suite never skips

    @pytest.mark.cuda
    def test_mismatched_devices_cuda(ops):
        args = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in base_args(dtype=torch.bfloat16).items()}
        args["k_cache"] = args["k_cache"].cpu()
        with pytest.raises(RuntimeError, match=r"k_cache must be on the device of q"):
            call(ops, args)


# --- mask helpers and record_divergence ----------------------------------------------------------------


@pytest.mark.parametrize(
    "parents, qo_indptr, words, pattern",
    [
        (i32([-1, 0, 2]), i32([0, 3]), 1, r"parents\[2\] = 2 \(token 2 of request 0\) must be -1 \(root\) or"),
        (i32([-1, 0, -1, 5]), i32([0, 2, 4]), 1, r"parents\[3\] = 5 \(token 1 of request 1\)"),
        (i32([-1, -2]), i32([0, 2]), 1, r"parents\[1\] = -2"),
        (i32([-1, 0]).long(), i32([0, 2]), 1, r"parents must be int32"),
        (i32([-1, 0]), i32([0, 2]).long(), 1, r"qo_indptr must be int32"),
        (i32([-1, 0]), i32([0, 3]), 1, r"qo_indptr\[B\] = 3 exceeds the N rows of parents = 2"),
        (i32([-1, 0]), i32([0, 2, 1]), 1, r"qo_indptr must be non-decreasing"),
        (i32([-1] * 33), i32([0, 33]), 1, r"request 0 has 33 draft tokens but words = 1"),
        (i32([-1]), i32([0, 1]), -1, r"words must be >= 0"),
    ],
    ids=["parent_is_self", "parent_after_child", "parent_below_minus_one", "parents_int64", "qo_indptr_int64",
         "qo_indptr_past_n", "qo_indptr_decreasing", "too_few_words", "negative_words"],
)
def test_tree_mask_from_parents_rejects(ops, parents, qo_indptr, words, pattern):
    with pytest.raises(RuntimeError, match=pattern):
        ops.tree_mask_from_parents(parents, qo_indptr, words)


def _dense_args(**changes):
    """A valid tree_mask_from_dense call: two requests (T = 2, 3; L = 1, 0), then `changes`."""
    args = dict(custom_mask=torch.ones(2 * 3 + 3 * 3, dtype=torch.bool), mask_indptr=i32([0, 6, 15]),
                qo_indptr=i32([0, 2, 5]), prefix_lens=i32([1, 0]), num_tokens=6, words=1)
    args.update(changes)
    return args


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (dict(num_tokens=4), r"qo_indptr\[B\] = 5 exceeds num_tokens = 4"),
        (dict(qo_indptr=i32([0, 2, 35]), num_tokens=40, custom_mask=torch.ones(2000, dtype=torch.bool)),
         r"request 1 has 33 draft tokens but words = 1"),
        (dict(custom_mask=torch.ones(15)), r"custom_mask must be uint8 or bool"),
        (dict(custom_mask=torch.ones(14, dtype=torch.bool)), r"request 1's mask .* does not fit in custom_mask"),
        (dict(mask_indptr=i32([0])), r"mask_indptr must have at least B = 2 entries"),
        (dict(prefix_lens=i32([1])), r"prefix_lens must have at least B = 2 entries"),
        (dict(prefix_lens=i32([-1, 0])), r"prefix_lens\[0\] = -1 must be >= 0"),
        (dict(mask_indptr=torch.tensor([0.0, 6.0])), r"mask_indptr must be int32 or int64"),
        (dict(qo_indptr=i32([0, 2, 5]).long()), r"qo_indptr must be int32"),
        (dict(num_tokens=-1), r"num_tokens must be >= 0"),
    ],
    ids=["rows_past_num_tokens", "too_few_words", "mask_float", "mask_too_short", "mask_indptr_short",
         "prefix_lens_short", "negative_prefix", "mask_indptr_float", "qo_indptr_int64", "negative_num_tokens"],
)
def test_tree_mask_from_dense_rejects(ops, changes, pattern):
    ops.tree_mask_from_dense(**_dense_args())  # the unchanged call is valid
    with pytest.raises(RuntimeError, match=pattern):
        ops.tree_mask_from_dense(**_dense_args(**changes))


@pytest.mark.parametrize(
    "out, ref, stats, pattern",
    [
        (torch.ones(3), torch.ones(3), torch.zeros(3, dtype=torch.float64), r"stats must be float32 \[3\]"),
        (torch.ones(3), torch.ones(3), torch.zeros(4), r"stats must be float32 \[3\]"),
        (torch.ones(3), torch.ones(4), torch.zeros(3), r"ref must have the shape of out"),
        (torch.ones(3, dtype=torch.int32), torch.ones(3), torch.zeros(3), r"out must be floating point"),
        (torch.ones(3), torch.ones(3, dtype=torch.int64), torch.zeros(3), r"ref must be floating point"),
    ],
    ids=["stats_float64", "stats_length", "shape_mismatch", "out_int", "ref_int"],
)
def test_record_divergence_rejects(ops, out, ref, stats, pattern):
    with pytest.raises(RuntimeError, match=pattern):
        ops.record_divergence(out, ref, stats)


def test_has_kernel_for_names_the_cuda_kernels():
    # The SGLang backend falls back to its parent where this says no: it must mirror the CUDA dispatch.
    from kdtree_ops import ops

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert ops.has_kernel_for(cpu, torch.float32, 96, 80, 3)
    assert not ops.has_kernel_for(cpu, torch.int8, 64, 64, 1)
    for dqk, dv in ops.CUDA_HEAD_DIMS:
        assert ops.has_kernel_for(cuda, torch.bfloat16, dqk, dv, 8)
        assert ops.has_kernel_for(cuda, torch.float16, dqk, dv, 1)
        assert not ops.has_kernel_for(cuda, torch.float32, dqk, dv, 8)
    assert ops.has_kernel_for(cuda, torch.bfloat16, 576, 512, 1)
    assert not ops.has_kernel_for(cuda, torch.bfloat16, 576, 512, 2)
    assert not ops.has_kernel_for(cuda, torch.bfloat16, 96, 96, 8)
