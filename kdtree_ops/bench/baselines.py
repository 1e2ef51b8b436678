"""The implementations the benchmark times, each as `prepare(case) -> call`, where `call()` computes the
attention of the case into a buffer allocated by prepare and returns it (so it can be graph-captured):

- kdtree:        this package's op (`tree_verify_attention_out`), as the environment configures it (over an fp8
                 cache: the path KDTREE_OPS_FP8_PATH names, the widen path by default);
- kdtree_fp8_overlap: the same op over an fp8 cache by the overlap path (KDTREE_OPS_FP8_PATH=overlap around each
                 call: the path is read at each call, so the captured graph holds that kernel), for the A/B of the two
                 paths in one run; verified on sm_90a only, so KDTREE_OPS_UNVERIFIED=1 around it too for the emulated
                 classes (the bench checks it against the float64 reference like every implementation); fp8 caches
                 only;
- sglang_triton: SGLang 0.5.23's Triton extend kernel with the tree custom mask, called as its Triton
                 backend calls it in TARGET_VERIFY:
                 `sglang.kernels.ops.attention.extend_attention.extend_attention_fwd(q_extend, k_extend,
                 v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask,
                 is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale=None, logit_cap=0.0,
                 skip_prefix_custom_mask=True, ...)` — kv_indptr/kv_indices the prefix slots, k/v_extend the
                 draft tokens' K/V, custom_mask the flat FULL_MASK (request b: [T_b, L_b + T_b] bool at
                 mask_indptr[b]); for MLA q [N,H,576], k [N,1,576], v [N,1,512], k_buffer the latent pool and
                 v_buffer its [..., :512] view; an fp8 pool with its k_scale/v_scale as SGLang passes them;
- torch_sdpa:    gather each request's prefix K/V from the pool, append the draft K/V, and run
                 F.scaled_dot_product_attention with a dense bool mask [B, 1, T, L + T] (uniform T and L); caches in
                 q's dtype only.

All take cases with separate draft K/V (workloads.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .timing import environment

__all__ = ["IMPLEMENTATIONS", "FP8_ONLY", "unavailable_reason", "dense_full_mask"]

SGLANG_EXTEND_MODULE = "sglang.kernels.ops.attention.extend_attention"


def dense_full_mask(case) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's FULL_MASK of a case: (custom_mask flat bool, mask_indptr [B+1] int64), on the case's device.

    Request b's rows are [T_b, L_b + T_b]: prefix columns all true, then the tree's ancestor matrix.
    """
    from ..testing.trees import ancestor_matrix

    device = case.q.device
    qo = case.qo_indptr.tolist()
    parts, sizes = [], []
    for b, (t, l) in enumerate(zip(case.tree_sizes, case.prefix_lens)):
        rows = torch.ones(t, l + t, dtype=torch.bool)
        rows[:, l:] = ancestor_matrix(case.parents[qo[b] : qo[b] + t].tolist())
        parts.append(rows.flatten())
        sizes.append(t * (l + t))
    custom_mask = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)
    mask_indptr = torch.tensor([0] + sizes, dtype=torch.int64).cumsum(0)
    return custom_mask.to(device), mask_indptr.to(device)


def _prepare_kdtree(case) -> Callable[[], torch.Tensor]:
    from .. import ops

    out = torch.empty(ops.attention_output_shape(case.q, case.v_cache), dtype=case.q.dtype, device=case.q.device)

    def call():
        ops.tree_verify_attention_out(*case.scaled_args(), out=out)
        return out

    return call


def _prepare_kdtree_fp8_overlap(case) -> Callable[[], torch.Tensor]:
    if case.k_cache.dtype == case.q.dtype:
        raise ValueError("kdtree_fp8_overlap takes fp8 caches only (the path of an fp8 cache)")
    call = _prepare_kdtree(case)

    def overlap():
        with environment(KDTREE_OPS_FP8_PATH="overlap", KDTREE_OPS_UNVERIFIED="1"):
            return call()

    return overlap


def _prepare_sglang_triton(case) -> Callable[[], torch.Tensor]:
    import importlib

    extend_attention_fwd = importlib.import_module(SGLANG_EXTEND_MODULE).extend_attention_fwd
    assert case.k_draft is not None, "the Triton extend kernel takes the draft K/V separately"
    custom_mask, mask_indptr = dense_full_mask(case)
    out = torch.empty(case.q.shape[0], case.q.shape[1], case.v_cache.shape[2], dtype=case.q.dtype,
                      device=case.q.device)
    k_extend = case.k_draft.contiguous()  # the backend passes k.contiguous(), v.contiguous()
    v_extend = case.v_draft.contiguous()
    max_len_extend = max(case.tree_sizes, default=0)

    def call():
        extend_attention_fwd(
            case.q, k_extend, v_extend, out, case.k_cache, case.v_cache, case.qo_indptr, case.kv_indptr,
            case.kv_indices, custom_mask, False, mask_indptr, max_len_extend, case.k_scale, case.v_scale,
            sm_scale=case.sm_scale, logit_cap=case.logit_cap, skip_prefix_custom_mask=True,
        )
        return out

    return call


def _prepare_torch_sdpa(case) -> Callable[[], torch.Tensor]:
    import torch.nn.functional as F

    if case.k_cache.dtype != case.q.dtype:
        raise ValueError("the SDPA baseline takes caches in q's dtype")

    from ..testing.trees import ancestor_matrix

    sizes, prefixes = case.tree_sizes, case.prefix_lens
    assert case.k_draft is not None and len(set(sizes)) == 1 and len(set(prefixes)) == 1, \
        "the SDPA baseline takes uniform trees and prefixes with separate draft K/V"
    batch, t, l = len(sizes), sizes[0], prefixes[0]
    n, hq, _ = case.q.shape
    hkv, dv = case.v_cache.shape[1], case.v_cache.shape[2]
    assert n == batch * t, "the SDPA baseline takes no padding rows"
    device = case.q.device
    kv = case.kv_indptr.tolist()
    prefix_idx = torch.stack([case.kv_indices[kv[b] : kv[b] + l].long() for b in range(batch)])  # [B, L]
    qo = case.qo_indptr.tolist()
    mask = torch.ones(batch, 1, t, l + t, dtype=torch.bool)
    for b in range(batch):
        mask[b, 0, :, l:] = ancestor_matrix(case.parents[qo[b] : qo[b] + t].tolist())
    mask = mask.to(device)
    v_aliases_k = (case.v_cache.data_ptr() == case.k_cache.data_ptr()
                   and case.v_draft.data_ptr() == case.k_draft.data_ptr())  # MLA: V is K's first Dv columns
    out = torch.empty(n, hq, dv, dtype=case.q.dtype, device=device)

    def call():
        k = torch.cat([case.k_cache[prefix_idx], case.k_draft.view(batch, t, hkv, -1)], dim=1)  # [B, L+T, Hkv, Dqk]
        if v_aliases_k:
            v = k[..., :dv]
        else:
            v = torch.cat([case.v_cache[prefix_idx], case.v_draft.view(batch, t, hkv, dv)], dim=1)
        o = F.scaled_dot_product_attention(
            case.q.view(batch, t, hq, -1).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=mask, scale=case.sm_scale, enable_gqa=hq != hkv,
        )  # [B, Hq, T, Dv]
        out.view(batch, t, hq, dv).copy_(o.transpose(1, 2))
        return out

    return call


IMPLEMENTATIONS: dict[str, Callable] = {
    "kdtree": _prepare_kdtree,
    "kdtree_fp8_overlap": _prepare_kdtree_fp8_overlap,
    "sglang_triton": _prepare_sglang_triton,
    "torch_sdpa": _prepare_torch_sdpa,
}


# Implementations of an fp8 cache alone: the bench times them in its fp8 column only.
FP8_ONLY = ("kdtree_fp8_overlap",)


def unavailable_reason(name: str) -> str | None:
    """Why an implementation cannot run here (None when it can)."""
    if name == "sglang_triton":
        try:
            import importlib

            importlib.import_module(SGLANG_EXTEND_MODULE).extend_attention_fwd  # noqa: B018
        except Exception as e:  # sglang absent, or a dependency of it
            return f"{SGLANG_EXTEND_MODULE} does not import: {type(e).__name__}: {e}"
    return None
