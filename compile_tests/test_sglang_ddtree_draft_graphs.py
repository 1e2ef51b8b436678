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
from kdtree_ops.sglang.draft_graphs import (DraftGraphs, capture_plan, draft_graphs_off_reason,  # noqa: E402
                                           draft_graphs_requested)
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
        host_bound = rng.choice([int(prefix.max()), int(prefix.max()) + rng.randrange(1, 9), None])  # exact, loose
        got = graphs.run(bonus, prefix, rows, host_bound, width)
        indptr, indices = prefix_kv(req_to_token, rows, prefix, None)
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
    assert graphs.run(three, three, torch.arange(3), 1, 8) is None  # larger than every size
    assert graphs.run(one, one, torch.arange(1), 1, 5) is None  # a width not captured
    assert graphs.run(one, one, torch.arange(1), 1, 8) is not None


def test_a_cpu_worker_drafts_eagerly():
    assert draft_graphs_off_reason("cpu") == "cpu is not a CUDA device"


def test_the_graphs_are_on_unless_turned_off(monkeypatch):
    monkeypatch.delenv("KDTREE_DDTREE_DRAFT_GRAPHS", raising=False)
    assert draft_graphs_requested()
    monkeypatch.setenv("KDTREE_DDTREE_DRAFT_GRAPHS", "0")
    assert draft_graphs_off_reason("cuda") == "KDTREE_DDTREE_DRAFT_GRAPHS=0"
    monkeypatch.setenv("KDTREE_DDTREE_DRAFT_GRAPHS", "on")
    with pytest.raises(ValueError, match=r"^KDTREE_DDTREE_DRAFT_GRAPHS must be 1 \(capture .*\) or 0 \(run it "
                                         r"eagerly\), got 'on'$"):
        draft_graphs_off_reason("cuda")


class _SGLangRunner:
    capture_bs = [1, 2, 4, 8]


def _bare_worker(monkeypatch, budgets: str | None):
    """A DDTreeWorker past its __init__ on a CUDA device, with SGLang's decode graphs captured at 1-8 requests."""
    from types import SimpleNamespace

    from kdtree_ops.sglang import ddtree_worker
    from kdtree_ops.sglang.ddtree_budgets import parse_budgets

    worker = ddtree_worker.DDTreeWorker.__new__(ddtree_worker.DDTreeWorker)
    worker.device, worker.num_tree_tokens, worker.topk = torch.device("cuda"), 16, TOPK
    worker.policy = parse_budgets(budgets, 16, TOPK, SlotDrafter.block_size) if budgets else None
    worker.drafter = SlotDrafter()
    worker.drafter.target_hidden_width = 12
    worker.model_runner = SimpleNamespace(decode_cuda_graph_runner=_SGLangRunner(), dtype=torch.bfloat16)
    worker.req_to_token_pool = SimpleNamespace(req_to_token=torch.zeros((4, 8), dtype=torch.int32))
    monkeypatch.setattr(ddtree_worker, "draft_graphs_off_reason", lambda device: None)
    captured = {}
    monkeypatch.setattr(ddtree_worker, "VerifyWidthGraphs", lambda runner, widths: captured.setdefault("widths", widths))
    monkeypatch.setattr(ddtree_worker, "DraftGraphs", lambda *args: captured.setdefault("plan", args[-1]))
    monkeypatch.setattr(ddtree_worker, "CommitGraphs", lambda drafter, rows, width, dtype, device:
                        captured.setdefault("rows", (rows, width, dtype)))
    return worker, captured


def test_the_worker_captures_sglang_s_sizes_at_each_width_the_policy_gives_them(monkeypatch):
    worker, captured = _bare_worker(monkeypatch, "1:16,2:4,8:1")
    worker.init_cuda_graphs()
    assert captured["widths"] == [1, 4]  # the verify at the narrower widths
    # the draft step where a round drafts: size 8 serves batches of 5-7 (4 tokens) and 8 (plain decode, no draft)
    assert captured["plan"] == [(1, 16), (2, 4), (4, 4), (8, 4)]
    # the drafter's K/V writes: depth + 1 rows a request (drafted positions: 4), one in plain decode (size 8: 8 rows)
    assert captured["rows"] == ([5, 8, 16, 32], 12, torch.bfloat16)
    worker, captured = _bare_worker(monkeypatch, None)
    worker.init_cuda_graphs()
    assert worker.verify_widths is None and captured["plan"] == [(1, 16), (2, 16), (4, 16), (8, 16)]
    assert captured["rows"][0] == [5, 10, 20, 40]


def test_a_failed_draft_capture_leaves_the_step_eager_and_says_so(monkeypatch, caplog):
    from kdtree_ops.sglang import ddtree_worker

    worker, _ = _bare_worker(monkeypatch, None)

    def capture_fails(*args):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(ddtree_worker, "DraftGraphs", capture_fails)
    with caplog.at_level("WARNING", logger=ddtree_worker.logger.name):
        worker.init_cuda_graphs()
    assert worker.draft_graphs is None and worker.commit_graphs is None
    assert "their CUDA graph capture failed (RuntimeError: operation not permitted" in caplog.text


def test_without_sglang_s_decode_graphs_every_round_runs_eagerly(monkeypatch, caplog):
    from kdtree_ops.sglang import ddtree_worker

    worker, captured = _bare_worker(monkeypatch, "1:16,2:4,8:1")
    worker.model_runner.decode_cuda_graph_runner = None
    with caplog.at_level("INFO", logger=ddtree_worker.logger.name):
        worker.init_cuda_graphs()
    assert captured == {} and worker.draft_graphs is None and worker.verify_widths is None
    assert "SGLang captured no decode CUDA graphs" in caplog.text
