"""kdtree's own metadata of a TARGET_VERIFY step: token slots from req_to_token and the packed tree mask.

Every layer of a step shares it: `qo_indptr` (request b's T draft rows), `kv_indptr`/`kv_indices` (its committed
prefix, `seq_lens[b]` token slots read from `req_to_token`; the draft tokens' K/V go to the op row-aligned with q)
and the op's packed mask `[N, W]` int32 (bit j of row i: draft token i sees draft token j of its request). None of
it comes from the base backend, so any base serves (and SGLang's page size does not matter: req_to_token holds
token slots at every page size).

The mask comes from SGLang's spec info in one of its layouts (eagle_utils.TreeMaskMode), or from none:
- FULL_MASK (GPU trees): request b's rows are `[T x (L_b + T)]` booleans at `sum_{c<b} T (L_c + T)`;
- QLEN_ONLY (every CPU tree, GPU chains): request b's rows are `[T x T]` at `b T T`, the draft columns only;
- no mask (DFLASH's block, EAGLE chains in some flows): plain causal order among the draft tokens;
- the op's own packed mask `[B T, W']` (`spec_info.packed_tree_mask`, DDTREE's verify input: ddtree_build_tree's
  mask, never dense), taken as it is.
A mask is the base's preallocated verify buffer (layout: its VerifyMask's mode) or a tensor the worker built for
the batch (layout: QLEN_ONLY exactly when it has B T T elements; with every L_b = 0 both layouts coincide).

Everything here is device work with shapes fixed by the caller (no `.item()`, no host sync), so the graph variant
fills static buffers at capture and before every replay.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# int32 words per packed-mask row for trees of up to N draft tokens (at least 1); the backend imports it here.
from ..shapes import mask_words

FULL_MASK, QLEN_ONLY = 0, 1  # sglang's TreeMaskMode values (kernels/ops/speculative/spec_tree.py)


class VerifyStep(NamedTuple):
    """The op's metadata of one verify step (shared by every layer)."""

    qo_indptr: torch.Tensor  # [B+1] int32
    kv_indptr: torch.Tensor  # [B+1] int32
    kv_indices: torch.Tensor  # [>= kv_indptr[B]] int32 prefix slots
    tree_mask: torch.Tensor  # [>= N, W] int32
    rows: int | None  # the requests' rows (eager; DP attention pads q past them), None under graphs


def mask_layout(custom_mask: torch.Tensor, bs: int, tokens: int, verify_mask) -> int:
    """FULL_MASK or QLEN_ONLY for a spec info's mask (see the module docstring)."""
    if verify_mask is not None and custom_mask.data_ptr() == verify_mask.buffer.data_ptr():
        return int(verify_mask.mode)
    return QLEN_ONLY if custom_mask.numel() == bs * tokens * tokens else FULL_MASK


def chain_parents(qo_indptr: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[N] int32 parents of a causal chain per request: row qo_indptr[b] + j has parent j - 1 (root: -1).

    Args:
        qo_indptr: [B+1] int32, B >= 1.
        rows: [N] int32, arange(N) (a static buffer under graphs).
    Rows past qo_indptr[B] get arbitrary parents; the mask ops zero those rows.
    """
    num_reqs = qo_indptr.shape[0] - 1
    req = torch.searchsorted(qo_indptr[1:], rows, right=True).clamp_(max=max(num_reqs - 1, 0))
    return (rows - qo_indptr[req] - 1).to(torch.int32)


def packed_tree_mask(custom_mask: torch.Tensor | None, layout: int, qo_indptr: torch.Tensor,
                     prefix_lens: torch.Tensor, num_tokens: int, words: int) -> torch.Tensor:
    """[num_tokens, words] int32 packed mask of one step; rows past qo_indptr[B] are zero.

    Args:
        custom_mask: SGLang's flat mask (bool/uint8) in `layout`, or None for causal chains.
        layout: FULL_MASK or QLEN_ONLY.
        qo_indptr: [B+1] int32 draft-token offsets (T tokens per request).
        prefix_lens: [>= B] int committed prefix lengths L_b (SGLang's verify `seq_lens`).
    """
    from kdtree_ops import ops

    bs = qo_indptr.shape[0] - 1
    if custom_mask is None:
        rows = torch.arange(num_tokens, dtype=torch.int32, device=qo_indptr.device)
        return ops.tree_mask_from_parents(chain_parents(qo_indptr, rows), qo_indptr, words)
    tokens = (qo_indptr[1:] - qo_indptr[:-1]).to(torch.int64)
    if layout == QLEN_ONLY:  # the draft columns only: a FULL_MASK whose prefixes are empty
        prefix = torch.zeros(bs, dtype=torch.int64, device=qo_indptr.device)
    else:
        prefix = prefix_lens[:bs].to(torch.int64)
    sizes = tokens * (prefix + tokens)
    mask_indptr = torch.cumsum(sizes, 0) - sizes  # exclusive
    return ops.tree_mask_from_dense(custom_mask, mask_indptr, qo_indptr, prefix, num_tokens, words)


def given_packed_mask(packed: torch.Tensor, num_rows: int, words: int) -> torch.Tensor:
    """[num_rows, words] int32: a spec info's packed mask [N, W'] (W' <= words) padded with zero rows/words."""
    if packed.shape[1] > words:
        raise ValueError(f"kdtree verify: the spec info's packed tree mask has {packed.shape[1]} words per row, more "
                         f"than the {words} this step's {32 * words} draft tokens need")
    out = torch.zeros((num_rows, words), dtype=torch.int32, device=packed.device)
    rows = min(num_rows, packed.shape[0])
    out[:rows, : packed.shape[1]] = packed[:rows]
    return out


def step_mask(spec_info, bs: int, qo_indptr: torch.Tensor, prefix_lens: torch.Tensor, tokens: int, num_rows: int,
              words: int, verify_mask) -> torch.Tensor:
    """[num_rows, words] packed mask of a step, from whichever mask the spec info carries (module docstring)."""
    packed = getattr(spec_info, "packed_tree_mask", None)
    if packed is not None:
        return given_packed_mask(packed, num_rows, words)
    custom_mask = getattr(spec_info, "custom_mask", None)
    layout = mask_layout(custom_mask, bs, tokens, verify_mask) if custom_mask is not None else FULL_MASK
    return packed_tree_mask(custom_mask, layout, qo_indptr, prefix_lens, num_rows, words)


def fill_prefix_slots(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                      kv_indptr: torch.Tensor, out: torch.Tensor, max_len: int) -> None:
    """out[kv_indptr[b] + j] = req_to_token[req_pool_indices[b], j] for j < prefix_lens[b] (b < len(prefix_lens)).

    The other columns of the [B, max_len] gather land on out's last entry, a scratch slot past every request's
    entries (so `out` needs sum(prefix_lens) + 1 entries); no host sync.
    """
    bs = prefix_lens.shape[0]
    max_len = min(max_len, req_to_token.shape[1])
    cols = torch.arange(max_len, dtype=torch.int64, device=out.device)
    table = req_to_token[req_pool_indices[:bs].to(torch.int64), :max_len]
    dest = kv_indptr[:bs, None].to(torch.int64) + cols[None, :]
    dest = torch.where(cols[None, :] < prefix_lens[:, None].to(torch.int64), dest, out.shape[0] - 1)
    out.scatter_(0, dest.reshape(-1), table.reshape(-1).to(out.dtype))


def _indptr(lengths: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Writes [0, cumsum(lengths)] (int32) into out[: len + 1] and returns that view."""
    view = out[: lengths.shape[0] + 1]
    view[:1].zero_()
    torch.cumsum(lengths.to(torch.int32), 0, dtype=torch.int32, out=view[1:])
    return view


def host_length_bound(batch, bs: int) -> int | None:
    """An upper bound, known on the host, on the committed lengths of a batch's first `bs` requests, or None.

    The max of `seq_lens_cpu` where the scheduler copied the lengths to the host, else SGLang's `max_seq_len_host`
    where the batch carries one: the largest KV length allocated to a request, set by spec decode's preparation when
    the overlap scheduler publishes no host lengths (eagle_utils.eagle_prepare_for_decode; the DDTREE worker sets it
    from its requests each round), never below a committed length since slots are allocated before they are written.
    """
    host = getattr(batch, "seq_lens_cpu", None)
    if host is not None:
        return int(host[:bs].max()) if bs > 0 else 0
    bound = getattr(batch, "max_seq_len_host", None)
    return None if bound is None else int(bound)


def prefix_kv(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
              host_bound: int | None, kv_indptr: torch.Tensor | None = None, kv_indices: torch.Tensor | None = None,
              max_context_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indptr [B+1] int32, kv_indices int32) of B requests' committed prefixes, on the device with no host sync:
    request b's prefix_lens[b] token slots from req_to_token at kv_indptr[b] (fill_prefix_slots).

    Args:
        req_to_token, req_pool_indices: SGLang's slot table and each request's row of it.
        prefix_lens: [B] committed lengths on the device.
        host_bound: an upper bound on those lengths known on the host (host_length_bound) or None: it bounds the
            [B, max_len] gather; without one the gather spans max_context_len columns.
        kv_indptr, kv_indices: static buffers to write (>= B + 1 and >= B * max_context_len + 1 entries), or None
            for fresh ones (kv_indices of B * max_len + 1 entries).
        max_context_len: the most slots a request holds (default: req_to_token's width).
    """
    bs = prefix_lens.shape[0]
    device = prefix_lens.device
    bound = req_to_token.shape[1] if max_context_len is None else max_context_len
    max_len = bound if host_bound is None else min(host_bound, bound)
    kv_indptr = _indptr(prefix_lens, torch.empty(bs + 1, dtype=torch.int32, device=device)
                        if kv_indptr is None else kv_indptr)
    if kv_indices is None:
        kv_indices = torch.empty(bs * max_len + 1, dtype=torch.int32, device=device)
    fill_prefix_slots(req_to_token, req_pool_indices, prefix_lens, kv_indptr, kv_indices, max_len)
    return kv_indptr, kv_indices


def eager_verify_step(forward_batch, spec_info, req_to_token: torch.Tensor, tokens: int, words: int,
                      verify_mask) -> VerifyStep:
    """The metadata of an eager verify step (fresh tensors; a host bound on the lengths where the batch has one)."""
    bs = forward_batch.batch_size
    device = forward_batch.seq_lens.device
    prefix = forward_batch.seq_lens[:bs]
    qo_indptr = torch.arange(0, (bs + 1) * tokens, tokens, dtype=torch.int32, device=device)
    kv_indptr, kv_indices = prefix_kv(req_to_token, forward_batch.req_pool_indices, prefix,
                                      host_length_bound(forward_batch, bs))
    # q's rows: the requests' B T, plus the rows DP attention pads after them (out_cache_loc is padded with q;
    # forward_batch_info.prepare_mlp_sync_batch). The mask's rows past the requests are zero.
    num_rows = max(bs * tokens, forward_batch.out_cache_loc.shape[0])
    tree_mask = step_mask(spec_info, bs, qo_indptr, prefix, tokens, num_rows, words, verify_mask)
    return VerifyStep(qo_indptr, kv_indptr, kv_indices, tree_mask, bs * tokens)


class GraphVerifyBuffers:
    """Static buffers of the step metadata under CUDA graphs (shared by every captured batch size).

    `fill` runs outside the graph, at capture and before every replay (`init_forward_metadata_out_graph`), and
    again when the draft rewrites the mask after the plan (`update_verify_buffers_to_fill_after_draft`): it reads
    the step's own spec info, so a graph captured from a spec info without a mask still verifies the tree of
    every later replay, in whichever layout it comes. The captured op reads the buffers at their fixed addresses.
    """

    def __init__(self, max_bs: int, max_num_tokens: int, max_context_len: int, words: int, device):
        self.words, self.max_context_len = words, max_context_len
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)  # [B_max+1]
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)  # [B_max+1]
        self.kv_indices = torch.zeros(max_bs * max_context_len + 1, dtype=torch.int32, device=device)
        self.packed = torch.zeros((max_num_tokens, words), dtype=torch.int32, device=device)  # [N_max, W]

    def fill(self, forward_batch, req_to_token: torch.Tensor, tokens: int, verify_mask) -> VerifyStep:
        """Writes the step (bucket `forward_batch.batch_size`, padded requests after the real ones)."""
        if tokens > 32 * self.words:
            raise ValueError(f"kdtree verify: a step of {tokens} draft tokens per request exceeds the graph buffers' "
                             f"{32 * self.words} (sized for the server's --speculative-num-draft-tokens)")
        bs = forward_batch.batch_size
        prefix = forward_batch.seq_lens[:bs]
        qo = self.qo_indptr[: bs + 1]
        qo.copy_(torch.arange(0, (bs + 1) * tokens, tokens, dtype=torch.int32, device=qo.device))
        # outside the graph, so a host bound on the lengths may size the gather
        kv_indptr, _ = prefix_kv(req_to_token, forward_batch.req_pool_indices, prefix,
                                 host_length_bound(forward_batch, bs), self.kv_indptr, self.kv_indices,
                                 self.max_context_len)
        self.refresh_mask(forward_batch, forward_batch.spec_info, tokens, verify_mask)
        return VerifyStep(qo, kv_indptr, self.kv_indices, self.packed, None)

    def refresh_mask(self, forward_batch, spec_info, tokens: int, verify_mask) -> None:
        """Packs the spec info's mask (its real requests: a graph bucket pads past them) into `packed`."""
        bs = forward_batch.batch_size
        real = bs - int(getattr(forward_batch, "num_padding", 0) or 0)
        self.packed.copy_(step_mask(spec_info, real, self.qo_indptr[: real + 1], forward_batch.seq_lens[:real],
                                    tokens, self.packed.shape[0], self.words, verify_mask))
