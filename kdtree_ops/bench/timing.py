"""Device time of one call: the median over samples of CUDA-graph replays.

Each implementation's call is captured once per input set into ONE torch.cuda.CUDAGraph (K calls, one per
set), so host launch cost and Python never enter the measurement. When one set's bytes fit in L2, K sets
(copies of the inputs at other addresses) are rotated so that every call reads from HBM, as in a model's
forward where each layer's KV is cold: K = ceil(3 · L2 size / bytes per set), at most 16.
A sample is: a GPU sleep (so the host queues the replays ahead of the GPU), event, `reps` replays, event;
time per call = elapsed / (reps · K). The result is the median (and p10/p90) over `samples` samples.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Sequence

import torch

__all__ = ["environment", "rotation_sets", "time_calls"]


def rotation_sets(bytes_per_set: int, max_sets: int = 16) -> int:
    """Input sets to rotate through so that the working set is 3x the L2 cache."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(1, min(max_sets, math.ceil(3 * l2 / max(1, bytes_per_set))))


def _sleep_cycles(seconds: float) -> int:
    khz = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "clock_rate", 0) or 2_000_000
    return int(seconds * khz * 1e3)


def time_calls(calls: Sequence[Callable[[], object]], *, samples: int = 30, target_ms: float = 1.0,
               max_reps: int = 50) -> dict:
    """Median device µs per call of `calls` (one per rotated input set) replayed from one CUDA graph.

    Returns {median_us, p10_us, p90_us, reps, sets, samples}.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (Triton autotune/compile, cuBLAS handles) off the capture
        for _ in range(2):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    once_ms = max(start.elapsed_time(end), 1e-3)
    reps = max(1, min(max_reps, round(target_ms / once_ms)))

    per_call_us = []
    for _ in range(samples):
        torch.cuda._sleep(_sleep_cycles(min(2e-3, 20e-6 * reps)))  # room for the host to queue `reps` replays
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        per_call_us.append(start.elapsed_time(end) * 1e3 / (reps * len(calls)))
    del graph
    per_call_us.sort()
    pick = lambda f: per_call_us[min(len(per_call_us) - 1, int(f * len(per_call_us)))]  # noqa: E731
    return {"median_us": pick(0.5), "p10_us": pick(0.1), "p90_us": pick(0.9), "reps": reps, "sets": len(calls),
            "samples": samples}


@contextlib.contextmanager
def environment(**values: str):
    """The variables set to `values` inside the block, restored after it (the op reads its switches at each call, so
    at a graph's capture: a timed path is chosen by the environment it was captured under)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
