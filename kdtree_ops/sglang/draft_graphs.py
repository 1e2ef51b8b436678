"""CUDA graphs of DDTREE's draft step: the DFlash block forward and the tree build, one graph per batch size and
tree width, replayed in place of ~20 eager launches a draft layer.

SGLang replays the target's verify forward from its graphs, and DFLASH its draft forward from its own; an eager
drafter leaves the GPU waiting on the host between its small kernels at small batches. These graphs hold
`DFlashDrafter.propose` (embedding, the draft layers with their attention through the verify op, the head's top-k)
and `ddtree.build_tree`, captured at start-up (`DDTreeWorker.init_cuda_graphs`, which the scheduler calls after the
target's graphs) for SGLang's decode batch sizes, each with the tree widths the budget policy gives the batch sizes
it serves. A round of b requests replays the smallest captured size >= b: its inputs are copied into static buffers
(rows past b: token 0 at position 0 with an empty prefix, whose outputs are dropped) and its outputs are views of
the first b rows. The committed slots (`prefix_kv`) are gathered straight into the static buffer, sized for the
widest context a batch can hold. A batch larger than every captured size, or a width no graph holds, runs eagerly.

Capture-safe by construction: no host sync, shapes from (batch size, width) only, the block mask of each size made
before its capture. On by default (KDTREE_DDTREE_DRAFT_GRAPHS=0 runs the step eagerly); off where SGLang captured no
decode graphs, and under tensor parallelism (the head's top-k exchanges candidates across ranks outside SGLang's
graph-capture context).
"""

from __future__ import annotations

import logging

import torch

from .. import ddtree
from .verify_metadata import prefix_kv

logger = logging.getLogger(__name__)

# On by default since the GPU engine suite's greedy check passed them (examples/results/2026-12-07-h100, call-2). On an
# H200 the replayed step took 1.97 ms a round at 32 requests against the eager 4.32 (2026-12-06-b32-split).
GRAPHS_ENV = "KDTREE_DDTREE_DRAFT_GRAPHS"


def draft_graphs_requested() -> bool:
    """KDTREE_DDTREE_DRAFT_GRAPHS: 1 (the default) captures the draft step where it can, 0 runs it eagerly."""
    from .ddtree_algorithm import env_switch

    return env_switch(GRAPHS_ENV, "1", "capture DDTREE's draft step in CUDA graphs", "run it eagerly")


def draft_graphs_off_reason(device) -> str | None:
    """Why the draft step runs eagerly in this process where SGLang's decode graphs are on, or None."""
    if torch.device(device).type != "cuda":
        return f"{torch.device(device).type} is not a CUDA device"
    if not draft_graphs_requested():
        return f"{GRAPHS_ENV}=0"
    from sglang.srt.runtime_context import get_parallel

    if int(get_parallel().tp_size) > 1:
        return "tensor parallelism (the head's top-k exchanges candidates across ranks)"
    return None


def served_widths(batch_sizes, width_for) -> list[tuple[int, int]]:
    """(padded batch size, tree width) pairs a graph of each size serves: every width `width_for(b)` gives a batch b
    it holds (those above the next smaller size, up to itself), plain decode (1) included."""
    pairs, below = [], 0
    for size in sorted(set(int(b) for b in batch_sizes)):
        pairs += [(size, width) for width in sorted({width_for(b) for b in range(below + 1, size + 1)})]
        below = size
    return pairs


def capture_plan(batch_sizes, width_for) -> list[tuple[int, int]]:
    """(padded batch size, tree width) pairs to capture: those served_widths gives where a round drafts (width > 1)."""
    return [(size, width) for size, width in served_widths(batch_sizes, width_for) if width > 1]


def capture_step(step, pool):
    """(graph, step()'s outputs, memory pool) of `step` captured on a side stream after one warm-up run there
    (lazy initialisation, library handles, anything the step makes once and its replays read); `pool` None makes a
    pool, which the caller passes to its later captures so they share its blocks (capture the largest first)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    pool = torch.cuda.graph_pool_handle() if pool is None else pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        outputs = step()
    return graph, outputs, pool


class DraftGraphs:
    """The captured draft steps of one worker (module docstring)."""

    def __init__(self, drafter, topk: int, req_to_token: torch.Tensor, plan: list[tuple[int, int]]):
        self.drafter, self.topk, self.req_to_token = drafter, topk, req_to_token
        self.sizes = sorted({size for size, _ in plan})
        max_bs, device = self.sizes[-1], req_to_token.device
        self.max_context = int(req_to_token.shape[1])
        self.bonus = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.prefix = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.pool_rows = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        # prefix_kv's [B, max_len] gather lands its masked columns on the last entry
        self.kv_indices = torch.zeros(max_bs * self.max_context + 1, dtype=torch.int32, device=device)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, tuple]] = {}
        self.memory_pool = None  # the first capture's pool, shared by the rest
        for size, width in sorted(plan, reverse=True):  # the largest first: the pool's blocks serve the rest
            self.graphs[(size, width)] = self._capture(size, width)
        logger.info("DDTREE draft CUDA graphs: %d captured (batch sizes %s; tree widths %s)", len(self.graphs),
                    self.sizes, sorted({w for _, w in plan}))

    def _step(self, size: int, width: int) -> tuple:
        logprobs, candidates = self.drafter.propose(self.bonus[:size], self.prefix[:size], self.kv_indptr[: size + 1],
                                                    self.kv_indices, self.topk)
        return ddtree.build_tree(logprobs, candidates, self.bonus[:size], width - 1)

    def _capture(self, size: int, width: int):
        # the warm-up also makes the size's block mask, which every replay reads
        graph, outputs, self.memory_pool = capture_step(lambda: self._step(size, width), self.memory_pool)
        return graph, outputs

    def padded_size(self, batch_size: int) -> int | None:
        return next((size for size in self.sizes if size >= batch_size), None)

    def run(self, bonus: torch.Tensor, prefix: torch.Tensor, req_pool_indices: torch.Tensor, host_bound: int | None,
            width: int):
        """The tree of a round (build_tree's outputs, the first b rows) from its graph, or None where no graph
        holds (b, width): the caller runs the step eagerly. host_bound: an upper bound on the prefix lengths known
        on the host (verify_metadata.host_length_bound), or None: it sizes the prefix gather (else the table's
        width)."""
        b = bonus.shape[0]
        size = self.padded_size(b)
        entry = self.graphs.get((size, width)) if size is not None else None
        if entry is None:
            return None
        graph, (tree_tokens, parents, depths, tree_mask) = entry
        self.bonus[:b].copy_(bonus)
        self.prefix[:b].copy_(prefix)
        self.pool_rows[:b].copy_(req_pool_indices)
        if size > b:  # padding rows: an empty prefix (their indptr entries repeat the last request's end)
            self.bonus[b:size].zero_()
            self.prefix[b:size].zero_()
        prefix_kv(self.req_to_token, self.pool_rows[:size], self.prefix[:size], host_bound, self.kv_indptr,
                  self.kv_indices, max_context_len=self.max_context)
        graph.replay()
        return tree_tokens[:b], parents[:b], depths[:b], tree_mask[: b * width]
