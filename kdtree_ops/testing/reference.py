"""float64 PyTorch references of the kdtree ops: slow, obvious, and what the tests hold the kernels to.

Each request's keys/values are gathered into dense tensors and its mask is expanded to a dense boolean
matrix [T_b, L_b + T_b]; attention is then plain softmax(q·kᵀ)·v in float64. No kernel code is shared.
"""

from __future__ import annotations

import torch

from .trees import ancestor_matrix, pack_mask_bits, unpack_mask_bits

__all__ = [
    "tree_verify_attention_reference",
    "tree_mask_from_parents_reference",
    "tree_mask_from_dense_reference",
    "record_divergence_reference",
]


def tree_verify_attention_reference(
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
    """Reference of `kdtree_ops.tree_verify_attention` (same arguments, see its docstring).

    Cache rows are dequantized in float64 (`stored.double() * scale`), exactly the key/value an fp8 cache
    holds; k_draft/v_draft rows are taken as they are (unscaled).

    Returns:
        [N, Hq, Dv] **float64** on q's device; the caller converts (compare a kernel's output as
        `out.double()` against it, with tolerances for the kernel's dtype). Rows that see nothing and rows
        past qo_indptr[B] are zeros.
    """
    n, hq, _ = q.shape
    hkv, dv = v_cache.shape[1], v_cache.shape[2]
    group = hq // hkv
    out = torch.zeros(n, hq, dv, dtype=torch.float64, device=q.device)
    qo = qo_indptr.tolist()
    kv = kv_indptr.tolist()
    for b in range(len(qo) - 1):
        t = qo[b + 1] - qo[b]
        if t == 0:
            continue
        slots = kv_indices[kv[b] : kv[b + 1]].long()
        prefix_len = slots.numel() - t if k_draft is None else slots.numel()
        cache_slots = slots if k_draft is None else slots[:prefix_len]
        keys = k_cache[cache_slots].double() * k_scale  # without k_draft: prefix then draft tokens
        values = v_cache[cache_slots].double() * v_scale
        if k_draft is not None:
            keys = torch.cat([keys, k_draft[qo[b] : qo[b + 1]].double()])
            values = torch.cat([values, v_draft[qo[b] : qo[b + 1]].double()])
        keys = keys.repeat_interleave(group, dim=1)  # [L + T, Hq, Dqk]
        values = values.repeat_interleave(group, dim=1)
        visible = torch.cat(
            [
                torch.ones(t, prefix_len, dtype=torch.bool, device=q.device),
                unpack_mask_bits(tree_mask[qo[b] : qo[b + 1]], t),
            ],
            dim=1,
        )  # [T, L + T]
        scores = torch.einsum("thd,shd->hts", q[qo[b] : qo[b + 1]].double(), keys) * sm_scale
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        scores = scores.masked_fill(~visible, float("-inf"))
        seen = visible.any(dim=1)  # [T]
        probs = torch.softmax(scores.masked_fill(~seen[None, :, None], 0.0), dim=-1)
        probs = probs * seen[None, :, None]  # a row that sees nothing outputs zeros
        out[qo[b] : qo[b + 1]] = torch.einsum("hts,shd->thd", probs, values)
    return out


def tree_mask_from_parents_reference(parents: torch.Tensor, qo_indptr: torch.Tensor, words: int) -> torch.Tensor:
    """Reference of `kdtree_ops.tree_mask_from_parents`: [N, words] int32, padding rows zero."""
    out = torch.zeros(parents.shape[0], words, dtype=torch.int32)
    qo = qo_indptr.tolist()
    for b in range(len(qo) - 1):
        if qo[b + 1] > qo[b]:
            out[qo[b] : qo[b + 1]] = pack_mask_bits(ancestor_matrix(parents[qo[b] : qo[b + 1]].tolist()), words)
    return out.to(parents.device)


def tree_mask_from_dense_reference(
    custom_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    num_tokens: int,
    words: int,
) -> torch.Tensor:
    """Reference of `kdtree_ops.tree_mask_from_dense`: [num_tokens, words] int32, padding rows zero."""
    out = torch.zeros(num_tokens, words, dtype=torch.int32)
    dense = custom_mask.cpu().bool()
    qo = qo_indptr.tolist()
    for b in range(len(qo) - 1):
        t = qo[b + 1] - qo[b]
        if t == 0:
            continue
        prefix, start = int(prefix_lens[b]), int(mask_indptr[b])
        rows = dense[start : start + t * (prefix + t)].view(t, prefix + t)
        out[qo[b] : qo[b + 1]] = pack_mask_bits(rows[:, prefix:], words)
    return out.to(qo_indptr.device)


def record_divergence_reference(out: torch.Tensor, ref: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """Reference of `kdtree_ops.record_divergence`, functional: returns the updated float32 [3] stats."""
    o = out.double()
    finite = torch.isfinite(o)
    diff = (o - ref.double()).abs()[finite]
    max_diff = diff.max().item() if diff.numel() else 0.0
    return torch.tensor(
        [max(stats[0].item(), max_diff), stats[1].item() + (~finite).sum().item(), stats[2].item() + 1],
        dtype=torch.float32,
        device=stats.device,
    )
