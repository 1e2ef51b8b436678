"""DDTREE's commit graphs (kdtree_ops/sglang/commit_graphs.py), their host logic on the CPU: which row counts are
captured, and that a commit served from a graph writes the drafter's cache as the eager write does: the rows copied
into the static buffers, the padding rows sent to the scratch slot, more rows than every capture left to the caller.
The graph is replaced by a replay that re-runs the captured write on the same static buffers (what a CUDA graph
replay does); the drafter is a stand-in whose K/V entry is a function of its row's hidden state and position, so a
wrong row, position, slot or padding changes the cache.
"""

from __future__ import annotations

import random

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from kdtree_ops.sglang.commit_graphs import CommitGraphs, commit_rows_plan  # noqa: E402

HIDDEN, SLOTS = 6, 300


class CacheDrafter:
    """materialize(): cache[slot] = (hidden row . weights) + 1000 * position, per row."""

    def __init__(self):
        self.scratch_slot = SLOTS
        self.cache = torch.full((SLOTS + 1,), -1.0, dtype=torch.float64)
        self.weights = torch.arange(1, HIDDEN + 1, dtype=torch.float64)

    def materialize(self, target_hidden, positions, slots):
        self.cache[slots] = target_hidden.to(torch.float64) @ self.weights + 1000.0 * positions


class ReplayedGraph:
    def __init__(self, write):
        self.write = write

    def replay(self):
        self.write()


class CpuCommitGraphs(CommitGraphs):
    def _capture(self, rows):
        self.captures.append(rows)
        self._write(rows)
        return ReplayedGraph(lambda: self._write(rows))

    def __init__(self, *args):
        self.captures = []
        super().__init__(*args)


def test_rows_plan_takes_each_size_s_depths_from_the_batches_it_serves():
    def depth(width):
        return min(15, width - 1)

    assert commit_rows_plan([4, 1, 2], lambda b: 64, depth) == [16, 32, 64]
    # 8 serves 5..8: trees of 16 tokens (depth 15) below 8, plain decode (one row a request) at 8
    widths = {1: 64, 2: 64, 3: 64, 4: 64, 5: 16, 6: 16, 7: 16, 8: 1}
    assert commit_rows_plan([1, 2, 4, 8], widths.get, depth) == [8, 16, 32, 64, 128]
    assert commit_rows_plan([1, 2], lambda b: 1, depth) == [1, 2]


@pytest.mark.parametrize("seed", range(5))
def test_a_commit_from_a_graph_writes_what_the_eager_write_does(seed):
    rng = random.Random(seed)
    graphed, eager = CacheDrafter(), CacheDrafter()
    graphs = CpuCommitGraphs(graphed, [2, 8, 32], HIDDEN, torch.float32, "cpu")
    assert graphs.captures == [32, 8, 2]  # the largest first
    for rows in (1, 2, 5, 8, 9, 32, 3):
        hidden = torch.randn(rows + 7, HIDDEN)  # the verify's rows; the commit writes a shuffled subset
        picked = torch.randperm(rows + 7, generator=torch.Generator().manual_seed(seed))[:rows]
        positions = torch.tensor([rng.randrange(0, 500) for _ in range(rows)])
        slots = torch.tensor(rng.sample(range(SLOTS), rows))
        slots[rng.randrange(rows)] = SLOTS  # a rejected row: to the scratch slot
        assert graphs.run(hidden, picked, positions, slots)
        eager.materialize(hidden[picked], positions, slots)
        assert torch.equal(graphed.cache[:SLOTS], eager.cache[:SLOTS]), rows
        padded = graphs.padded_rows(rows)
        assert (graphs.slots[rows:padded] == SLOTS).all()


def test_more_rows_than_every_capture_are_left_to_the_caller():
    drafter = CacheDrafter()
    graphs = CpuCommitGraphs(drafter, [4], HIDDEN, torch.float32, "cpu")
    before = drafter.cache.clone()
    assert not graphs.run(torch.ones(5, HIDDEN), torch.arange(5), torch.zeros(5, dtype=torch.int64), torch.arange(5))
    assert torch.equal(drafter.cache, before)
