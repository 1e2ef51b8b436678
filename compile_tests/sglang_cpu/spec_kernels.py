"""SGLang's CPU entry points for KV-slot bookkeeping and speculative decoding, written in torch (TEST ONLY).

sglang 0.5.23 imports these from `sgl_kernel` on its CPU path (`SGLANG_USE_CPU_ENGINE=1`), and no published
sgl-kernel wheel is a CPU build (sgl-kernel 0.3.21 and sglang-kernel 0.4.10 on PyPI are CUDA builds). Each
function follows its sgl-kernel CPU kernel (sgl-kernel/csrc/cpu/spec.cpp, speculative_decoding.cpp) and the CUDA
or Triton kernel its GPU callers run (sglang/kernels/ops/speculative/*.py, kernels/ops/kvcache/cache_move.py);
compile_tests/test_sglang_cpu_kernels.py checks each on a literal case worked out from those semantics.
Written for clarity, not speed: Python loops over requests, which the tiny engine tests can afford.

Mutable arguments are written in place, as the kernels do (SGLang passes preallocated buffers).
"""

from __future__ import annotations

import ctypes

import torch


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len: int) -> None:
    """req_to_token[req_pool_indices[b], start[b]:end[b]] = the next end[b]-start[b] entries of out_cache_loc.

    out_cache_loc [sum(end - start)] int64 holds the batch's new slots, request after request.
    """
    cursor = 0
    for b in range(req_pool_indices.numel()):
        start, end = int(start_offset[b]), int(end_offset[b])
        row = int(req_pool_indices[b])
        req_to_token[row, start:end] = out_cache_loc[cursor: cursor + end - start].to(req_to_token.dtype)
        cursor += end - start


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len: int) -> None:
    """The reverse gather: out_cache_loc's next end[b]-start[b] entries = req_to_token[req, start[b]:end[b]]."""
    cursor = 0
    for b in range(req_pool_indices.numel()):
        start, end = int(start_offset[b]), int(end_offset[b])
        row = int(req_pool_indices[b])
        out_cache_loc[cursor: cursor + end - start] = req_to_token[row, start:end].to(out_cache_loc.dtype)
        cursor += end - start


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len: int,
                                           topk: int, num_steps: int) -> None:
    """out_cache_loc[b*topk*steps : (b+1)*topk*steps] = req_to_token[req, seq_lens[b] : seq_lens[b] + topk*steps]."""
    width = topk * num_steps
    for b in range(req_pool_indices.numel()):
        start, row = int(seq_lens[b]), int(req_pool_indices[b])
        out_cache_loc[b * width: (b + 1) * width] = req_to_token[row, start: start + width].to(out_cache_loc.dtype)


def build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk: int, num_steps: int,
                                    pool_len: int) -> torch.Tensor:
    """[bs * topk, pool_len] int32: row b*topk+k = request b's prefix, then candidate k's num_steps draft slots
    (laid out contiguously at seq_lens[b] + k * num_steps); entries past seq_lens[b] + num_steps are undefined."""
    bs = req_pool_indices.numel()
    out = torch.zeros((bs * topk, pool_len), dtype=req_to_token.dtype)
    for b in range(bs):
        row, length = req_to_token[int(req_pool_indices[b])], int(seq_lens[b])
        for k in range(topk):
            out[b * topk + k, :length] = row[:length]
            start = length + k * num_steps
            out[b * topk + k, length: length + num_steps] = row[start: start + num_steps]
    return out


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride: int) -> None:
    """bonus_tokens[b] = accept_tokens.flat[accept_stride * b + accept_lens[b] - 1] (accept_lens count the bonus)."""
    flat = accept_tokens.reshape(-1)
    for b in range(accept_lens.numel()):
        bonus_tokens[b] = flat[accept_stride * b + int(accept_lens[b]) - 1]


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc) -> None:
    """Compacts the accepted slots: for each accept_index entry i > -1, in order, the next accept_out_cache_loc
    entry is out_cache_loc[i]."""
    kept = accept_index.reshape(-1)
    kept = kept[kept > -1].to(torch.int64)
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept]


def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                           retrive_next_sibling, target_predict) -> None:
    """Greedy tree verification (sgl-kernel's verify_tree_greedy, one walk per request).

    From the root (node 0), repeatedly take the first child (retrive_next_token, then siblings through
    retrive_next_sibling) whose candidate token equals the target's argmax after the last accepted node; stop at
    accept_index.shape[1] - 1 accepted drafts or when no child matches. Writes accept_index[b] (flat indices of
    the accepted nodes, root first; the rest left as the caller filled them), accept_token_num[b] (drafts
    accepted), and predicts[flat index of each accepted node] = the target token that follows it.
    """
    bs, num_draft = candidates.shape
    num_steps = accept_index.shape[1]
    target = target_predict.reshape(-1)
    for b in range(bs):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, num_steps):
            cur = int(retrive_next_token[b, cur])
            while cur != -1:
                if int(candidates[b, cur]) == int(target[last]):
                    predicts[last] = target[last]
                    accepted += 1
                    last = int(retrive_index[b, cur])
                    accept_index[b, accepted] = last
                    break
                cur = int(retrive_next_sibling[b, cur])
            if cur == -1:
                break
        accept_token_num[b] = accepted
        predicts[last] = target[last]


def reconstruct_indices_from_tree_mask(tree_mask, verified_seq_len, positions, retrive_index, retrive_next_token,
                                       retrive_next_sibling, batch_size: int, draft_token_num: int) -> None:
    """NGRAM's tree metadata from its QLEN_ONLY mask (semantics spelled out in sglang's
    kernels/ops/speculative/reconstruct_tree.py): tree_mask [bs * n * n] bool, row i of request b marks i's
    ancestors and itself; positions = depth + verified_seq_len; retrive_index = b * n + i; first child and next
    sibling (same parent, next higher index) or -1."""
    n = draft_token_num
    masks = tree_mask.reshape(batch_size, n, n).to(torch.bool)
    order = torch.arange(n)
    strict = order[None, :] < order[:, None]  # [i, j]: j < i
    for b in range(batch_size):
        anc = masks[b] & strict
        parent = torch.where(anc.any(1), (anc * order).argmax(1), torch.full((n,), -1))
        positions.view(batch_size, n)[b] = anc.sum(1) + int(verified_seq_len[b])
        retrive_index.view(batch_size, n)[b] = b * n + order
        for i in range(n):
            children = torch.nonzero(anc[:, i]).flatten()
            retrive_next_token.view(batch_size, n)[b, i] = int(children[0]) if children.numel() else -1
            siblings = torch.nonzero((parent == parent[i]) & (order > i)).flatten()
            has = parent[i] >= 0 and siblings.numel() > 0
            retrive_next_sibling.view(batch_size, n)[b, i] = int(siblings[0]) if has else -1


def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                    retrive_index, retrive_next_token, retrive_next_sibling, topk: int, depth: int,
                                    draft_token_num: int, tree_mask_mode: int) -> None:
    """EAGLE's tree from the draft's top-k expansion (sgl-kernel's build_tree_kernel_efficient).

    Node 0 is the verified token; draft node i (1..n-1) is selected_index[b, i-1] of the expansion, whose parent is
    the expansion entry parent_list[b, selected_index // topk] (0: the root). Writes the ancestor mask (QLEN_ONLY,
    mode 1: [bs, n, n]; FULL_MASK, mode 0: request b's [n, L_b + n] rows at b*n*n + n*sum(L_<b), prefix columns
    left as filled by the caller), positions (depth + L_b), retrive_index (b*n + i) and the first-child /
    next-sibling links, children linked in decreasing node order as the kernel inserts them.
    """
    n, sel_stride, parent_stride = draft_token_num, draft_token_num - 1, topk * (depth - 1) + 1
    sel = selected_index.reshape(-1, sel_stride)
    par = parent_list.reshape(-1, parent_stride)
    bs = sel.shape[0]
    mask_offset = 0
    for b in range(bs):
        seq_len = int(verified_seq_len[b])
        off = b * n
        positions[off] = seq_len
        retrive_index.view(-1)[off] = off
        parents = [-1] * n  # node index of each node's parent
        for i in range(n - 1, 0, -1):
            retrive_index.view(-1)[off + i] = off + i
            parent_tb = int(sel[b, i - 1]) // topk
            pos = 0
            if parent_tb > 0:
                token = int(par[b, parent_tb])
                found = [j for j in range(sel_stride) if int(sel[b, j]) == token]
                pos = found[0] + 1 if found else n
            if pos == n:
                continue
            parents[i] = pos
            head = int(retrive_next_token.view(-1)[off + pos])
            retrive_next_token.view(-1)[off + pos] = i
            if head != -1:
                retrive_next_sibling.view(-1)[off + i] = head
        row_width = n if tree_mask_mode == 1 else seq_len + n
        base = off * n if tree_mask_mode == 1 else mask_offset + seq_len
        for tid in range(n):
            start = base + tid * row_width
            tree_mask[start: start + n] = False
            tree_mask[start] = True
            cur, d = tid, 0
            while cur > 0:
                tree_mask[start + cur] = True
                cur, d = parents[cur], d + 1
                if cur == -1:
                    break
            positions[off + tid] = seq_len + d
        mask_offset += n * (seq_len + n)


def rotate_input_ids_cpu(input_ids, extend_start_loc, extend_seq_lens, topk_index, select_index=None) -> None:
    """Multi-layer EAGLE's shift: request b's extend ids move left by one, and topk_index.flat[b] (its next draft
    token) is written at select_index[b] when given (a flat position), else at the segment's last position."""
    new_tokens = topk_index.reshape(-1)
    for b in range(extend_seq_lens.numel()):
        start, length = int(extend_start_loc[b]), int(extend_seq_lens[b])
        if length == 0:
            continue
        input_ids[start: start + length - 1] = input_ids[start + 1: start + length].clone()
        last = int(select_index[b]) if select_index is not None else start + length - 1
        input_ids[last] = new_tokens[b]


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc) -> None:
    """For every buffer (raw address data_ptrs[i], row size strides[i] bytes): row tgt_loc[j] = row src_loc[j].

    The kernel works on raw pointers (one per layer's K and V buffer), so this copies with memmove.
    """
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        for tgt, src in zip(tgt_loc.tolist(), src_loc.tolist()):
            if tgt != src:
                ctypes.memmove(ptr + tgt * stride, ptr + src * stride, stride)
