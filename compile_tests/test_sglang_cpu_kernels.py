"""The engine tests' torch stand-ins for SGLang's CPU kernels, each on a literal case worked out from the semantics
of the kernel SGLang runs on a GPU (the Triton kernels beside each CPU call in sglang/kernels/ops/speculative/ and
kernels/ops/kvcache/, sgl-kernel's CUDA/CPU speculative kernels) and, for the two attention kernels, against the
float64 reference of kdtree_ops (independent code).

The stand-ins (compile_tests/sglang_cpu/) are test code: SGLang's scheduler processes import them as `sgl_kernel`
in the engine suite; here they are imported as plain modules, so this process's sglang is left as it is.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sglang_cpu import attention_kernels as attn  # noqa: E402
from sglang_cpu import spec_kernels as spec  # noqa: E402

from kdtree_ops.testing.reference import tree_verify_attention_reference  # noqa: E402
from kdtree_ops.testing.trees import ancestor_mask, ancestor_matrix  # noqa: E402

# The tree of the literal cases: root 0 with children 1 and 2; node 1 with child 3.
PARENTS = [-1, 0, 0, 1]
TREE = ancestor_matrix(PARENTS)  # [4, 4] bool: row i marks i and its ancestors


def test_assign_req_to_token_pool_writes_each_request_s_new_slots():
    """Triton assign_req_to_token_pool: request b's slots out_cache_loc[sum_{c<b}(end-start):] go to
    req_to_token[req_pool_indices[b], start[b]:end[b]]."""
    table = torch.zeros(3, 8, dtype=torch.int32)
    spec.assign_req_to_token_pool_cpu(torch.tensor([2, 0]), table, torch.tensor([1, 3]), torch.tensor([3, 6]),
                                      torch.tensor([10, 11, 20, 21, 22]), 8)
    assert table[2].tolist() == [0, 10, 11, 0, 0, 0, 0, 0]
    assert table[0].tolist() == [0, 0, 0, 20, 21, 22, 0, 0]
    assert not table[1].any()


def test_assign_extend_cache_locs_reads_them_back():
    """Triton assign_extend_cache_locs: the reverse gather, request after request."""
    table = torch.arange(24, dtype=torch.int32).view(3, 8)
    out = torch.empty(5, dtype=torch.int64)
    spec.assign_extend_cache_locs_cpu(torch.tensor([2, 0]), table, torch.tensor([1, 3]), torch.tensor([3, 6]), out, 8)
    assert out.tolist() == [17, 18, 3, 4, 5]


def test_assign_draft_cache_locs_contiguous():
    """Triton assign_draft_cache_locs_contiguous: topk * steps slots per request from its seq_len on."""
    table = torch.arange(30, dtype=torch.int32).view(3, 10)
    out = torch.empty(8, dtype=torch.int64)
    spec.assign_draft_cache_locs_contiguous_cpu(torch.tensor([1, 2]), table, torch.tensor([2, 5]), out, 10, 2, 2)
    assert out.tolist() == [12, 13, 14, 15, 25, 26, 27, 28]


def test_build_draft_decode_metadata():
    """sgl-kernel build_draft_decode_metadata_cpu: row b*topk+k = prefix, then candidate k's draft slots."""
    table = torch.arange(20, dtype=torch.int32).view(2, 10)
    out = spec.build_draft_decode_metadata_cpu(table, torch.tensor([1]), torch.tensor([3]), 2, 2, 10)
    assert out[0, :5].tolist() == [10, 11, 12, 13, 14] and out[1, :5].tolist() == [10, 11, 12, 15, 16]


def test_fill_bonus_tokens():
    """Triton fill_bonus_tokens: accept_lens count the bonus; it is the last accepted entry of each row."""
    bonus = torch.zeros(2, dtype=torch.int32)
    spec.fill_bonus_tokens_cpu(torch.tensor([[5, 6, 7], [8, 9, 4]], dtype=torch.int32),
                               torch.tensor([2, 3], dtype=torch.int32), bonus, 3)
    assert bonus.tolist() == [6, 4]


def test_fill_accept_out_cache_loc_compacts_accepted_slots():
    """Triton fill_accept_out_cache_loc: entry i > -1 goes to position #(entries > -1 before it)."""
    out = torch.full((5,), -7, dtype=torch.int64)
    spec.fill_accept_out_cache_loc_cpu(torch.tensor([0, -1, 2, 3, -1], dtype=torch.int32),
                                       torch.arange(100, 105), out)
    assert out.tolist() == [100, 102, 103, -7, -7]


def test_reconstruct_indices_from_tree_mask():
    """The NGRAM tree metadata of reconstruct_tree.py's documented contract on PARENTS' QLEN_ONLY mask."""
    positions, index, nxt, sib = (torch.empty(4, dtype=torch.int64) for _ in range(4))
    spec.reconstruct_indices_from_tree_mask(TREE.flatten(), torch.tensor([10]), positions, index, nxt, sib, 1, 4)
    assert positions.tolist() == [10, 11, 11, 12]  # depth + verified length
    assert index.tolist() == [0, 1, 2, 3]
    assert nxt.tolist() == [1, 3, -1, -1]  # first child
    assert sib.tolist() == [-1, 2, -1, -1]  # next sibling (same parent); the root has none


def test_build_tree_kernel_efficient_both_layouts():
    """sgl-kernel build_tree_kernel_efficient (topk 2, depth 2, 4 nodes): selected expansion entries [0, 1, 2],
    entry 2 expanding step-1 entry parent_list[2 // 2] = 0, i.e. node 1: the tree PARENTS. Children are linked in
    decreasing node order, then reversed by insertion: first child 1 of the root, its sibling 2."""
    parent_list, selected = torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]])
    for mode, prefix in ((1, 0), (0, 2)):
        width = prefix + 4
        mask = torch.ones(4 * width, dtype=torch.bool)  # SGLang allocates it True (prefix columns stay)
        positions, index = torch.empty(4, dtype=torch.int64), torch.empty(1, 4, dtype=torch.int64)
        nxt, sib = torch.full((1, 4), -1), torch.full((1, 4), -1)
        spec.build_tree_kernel_efficient_cpu(parent_list, selected, torch.tensor([prefix]), mask, positions, index,
                                             nxt, sib, 2, 2, 4, mode)
        rows = mask.view(4, width)
        assert rows[:, :prefix].all() and torch.equal(rows[:, prefix:], TREE)
        assert positions.tolist() == [prefix, prefix + 1, prefix + 1, prefix + 2]
        assert index.tolist() == [[0, 1, 2, 3]] and nxt.tolist() == [[1, 3, -1, -1]] and sib.tolist() == [[-1, 2, -1, -1]]


def test_verify_tree_greedy_follows_the_matching_child():
    """sgl-kernel verify_tree_greedy on PARENTS (tokens 0:7 1:8 2:9 3:6): the target says 9 after the root, so node
    2 (not its elder sibling 1) is accepted; nothing follows node 2; its target token 5 is the bonus."""
    candidates = torch.tensor([[7, 8, 9, 6]])
    index, nxt, sib = torch.tensor([[0, 1, 2, 3]]), torch.tensor([[1, 3, -1, -1]]), torch.tensor([[-1, 2, -1, -1]])
    target = torch.tensor([[9, 6, 5, 1]])
    predicts = torch.zeros(4, dtype=torch.int32)
    accept_index = torch.full((1, 3), -1, dtype=torch.int32)
    accept_num = torch.zeros(1, dtype=torch.int32)
    spec.verify_tree_greedy_cpu(predicts, accept_index, accept_num, candidates, index, nxt, sib, target)
    assert accept_index.tolist() == [[0, 2, -1]] and accept_num.tolist() == [1]
    assert predicts[0] == 9 and predicts[2] == 5


def test_rotate_input_ids():
    """Triton rotate_input_ids_kernel: shift each segment left by one, the next token last (or at select_index)."""
    ids = torch.tensor([1, 2, 3, 4, 5, 6])
    spec.rotate_input_ids_cpu(ids, torch.tensor([0, 3]), torch.tensor([3, 3]), torch.tensor([[70], [80]]))
    assert ids.tolist() == [2, 3, 70, 5, 6, 80]
    ids = torch.tensor([1, 2, 3, 4, 5, 6])
    spec.rotate_input_ids_cpu(ids, torch.tensor([0, 3]), torch.tensor([3, 3]), torch.tensor([70, 80]),
                              select_index=torch.tensor([1, 3]))
    assert ids.tolist() == [2, 70, 3, 80, 6, 6]


def test_copy_all_layer_kv_cache_moves_rows_of_every_buffer():
    """Triton copy_all_layer_kv_cache_tiled: for each buffer (address, row bytes), row tgt[j] = row src[j]."""
    bufs = [torch.arange(12, dtype=torch.float32).view(4, 3), torch.arange(8, dtype=torch.int64).view(4, 2) * 10]
    ptrs = torch.tensor([b.data_ptr() for b in bufs])
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    spec.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([0, 3]), torch.tensor([2, 1]))
    assert bufs[0].tolist() == [[6, 7, 8], [3, 4, 5], [6, 7, 8], [3, 4, 5]]
    assert bufs[1].tolist() == [[40, 50], [20, 30], [40, 50], [20, 30]]


def _cache(gen, slots, heads, dim, dtype=torch.float32):
    return torch.randn(slots, heads, dim, generator=gen).to(dtype)


def test_extend_attention_with_a_tree_mask_is_tree_verify():
    """extend_attention_cpu in TARGET_VERIFY (intel_amx's call): the prefix from the caches, the draft tokens from
    k_extend, a QLEN_ONLY tree mask; equals kdtree's float64 reference of tree verification with k_draft."""
    gen = torch.Generator().manual_seed(0)
    hq, hkv, d, t, prefix = 4, 2, 32, 4, (5, 9)
    k_buf, v_buf = _cache(gen, 40, hkv, d), _cache(gen, 40, hkv, d)
    table = torch.randperm(40, generator=gen)[:32].view(2, 16).to(torch.int32)
    q, k, v = (torch.randn(2 * t, h, d, generator=gen) for h in (hq, hkv, hkv))
    out = torch.empty(2 * t, hq, d)
    attn.extend_attention_cpu(q, k, v, out, k_buf, v_buf, 1.0, 1.0, table, torch.tensor([1, 0]),
                              torch.tensor([prefix[0] + t, prefix[1] + t]), torch.tensor([t, t], dtype=torch.int32),
                              torch.tensor([0, t], dtype=torch.int32), t, d ** -0.5, 0.0, False, 0, None, None,
                              TREE.flatten().repeat(2), True)
    kv_indices = torch.cat([table[1, : prefix[0]], table[0, : prefix[1]]])
    expect = tree_verify_attention_reference(
        q, k_buf, v_buf, torch.tensor([0, t, 2 * t], dtype=torch.int32),
        torch.tensor([0, prefix[0], sum(prefix)], dtype=torch.int32), kv_indices,
        torch.cat([ancestor_mask(PARENTS, 1)] * 2), d ** -0.5, 0.0, k, v)
    torch.testing.assert_close(out.double(), expect, atol=1e-5, rtol=1e-5)


def test_extend_attention_is_causal_without_a_mask():
    gen = torch.Generator().manual_seed(1)
    k_buf, v_buf = _cache(gen, 20, 2, 32), _cache(gen, 20, 2, 32)
    table = torch.arange(20, dtype=torch.int32).view(1, 20)
    q, k, v = torch.randn(3, 4, 32, generator=gen), torch.randn(3, 2, 32, generator=gen), torch.randn(3, 2, 32)
    out = torch.empty(3, 4, 32)
    attn.extend_attention_cpu(q, k, v, out, k_buf, v_buf, 1.0, 1.0, table, torch.tensor([0]), torch.tensor([7]),
                              torch.tensor([3], dtype=torch.int32), torch.tensor([0], dtype=torch.int32), 3, 0.2, 0.0,
                              False, 0, None, None, None, True)
    chain = [-1, 0, 1]
    expect = tree_verify_attention_reference(q, k_buf, v_buf, torch.tensor([0, 3], dtype=torch.int32),
                                             torch.tensor([0, 4], dtype=torch.int32), table[0, :4],
                                             ancestor_mask(chain, 1), 0.2, 0.0, k, v)
    torch.testing.assert_close(out.double(), expect, atol=1e-5, rtol=1e-5)


def test_decode_attention_writes_then_attends_fp8_and_mla():
    """decode_attention_cpu: the new token's K/V written at loc (quantized into an fp8 cache), then each request's
    query attends its seq_lens slots, the cache dequantized with its scale; MLA's value cache is a view of the key
    cache."""
    gen = torch.Generator().manual_seed(2)
    for fp8, mla in ((False, False), (True, False), (False, True)):
        dtype = torch.float8_e4m3fn if fp8 else torch.float32
        k_buf = _cache(gen, 16, 1 if mla else 2, 48 if mla else 32, dtype)
        v_buf = k_buf[..., :32] if mla else _cache(gen, 16, 2, 32, dtype)
        table = torch.tensor([[3, 7, 1, 9, 0], [5, 2, 8, 0, 0]], dtype=torch.int32)
        q = torch.randn(2, 4, k_buf.shape[-1], generator=gen)
        key = torch.randn(2, k_buf.shape[1], k_buf.shape[-1], generator=gen)
        value = key[..., :32] if mla else torch.randn(2, 2, 32, generator=gen)
        out = torch.empty(2, 4, 32)
        scale = 0.5 if fp8 else 1.0
        attn.decode_attention_cpu(q, k_buf, v_buf, scale, scale, out, key.to(dtype), value.to(dtype),
                                  torch.tensor([9, 8]), None, table, torch.tensor([0, 1]), torch.tensor([4, 3]),
                                  0.125, 0.0, False, 0, None, None)
        assert torch.equal(k_buf[9].float(), key[0].to(dtype).float())  # written before attending
        expect = tree_verify_attention_reference(
            q, k_buf, v_buf, torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 4, 7], dtype=torch.int32),
            torch.cat([table[0, :4], table[1, :3]]), torch.ones(2, 1, dtype=torch.int32), 0.125, 0.0,
            k_scale=scale, v_scale=scale)
        torch.testing.assert_close(out.double(), expect, atol=1e-4, rtol=1e-4)
