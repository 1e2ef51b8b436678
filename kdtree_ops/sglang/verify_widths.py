"""Target verify CUDA graphs for DDTREE's narrower tree widths, so a round at any width of the budget policy replays.

SGLang captures the target's verify at one width, `--speculative-num-draft-tokens`; its runner refuses a batch of
another width (`DecodeCudaGraphRunner.can_run_graph`), which then runs eagerly. Under KDTREE_DDTREE_BUDGETS a large
batch verifies narrower trees, or the root alone (plain decode): exactly the batches where an eager forward costs
most against a non-speculative engine's graphs. SGLang's adaptive EAGLE answers the same need the same way
(`EAGLEWorkerV2.build_adaptive_runtime_state`): one more target attention backend and verify runner per width,
captured at start-up, and the model runner's pair swapped to the round's width. Here the swap lasts one verify
forward (`serving`), so every other forward (prefill, the launch width) sees SGLang's own pair.
"""

from __future__ import annotations

import contextlib
import logging
import time

from .draft_graphs import served_widths

logger = logging.getLogger(__name__)


def narrower_widths(launch_width: int, batch_sizes, width_for) -> list[int]:
    """The widths other than the launch width that the graphs of `batch_sizes` serve (draft_graphs.served_widths)."""
    return sorted({width for _, width in served_widths(batch_sizes, width_for)} - {launch_width})


class VerifyWidthGraphs:
    """A target attention backend and decode graph runner per narrower width (module docstring)."""

    def __init__(self, model_runner, widths: list[int]):
        self.model_runner = model_runner
        self.states: dict[int, tuple] = {}
        for width in widths:
            tic = time.perf_counter()
            self.states[width] = self._capture(width)
            logger.info("DDTREE verify CUDA graphs of %d-token trees: batch sizes %s, %.1f s", width,
                        list(self.states[width][1].capture_bs), time.perf_counter() - tic)

    def _capture(self, width: int) -> tuple:
        runner = self.model_runner
        saved_workspace = runner.init_new_workspace
        try:  # a backend of its own: capturing over SGLang's would reallocate the buffers its graphs read
            backend = runner._get_attention_backend(init_new_workspace=True)
        finally:
            runner.init_new_workspace = saved_workspace
        graph_runner = runner._decode_cuda_graph_runner_cls()(runner, attn_backend=backend,
                                                             speculative_num_draft_tokens=width)
        return backend, graph_runner

    @contextlib.contextmanager
    def serving(self, width: int):
        """The model runner's attention backend and decode graph runner of `width` for the block's forward (SGLang's
        own where the width has no graphs here)."""
        state = self.states.get(width)
        if state is None:
            yield
            return
        runner = self.model_runner
        saved = runner.attn_backend, runner.decode_cuda_graph_runner
        runner.attn_backend, runner.decode_cuda_graph_runner = state
        try:
            yield
        finally:
            runner.attn_backend, runner.decode_cuda_graph_runner = saved
