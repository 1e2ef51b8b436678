"""kdtree's own verify metadata (kdtree_ops/sglang/verify_metadata.py) on the CPU ops, against literal layouts.

The packed mask from SGLang's FULL_MASK and QLEN_ONLY layouts (and from none: a chain), the layout a spec info's
mask is in, the prefix slots read from req_to_token, and the static graph buffers filled outside the graph: a
bucket padded past the real requests, a capture without a mask, replays with trees, and the draft's rewrite of
the mask after the plan (update_verify_buffers_to_fill_after_draft).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang_rig import Rig, Step  # noqa: E402

from kdtree_ops.sglang.verify_metadata import (  # noqa: E402
    FULL_MASK,
    QLEN_ONLY,
    GraphVerifyBuffers,
    fill_prefix_slots,
    mask_layout,
    mask_words,
    packed_tree_mask,
    prefix_kv,
)
from kdtree_ops.testing.trees import ancestor_mask, ancestor_matrix, random_tree  # noqa: E402


def dense_masks(trees, prefix_lens):
    """(FULL_MASK, QLEN_ONLY) flat bool masks of a batch of trees, in SGLang's layouts."""
    full, qlen = [], []
    for parents, prefix in zip(trees, prefix_lens):
        t = len(parents)
        rows = torch.ones(t, prefix + t, dtype=torch.bool)
        rows[:, prefix:] = ancestor_matrix(parents)
        full.append(rows.flatten())
        qlen.append(ancestor_matrix(parents).flatten())
    return torch.cat(full), torch.cat(qlen)


def qo_indptr_of(bs: int, t: int) -> torch.Tensor:
    return torch.arange(0, (bs + 1) * t, t, dtype=torch.int32)


@pytest.mark.parametrize("tree_tokens", [1, 7, 32, 33, 70])
def test_packed_mask_from_both_layouts_and_the_chain(tree_tokens):
    gen = torch.Generator().manual_seed(tree_tokens)
    prefix_lens = [0, 5, 19]
    trees = [random_tree(tree_tokens, generator=gen) for _ in prefix_lens]
    full, qlen = dense_masks(trees, prefix_lens)
    words, bs = mask_words(tree_tokens), len(prefix_lens)
    n = bs * tree_tokens
    qo, prefix = qo_indptr_of(bs, tree_tokens), torch.tensor(prefix_lens, dtype=torch.int32)
    expect_tree = torch.cat([ancestor_mask(p, words) for p in trees])
    expect_chain = ancestor_mask(list(range(-1, tree_tokens - 1)), words).repeat(bs, 1)
    assert torch.equal(packed_tree_mask(full, FULL_MASK, qo, prefix, n, words), expect_tree)
    assert torch.equal(packed_tree_mask(qlen.to(torch.uint8), QLEN_ONLY, qo, prefix, n, words), expect_tree)
    assert torch.equal(packed_tree_mask(None, FULL_MASK, qo, prefix, n, words), expect_chain)
    padded = packed_tree_mask(full, FULL_MASK, qo, prefix, n + 5, words)  # rows past the requests: zero
    assert torch.equal(padded[:n], expect_tree) and not padded[n:].any()


def test_mask_layout_of_a_spec_info_mask():
    bs, t = 2, 4
    qlen = torch.ones(bs * t * t, dtype=torch.bool)
    full = torch.ones(t * (3 + t) + t * (1 + t), dtype=torch.bool)  # prefixes 3 and 1
    assert mask_layout(qlen, bs, t, None) == QLEN_ONLY
    assert mask_layout(full, bs, t, None) == FULL_MASK
    # The base's preallocated buffer (sized for its max batch): its own mode, whatever its size.
    buffer = SimpleNamespace(buffer=torch.ones(10_000, dtype=torch.bool), mode=QLEN_ONLY)
    assert mask_layout(buffer.buffer, bs, t, buffer) == QLEN_ONLY
    buffer.mode = FULL_MASK
    assert mask_layout(buffer.buffer[:40], bs, t, buffer) == FULL_MASK  # a view at the buffer's start


def test_prefix_slots_from_req_to_token():
    gen = torch.Generator().manual_seed(3)
    req_to_token = torch.randint(1, 1000, (6, 50), generator=gen, dtype=torch.int32)
    rows, lens = torch.tensor([4, 0, 2]), torch.tensor([7, 0, 31], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 7, 7, 38], dtype=torch.int32)
    out = torch.full((3 * 50 + 1,), -1, dtype=torch.int32)
    fill_prefix_slots(req_to_token, rows, lens, kv_indptr, out, max_len=50)
    expect = torch.cat([req_to_token[4, :7], req_to_token[2, :31]])
    assert torch.equal(out[:38], expect)
    assert torch.all(out[38:-1] == -1)  # nothing written past the requests but the scratch slot


def test_prefix_kv_fresh_and_into_static_buffers():
    """Request 0 reads table row 2 (3 slots), request 1 row 0 (5): kv_indptr [0, 3, 8] and their slots, in fresh
    tensors sized by a host bound on the lengths (the host lengths' max, a looser allocated length, else the table's
    width) or in static buffers, written only there."""
    req_to_token = torch.arange(100, 124, dtype=torch.int32).view(4, 6)
    rows, lens = torch.tensor([2, 0]), torch.tensor([3, 5], dtype=torch.int32)
    slots = [112, 113, 114, 100, 101, 102, 103, 104]
    for host_bound, size in ((5, 2 * 5 + 1), (6, 2 * 6 + 1), (None, 2 * 6 + 1), (9, 2 * 6 + 1)):  # 9: clamped
        kv_indptr, kv_indices = prefix_kv(req_to_token, rows, lens, host_bound)
        assert kv_indptr.tolist() == [0, 3, 8] and kv_indices[:8].tolist() == slots
        assert kv_indices.shape == (size,) and kv_indptr.dtype == kv_indices.dtype == torch.int32
    indptr_buffer = torch.full((5,), -1, dtype=torch.int32)
    indices_buffer = torch.full((4 * 6 + 1,), -7, dtype=torch.int32)
    kv_indptr, kv_indices = prefix_kv(req_to_token, rows, lens, 5, indptr_buffer, indices_buffer, 6)
    assert kv_indptr.data_ptr() == indptr_buffer.data_ptr() and kv_indices is indices_buffer
    assert indptr_buffer.tolist() == [0, 3, 8, -1, -1]
    assert indices_buffer[:8].tolist() == slots and indices_buffer[8:-1].eq(-7).all()  # the last entry: scratch


def _graph_batch(req_to_token, slots, prefix_lens, bs, custom_mask, padding):
    """What the decode graph runner hands the backend at replay: the bucket's padded buffers, the real spec info."""
    rows = torch.arange(bs, dtype=torch.int32)
    for b, s in enumerate(slots):
        req_to_token[b, : s.numel()] = s
    lens = torch.tensor(list(prefix_lens) + [1] * padding, dtype=torch.int32)  # padded requests: fill value 1
    return SimpleNamespace(batch_size=bs, forward_mode=ForwardMode.TARGET_VERIFY, req_pool_indices=rows,
                           seq_lens=lens, seq_lens_cpu=lens.clone(), num_padding=padding,
                           spec_info=SimpleNamespace(custom_mask=custom_mask))


def test_graph_buffers_capture_without_a_mask_then_replay_trees():
    t, words = 8, mask_words(8)
    buffers = GraphVerifyBuffers(max_bs=4, max_num_tokens=4 * t, max_context_len=64, words=words, device="cpu")
    req_to_token = torch.zeros(4, 64, dtype=torch.int32)
    gen = torch.Generator().manual_seed(7)
    slots = [torch.randperm(500, generator=gen)[:20].int() + 1 for _ in range(3)]

    capture = _graph_batch(req_to_token, slots, (5, 9, 2), 3, None, padding=0)  # a spec info without a mask
    buffers.fill(capture, req_to_token, t, None)
    chain = ancestor_mask(list(range(-1, t - 1)), words)
    assert torch.equal(buffers.packed[: 3 * t], chain.repeat(3, 1))

    for seed, prefix_lens, layout in ((1, (11, 3), FULL_MASK), (2, (0, 17), QLEN_ONLY)):
        trees = [random_tree(t, generator=torch.Generator().manual_seed(seed + b)) for b in range(2)]
        full, qlen = dense_masks(trees, prefix_lens)
        batch = _graph_batch(req_to_token, slots[:2], prefix_lens, 3, full if layout == FULL_MASK else qlen,
                             padding=1)
        step = buffers.fill(batch, req_to_token, t, None)
        assert step.tree_mask is buffers.packed and step.rows is None  # the static buffer the graph reads
        assert torch.equal(buffers.packed[: 2 * t], torch.cat([ancestor_mask(p, words) for p in trees]))
        assert not buffers.packed[2 * t:].any()  # the padded request's rows see only its prefix
        assert buffers.qo_indptr[:4].tolist() == [0, t, 2 * t, 3 * t]
        assert buffers.kv_indptr[:4].tolist() == [0, prefix_lens[0], sum(prefix_lens), sum(prefix_lens) + 1]
        expect = torch.cat([slots[0][: prefix_lens[0]], slots[1][: prefix_lens[1]], req_to_token[2, :1]])
        assert torch.equal(buffers.kv_indices[: sum(prefix_lens) + 1], expect)

        # The draft rewrites the mask after the plan: the static buffer follows it.
        flipped = [list(range(-1, t - 1))] * 2
        full2, qlen2 = dense_masks(flipped, prefix_lens)
        spec = SimpleNamespace(custom_mask=full2 if layout == FULL_MASK else qlen2)
        buffers.refresh_mask(batch, spec, t, None)
        assert torch.equal(buffers.packed[: 2 * t], chain.repeat(2, 1))


def test_eager_step_follows_the_draft_s_rewrite(base_calls):
    """update_verify_buffers_to_fill_after_draft: the eager step's mask is repacked from the new spec info."""
    rig = Rig()
    step = Step(rig, (6, 3), seed=11)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    words = mask_words(8)
    assert torch.equal(rig.backend._step.tree_mask, torch.cat([ancestor_mask(p, words) for p in step.trees]))
    chain = [list(range(-1, 7))] * 2
    spec = SimpleNamespace(custom_mask=dense_masks(chain, step.prefix_lens)[0], num_tokens_per_req=8)
    rig.backend.update_verify_buffers_to_fill_after_draft(spec, None)
    assert torch.equal(rig.backend._step.tree_mask, ancestor_mask(chain[0], words).repeat(2, 1))



def test_graph_buffers_refuse_a_wider_tree_than_they_were_sized_for():
    buffers = GraphVerifyBuffers(max_bs=2, max_num_tokens=80, max_context_len=16, words=1, device="cpu")
    req_to_token = torch.zeros(2, 16, dtype=torch.int32)
    batch = _graph_batch(req_to_token, [torch.arange(1, 5, dtype=torch.int32)], (4,), 1, None, padding=0)
    with pytest.raises(ValueError, match="40 draft tokens per request exceeds the graph buffers' 32"):
        buffers.fill(batch, req_to_token, 40, None)
