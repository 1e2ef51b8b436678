"""DDTREE's draft-step graphs (kdtree_ops/sglang/draft_graphs.py), their host logic on the CPU: which (batch size,
tree width) pairs are captured, and that a round served from a graph gets the tree the eager step builds for the
same requests: the inputs copied into the static buffers, the padding rows, the committed slots gathered into the
static index buffer, the first b rows returned. The graph is replaced by a replay that re-runs the captured step
on the same static buffers (what a CUDA graph replay does); the drafter is a stand-in whose top-k is a function of
each request's bonus token and committed slots, so a wrong slot, row or padding changes the tree.
"""

from __future__ import annotations

import random

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from kdtree_ops import ddtree  # noqa: E402
from kdtree_ops.sglang.draft_graphs import DraftGraphs, capture_plan, draft_graphs_off_reason  # noqa: E402
from kdtree_ops.sglang.verify_metadata import prefix_kv  # noqa: E402

VOCAB, POSITIONS, TOPK = 50, 4, 3


class SlotDrafter:
    """propose(): top-k of each position from the request's bonus token and the sum of its committed slots."""

    block_size = POSITIONS + 1

    def propose(self, bonus, prefix_lens, kv_indptr, kv_indices, topk):
        rows = []
        for b in range(bonus.shape[0]):
            slots = kv_indices[int(kv_indptr[b]): int(kv_indptr[b + 1])].to(torch.int64)
            assert slots.numel() == int(prefix_lens[b])
            key = int(slots.sum()) * 7 + int(bonus[b]) * 3
            rows.append([[(key + 5 * p + 11 * j) % VOCAB for j in range(topk)] for p in range(POSITIONS)])
        tokens = torch.tensor(rows, dtype=torch.int64).view(-1, POSITIONS, topk)
        spread = 1.0 + (tokens[:, :, :1] % 5).float() / 4  # scores differ per request
        logprobs = -spread * torch.arange(1, topk + 1, dtype=torch.float32)
        return logprobs.contiguous(), tokens


class ReplayedGraph:
    def __init__(self, step, outputs):
        self.step, self.outputs = step, outputs

    def replay(self):
        for out, new in zip(self.outputs, self.step()):
            out.copy_(new)


class CpuDraftGraphs(DraftGraphs):
    def _capture(self, size, width):
        def step():
            return self._step(size, width)

        self.captures.append((size, width))
        outputs = step()
        return ReplayedGraph(step, outputs), outputs

    def __init__(self, *args):
        self.captures = []
        super().__init__(*args)


def test_capture_plan_takes_each_size_s_widths_from_the_batches_it_serves():
    assert capture_plan([4, 1, 2], lambda b: 64) == [(1, 64), (2, 64), (4, 64)]
    policy = {**{b: 64 for b in range(1, 16)}, **{b: 1 for b in range(16, 33)}}
    # 16 serves 13..16: 64 for 13..15, plain decode (nothing to capture) for 16; 24 and 32 decode plainly
    assert capture_plan([1, 8, 16, 24, 32], policy.get) == [(1, 64), (8, 64), (16, 64)]
    widths = {1: 64, 2: 64, 3: 16, 4: 16}
    assert capture_plan([2, 4], widths.get) == [(2, 64), (4, 16)]
    assert capture_plan([1, 2], lambda b: 1) == []


def _fragmented_pool(rng, rows, width, slots):
    """req_to_token [rows, width] of distinct slots in random order (a fragmented pool)."""
    order = list(range(1, slots))
    rng.shuffle(order)
    return torch.tensor(order[: rows * width], dtype=torch.int32).view(rows, width)


@pytest.mark.parametrize("seed", range(6))
def test_a_round_from_a_graph_gets_the_eager_step_s_tree(seed):
    rng = random.Random(seed)
    req_to_token = _fragmented_pool(rng, rows=12, width=20, slots=1000)
    graphs = CpuDraftGraphs(SlotDrafter(), TOPK, req_to_token, [(1, 8), (4, 8), (8, 8), (8, 5)])
    assert sorted(graphs.captures) == [(1, 8), (4, 8), (8, 5), (8, 8)]
    for b, width in [(1, 8), (3, 8), (4, 8), (7, 5), (8, 8), (5, 8)]:
        rows = torch.tensor(rng.sample(range(12), b), dtype=torch.int64)
        prefix = torch.tensor([rng.randrange(0, 21) for _ in range(b)], dtype=torch.int64)
        bonus = torch.tensor([rng.randrange(VOCAB) for _ in range(b)], dtype=torch.int64)
        got = graphs.run(bonus, prefix, rows, prefix.clone(), width)
        indptr, indices = prefix_kv(req_to_token, rows, prefix, prefix)
        logprobs, tokens = SlotDrafter().propose(bonus, prefix, indptr, indices, TOPK)
        want = ddtree.build_tree(logprobs, tokens, bonus, width - 1)
        assert got is not None and len(got) == 4
        size = graphs.padded_size(b)  # rows past b: an empty prefix and token 0, whatever ran before
        assert not graphs.prefix[b:size].any() and not graphs.bonus[b:size].any()
        for g, w in zip(got, want):
            assert torch.equal(g, w), (b, width)


def test_a_batch_no_graph_holds_runs_eagerly():
    req_to_token = _fragmented_pool(random.Random(0), rows=12, width=8, slots=200)
    graphs = CpuDraftGraphs(SlotDrafter(), TOPK, req_to_token, [(2, 8)])
    one = torch.ones(1, dtype=torch.int64)
    three = torch.ones(3, dtype=torch.int64)
    assert graphs.run(three, three, torch.arange(3), three, 8) is None  # larger than every size
    assert graphs.run(one, one, torch.arange(1), one, 5) is None  # a width not captured
    assert graphs.run(one, one, torch.arange(1), one, 8) is not None


def test_a_cpu_worker_drafts_eagerly():
    assert draft_graphs_off_reason("cpu") == "cpu is not a CUDA device"
