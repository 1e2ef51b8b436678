"""The intel_amx backend's two attention kernels, written in torch (TEST ONLY).

SGLang's `intel_amx` attention backend (layers/attention/intel_amx_backend.py) calls
`torch.ops.sgl_kernel.extend_attention_cpu` and `torch.ops.sgl_kernel.decode_attention_cpu`, CPU kernels of
sgl-kernel (csrc/cpu/extend.cpp, decode.cpp) that no published wheel carries. These follow the backend's calls
and the kernels' documented arguments, in float32, one request at a time; the engine tests name `intel_amx` as
kdtree's base backend to have a base with a TARGET_VERIFY path on the CPU (torch_native has none), which is what
validate mode compares the op with. compile_tests/test_sglang_cpu_kernels.py checks both on literal cases.

What the tiny models never reach raises: sliding windows, attention sinks, cross attention.
"""

from __future__ import annotations

import torch


def _dequant(rows: torch.Tensor, scale: float) -> torch.Tensor:
    """Cache rows in float32: fp8 rows are stored / scale (SGLang's quantizing write), others as stored."""
    out = rows.to(torch.float32)
    return out * scale if rows.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else out


def _attend(q, k, v, visible, sm_scale: float, logit_cap: float) -> torch.Tensor:
    """softmax(q k^T * sm_scale [capped]) v over the visible keys; q [M, H, D], k/v [L, Hkv, D], visible [M, L]."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("mhd,lhd->hml", q.float(), k) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    scores = scores.masked_fill(~visible[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row that sees nothing: zeros
    return torch.einsum("hml,lhd->mhd", probs, v)


def _unsupported(is_cross_attn: bool, sliding_window: int, sinks) -> None:
    if is_cross_attn or sinks is not None or sliding_window > 0:
        raise NotImplementedError("test stand-in: cross attention, sinks and sliding windows are not written")


def extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale: float, v_scale: float,
                         req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc,
                         max_len_extend, sm_scale: float, logit_cap: float, is_cross_attn: bool,
                         sliding_window: int, encoder_lens, sinks, tree_mask, is_causal: bool) -> None:
    """Extend attention: request b's extend_seq_lens[b] query rows at extend_start_loc[b] see its prefix (the first
    seq_lens[b] - extend_seq_lens[b] slots of req_to_token[req_pool_indices[b]], read from the caches) and its own
    extend tokens (rows of k_extend/v_extend): all of them (not causal), the causal ones, or, with a tree mask
    (QLEN_ONLY: [bs * n * n] bool, row i of request b at b*n*n + i*n), the marked ones. MLA (the cache has fewer
    heads than k_extend) skips the prefix, as the kernel does: the absorbed path reads it elsewhere.
    Writes o_extend [N, H, Dv].
    """
    _unsupported(is_cross_attn, sliding_window, sinks)
    prefix_skipped = k_buffer.shape[1] != k_extend.shape[1]
    for b in range(seq_lens.numel()):
        n, start = int(extend_seq_lens[b]), int(extend_start_loc[b])
        if n == 0:
            continue
        prefix = int(seq_lens[b]) - n
        q = q_extend[start: start + n]
        if prefix_skipped:
            prefix = 0
            k, v = k_extend[start: start + n].float(), v_extend[start: start + n].float()
        else:
            slots = req_to_token[int(req_pool_indices[b]), :prefix].long()
            k = torch.cat([_dequant(k_buffer[slots], k_scale), k_extend[start: start + n].float()])
            v = torch.cat([_dequant(v_buffer[slots], v_scale), v_extend[start: start + n].float()])
        visible = torch.ones(n, prefix + n, dtype=torch.bool)
        if tree_mask is not None:
            visible[:, prefix:] = tree_mask.reshape(-1)[b * n * n: (b + 1) * n * n].reshape(n, n).bool()
        elif is_causal:
            visible[:, prefix:] = torch.ones(n, n, dtype=torch.bool).tril()
        o_extend[start: start + n] = _attend(q, k, v, visible, sm_scale, logit_cap).to(o_extend.dtype)


def decode_attention_cpu(query, k_buffer, v_buffer, k_scale: float, v_scale: float, output, key, value, loc,
                         attn_logits, req_to_token, req_pool_indices, seq_lens, sm_scale: float, logit_cap: float,
                         is_cross_attn: bool, sliding_window: int, encoder_lens, sinks) -> None:
    """Decode attention: writes key/value (when given) into the caches at loc, then each request's one query row
    attends to its seq_lens[b] slots of req_to_token[req_pool_indices[b]]. Writes output [B, H, Dv]; attn_logits
    (the kernel's split-K scratch) is not used."""
    _unsupported(is_cross_attn, sliding_window, sinks)
    if key is not None and value is not None:
        k_buffer[loc] = key.to(k_buffer.dtype)
        if v_buffer.data_ptr() != k_buffer.data_ptr():  # MLA: the value cache is a view of the key cache
            v_buffer[loc] = value.to(v_buffer.dtype)
    for b in range(seq_lens.numel()):
        slots = req_to_token[int(req_pool_indices[b]), : int(seq_lens[b])].long()
        k, v = _dequant(k_buffer[slots], k_scale), _dequant(v_buffer[slots], v_scale)
        visible = torch.ones(1, slots.numel(), dtype=torch.bool)
        output[b: b + 1] = _attend(query[b: b + 1], k, v, visible, sm_scale, logit_cap).to(output.dtype)
