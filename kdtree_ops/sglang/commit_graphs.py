"""CUDA graphs of the drafter's K/V writes in DDTREE's commit: `DFlashDrafter.materialize` (the projection of the
target's hidden states, then per draft layer its K/V projection, norm, rotary and the cache write), one graph per
row count, replayed in place of its ~8 eager launches a draft layer.

Every round ends by writing the drafter's K/V of the positions it committed: max_depth + 1 rows a request (one in a
plain-decode round). Eagerly that is a fixed run of small launches whatever the batch; on an H200 the commit phase
took 1.4 ms of a 14 ms plain-decode round at 32 requests (examples/results/2026-12-06-b32-split), about as much as the
work itself at that size is worth. Captured at start-up (`DDTreeWorker.init_cuda_graphs`) for row counts b * (depth
+ 1) over SGLang's decode batch sizes b and the depths of the widths the budget policy gives them; a round of R rows
replays the smallest captured count >= R: its rows are gathered into static buffers, the rows past R write the
drafter's scratch slot (never read). More rows than every capture run eagerly.

Capture-safe by construction (no host sync; shapes from the row count only). Under the same switch as the draft
step's graphs (draft_graphs.py: KDTREE_DDTREE_DRAFT_GRAPHS).
"""

from __future__ import annotations

import logging

import torch

from .draft_graphs import capture_step, served_widths

logger = logging.getLogger(__name__)


def commit_rows_plan(batch_sizes, width_for, max_depth) -> list[int]:
    """Row counts to capture: size * (max_depth(width) + 1) for each (size, width) a graph serves
    (draft_graphs.served_widths); plain decode (width 1) is one row a request."""
    return sorted({size * (max_depth(width) + 1) for size, width in served_widths(batch_sizes, width_for)})


class CommitGraphs:
    """The captured drafter K/V writes of one worker (module docstring)."""

    def __init__(self, drafter, row_counts: list[int], hidden_width: int, dtype: torch.dtype, device):
        self.drafter = drafter
        self.row_counts = sorted(set(row_counts))
        most = self.row_counts[-1]
        self.hidden = torch.zeros((most, hidden_width), dtype=dtype, device=device)
        self.positions = torch.zeros(most, dtype=torch.int64, device=device)
        self.slots = torch.full((most,), drafter.scratch_slot, dtype=torch.int64, device=device)
        self.memory_pool = None
        self.graphs = {rows: self._capture(rows) for rows in reversed(self.row_counts)}  # largest first: one pool
        logger.info("DDTREE commit CUDA graphs: %d captured (rows %s)", len(self.graphs), self.row_counts)

    def _write(self, rows: int) -> None:
        self.drafter.materialize(self.hidden[:rows], self.positions[:rows], self.slots[:rows])

    def _capture(self, rows: int):
        graph, _, self.memory_pool = capture_step(lambda: self._write(rows), self.memory_pool)
        return graph

    def padded_rows(self, rows: int) -> int | None:
        return next((count for count in self.row_counts if count >= rows), None)

    def run(self, hidden_states: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
            slots: torch.Tensor) -> bool:
        """materialize(hidden_states[rows], positions, slots) from a graph, gathering the rows straight into its
        static buffer; False where none holds that many rows (the caller writes eagerly)."""
        count = rows.shape[0]
        padded = self.padded_rows(count)
        if padded is None:
            return False
        torch.index_select(hidden_states, 0, rows, out=self.hidden[:count])
        self.positions[:count].copy_(positions)
        self.slots[:count].copy_(slots)
        if padded > count:  # the replay's extra rows: to the scratch slot, whatever their hidden states
            self.positions[count:padded].zero_()
            self.slots[count:padded].fill_(self.drafter.scratch_slot)
        self.graphs[padded].replay()
        return True
