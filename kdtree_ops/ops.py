"""Typed wrappers and fake (meta) implementations of the kdtree ops.

Importing this module builds (first use) and loads the library, whose schemas (csrc/ops.cpp) are the
contract; each wrapper calls `torch.ops.kdtree.<op>.default`, and each fake derives output shapes from input
shapes only, so torch.compile traces every call as one opaque node with dynamic shapes.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from . import build
from .shapes import attention_output_shape, mask_words  # noqa: F401  (re-exported)

build.load()  # the schemas; the fakes below belong with them

__all__ = [
    "mask_words",
    "cuda_kernels_built",
    "cuda_launch_class",
    "verified_families",
    "unverified_reason",
    "fp8_path",
    "has_kernel_for",
    "kernel_unsupported_reason",
    "tree_verify_attention",
    "tree_verify_attention_out",
    "tree_mask_from_parents",
    "tree_mask_from_dense",
    "record_divergence",
]


@functools.lru_cache(maxsize=1)
def _support_query():
    """The library's C entry point `kdtree_tree_verify_unsupported_reason` (csrc/kernel_support.cpp)."""
    fn = ctypes.CDLL(str(build.load())).kdtree_tree_verify_unsupported_reason
    fn.restype = ctypes.c_char_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_int64]
    return fn


def kernel_unsupported_reason(device: torch.device | str, dtype: torch.dtype, head_dim_qk: int, head_dim_v: int,
                              num_kv_heads: int, kv_dtype: torch.dtype | None = None) -> str:
    """Why tree_verify_attention has no kernel for this layer configuration on `device`; "" when it has one.

    The answer is the library's own (csrc/kernel_support.h): the dtypes, the head-dim families its CUDA dispatch
    has, and on CUDA whether the family is verified for the device's architecture class (`verified_families`),
    and whether the configuration it would launch has a kernel image for the device's architecture and fits its
    shared memory. A CPU-only build answers no for every CUDA device. Reads no tensor values, so
    callers decide per layer, inside CUDA graphs too. CPU: float32, bfloat16, float16, any head dims.

    Args:
        device: where the call would run (cpu, cuda, cuda:i; cuda alone is the current device).
        dtype: dtype of q.
        head_dim_qk, head_dim_v, num_kv_heads: Dqk, Dv, Hkv of the caches.
        kv_dtype: dtype of k_cache/v_cache (default: dtype).
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    index = -1 if device.index is None or device.type == "cpu" else device.index
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    names = [str(t).removeprefix("torch.").encode() for t in (dtype, kv_dtype)]
    reason = _support_query()(device.type.encode(), index, names[0], names[1], int(head_dim_qk), int(head_dim_v),
                              int(num_kv_heads))
    return reason.decode()


def has_kernel_for(device: torch.device | str, dtype: torch.dtype, head_dim_qk: int, head_dim_v: int,
                   num_kv_heads: int, kv_dtype: torch.dtype | None = None) -> bool:
    """Whether tree_verify_attention has a kernel for this configuration on `device` (kernel_unsupported_reason
    says why not)."""
    return not kernel_unsupported_reason(device, dtype, head_dim_qk, head_dim_v, num_kv_heads, kv_dtype)


def verified_families() -> list[dict]:
    """The library's table of CUDA families and whether the GPU suite has verified each, per architecture class
    (csrc/verified_families.cpp): [{"family": "tree_verify_attention hd128", "cache": "same" | "fp8" | "fp8 overlap" | "",
    "verified": {"sm_90a": True, "sm_100": False, "sm_80": False, "99 KB": False}}, ...]. A family not verified for
    a device's class is answered "no" by has_kernel_for and raises when called, unless KDTREE_OPS_UNVERIFIED=1."""
    fn = ctypes.CDLL(str(build.load())).kdtree_verified_families
    fn.restype = ctypes.c_char_p
    header, *rows = fn().decode().strip().split("\n")
    classes = header.split("\t")
    families = []
    for row in rows:
        family, cache, flags = row.split("\t")
        families.append({"family": family, "cache": cache,
                         "verified": dict(zip(classes, (f == "1" for f in flags.split())))})
    return families


def unverified_reason(family: str, cache: str, launch_class: str) -> str:
    """The gate's answer for `family` over `cache` ("same", "fp8", "fp8 overlap" or "") as architecture class
    `launch_class` ("sm_90a", "sm_100", "sm_80", "99 KB"): "" where it may run (verified, or KDTREE_OPS_UNVERIFIED=1),
    else the reason a call raises. Host-only (no GPU needed). Raises ValueError for a class that names none."""
    fn = ctypes.CDLL(str(build.load())).kdtree_unverified_reason
    fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_char_p] * 3
    answer = fn(family.encode(), cache.encode(), launch_class.encode()).decode()
    if answer.startswith("error: "):
        raise ValueError(answer.removeprefix("error: "))
    return answer


def fp8_path() -> str:
    """The path an fp8 KV cache takes on CUDA, as KDTREE_OPS_FP8_PATH names it now: "widen" (the default, the verified
    kernels) or "overlap" (the landing ring; gated until a GPU run passes it, table cache "fp8 overlap"). Raises
    ValueError, naming the variable, for a value that names no path (as an fp8 call on CUDA does)."""
    fn = ctypes.CDLL(str(build.load())).kdtree_fp8_path
    fn.restype = ctypes.c_char_p
    answer = fn().decode()
    if answer.startswith("error: "):
        raise ValueError(answer.removeprefix("error: "))
    return answer


def cuda_launch_class(device: torch.device | str | int = "cuda") -> str:
    """The architecture class ("sm_90a", "sm_100", "sm_80", "99 KB") a launch on a CUDA device runs as: its own, or
    under KDTREE_OPS_EMULATE_ARCH the emulated one; "" in a build without CUDA kernels. Raises ValueError for an
    emulation that names no class."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    fn = ctypes.CDLL(str(build.load())).kdtree_cuda_launch_class
    fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_int]
    name = fn(index).decode()
    if name.startswith("error: "):
        raise ValueError(name.removeprefix("error: "))
    return name


def cuda_kernels_built() -> bool:
    """Whether the loaded library holds CUDA kernels (False for a CPU-only build)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("kdtree::tree_verify_attention", "CUDA")


def tree_verify_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    tree_mask: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    k_draft: torch.Tensor | None = None,
    v_draft: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Tree-verify attention: each draft token attends to its request's prefix and its tree ancestors.

    Args:
        q: [N, Hq, Dqk] float32/bfloat16/float16, last dim contiguous. Row `qo_indptr[b] + j` is draft
            token j of request b (tree order, root first). Rows past `qo_indptr[B]` (graph padding) give zeros.
        k_cache: [S, Hkv, Dqk], dtype of q or an fp8 KV cache (float8_e4m3fn or float8_e5m2), any row/head
            stride, last dim contiguous (CUDA: 16-byte aligned data pointer, strides multiples of 8 elements).
            Hq % Hkv == 0.
        v_cache: [S, Hkv, Dv], dtype of k_cache; may alias k_cache (MLA: `v_cache = kv_cache[..., :512]`).
        qo_indptr: [B+1] int32: request b owns query rows qo_indptr[b]:qo_indptr[b+1] (T_b tokens).
        kv_indptr: [B+1] int32: request b owns kv_indices[kv_indptr[b]:kv_indptr[b+1]].
        kv_indices: [>= kv_indptr[B]] int32 or int64 slot numbers into the caches; entries past
            kv_indptr[B] are ignored. Without k_draft/v_draft the slots are the prefix then the T_b draft
            tokens; with them, the prefix only.
        tree_mask: [N, W] int32, W >= ceil(max T_b / 32): bit j % 32 of word j // 32 of row i set iff draft
            token i attends draft token j of its own request. Prefix columns are always visible.
        sm_scale: scale of q·kᵀ before the softmax.
        logit_cap: if > 0, scores become logit_cap * tanh(score / logit_cap) (after sm_scale).
        k_draft: optional [N, Hkv, Dqk], dtype of q: the draft tokens' keys, row-aligned with q.
        v_draft: optional [N, Hkv, Dv], dtype of q: the draft tokens' values (given with k_draft).
        k_scale: per-tensor scale of an fp8 k_cache: a cache row's key is its stored value times k_scale (finite,
            > 0; 1.0 for a cache in q's dtype). Never applied to k_draft.
        v_scale: the same for v_cache's values (MLA's value view takes the scale its pool's values were stored
            with). Never applied to v_draft.

    Returns:
        [N, Hq, Dv] contiguous, dtype of q. A row that sees nothing is zeros.
    """
    return torch.ops.kdtree.tree_verify_attention.default(
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, logit_cap, k_draft, v_draft,
        k_scale, v_scale,
    )


def tree_verify_attention_out(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    tree_mask: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    k_draft: torch.Tensor | None = None,
    v_draft: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    *,
    out: torch.Tensor,
) -> None:
    """tree_verify_attention writing into `out`: [N, Hq, Dv], contiguous, dtype of q (e.g. a graph's buffer).

    Arguments as for `tree_verify_attention`.
    """
    torch.ops.kdtree.tree_verify_attention_out.default(
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, logit_cap, k_draft, v_draft,
        k_scale, v_scale, out=out,
    )


def tree_mask_from_parents(parents: torch.Tensor, qo_indptr: torch.Tensor, words: int) -> torch.Tensor:
    """Packed ancestor bitmask of every request's tree.

    Args:
        parents: [N] int32: parent of draft token j of request b (row qo_indptr[b] + j), as an index within the
            request (< j), or -1 for the root.
        qo_indptr: [B+1] int32: request b owns rows qo_indptr[b]:qo_indptr[b+1].
        words: int32 words per row (>= ceil(max T_b / 32)).

    Returns:
        [N, words] int32: row i has the bits of token i and all its ancestors; rows past qo_indptr[B] are zero.
    """
    return torch.ops.kdtree.tree_mask_from_parents.default(parents, qo_indptr, words)


def tree_mask_from_dense(
    custom_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    num_tokens: int,
    words: int,
) -> torch.Tensor:
    """Packed bitmask from SGLang's dense FULL_MASK layout.

    Args:
        custom_mask: [*] uint8 or bool, flat: request b's mask is row-major [T_b, L_b + T_b] at mask_indptr[b].
        mask_indptr: [>= B] int32 or int64: start of each request's mask in custom_mask.
        qo_indptr: [B+1] int32: request b owns rows qo_indptr[b]:qo_indptr[b+1] (T_b of them).
        prefix_lens: [B] int32 or int64: L_b, the committed prefix length of request b.
        num_tokens: rows of the result (no input's shape carries it: a graph bucket pads past qo_indptr[B]).
        words: int32 words per row (>= ceil(max T_b / 32)).

    Returns:
        [num_tokens, words] int32: bit j of row qo_indptr[b] + i is the mask's draft column j of that row;
        rows past qo_indptr[B] are zero.
    """
    return torch.ops.kdtree.tree_mask_from_dense.default(
        custom_mask, mask_indptr, qo_indptr, prefix_lens, num_tokens, words
    )


def record_divergence(out: torch.Tensor, ref: torch.Tensor, stats: torch.Tensor) -> None:
    """Accumulates divergence of `out` from `ref` on the device, with no host sync.

    Args:
        out: any shape, floating point.
        ref: shape of out, floating point.
        stats: [3] float32, updated in place: (running max |out - ref| over finite elements of out,
            count of non-finite elements of out, number of calls).
    """
    torch.ops.kdtree.record_divergence.default(out, ref, stats)


@torch.library.register_fake("kdtree::tree_verify_attention")
def _tree_verify_attention_fake(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale,
                                logit_cap=0.0, k_draft=None, v_draft=None, k_scale=1.0, v_scale=1.0):
    torch._check(q.shape[1] % k_cache.shape[1] == 0, lambda: "Hq must be a multiple of Hkv")
    return q.new_empty(attention_output_shape(q, v_cache))


@torch.library.register_fake("kdtree::tree_verify_attention_out")
def _tree_verify_attention_out_fake(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale,
                                    logit_cap=0.0, k_draft=None, v_draft=None, k_scale=1.0, v_scale=1.0, *, out):
    return None


@torch.library.register_fake("kdtree::tree_mask_from_parents")
def _tree_mask_from_parents_fake(parents, qo_indptr, words):
    return parents.new_empty((parents.shape[0], words), dtype=torch.int32)


@torch.library.register_fake("kdtree::tree_mask_from_dense")
def _tree_mask_from_dense_fake(custom_mask, mask_indptr, qo_indptr, prefix_lens, num_tokens, words):
    return qo_indptr.new_empty((num_tokens, words), dtype=torch.int32)


@torch.library.register_fake("kdtree::record_divergence")
def _record_divergence_fake(out, ref, stats):
    return None


from . import ddtree  # noqa: E402,F401  (the DDTree round's wrappers and fakes: kdtree_ops/ddtree/ops.py)
