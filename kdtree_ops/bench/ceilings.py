"""The machine's ceilings, measured in the same run as the kernels (same clocks, same driver state):

- copy bandwidth: a 1 GiB device-to-device copy, bytes read + written per second;
- bf16 matmul rate: torch.matmul of random 8192 x 8192 bf16 matrices, 2·8192³ FLOPs per call.

Both timed like the kernels (timing.time_calls: medians of CUDA-graph replays).
"""

from __future__ import annotations

import torch

from .timing import time_calls

__all__ = ["measure_ceilings"]


def measure_ceilings(copy_bytes: int = 1 << 30, matmul_n: int = 8192, samples: int = 20) -> dict:
    """{copy_bytes_per_s, copy_us, matmul_flops_per_s, matmul_us, copy_bytes, matmul_n}."""
    src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy = time_calls([lambda: dst.copy_(src)], samples=samples, target_ms=5.0, max_reps=10)
    del src, dst

    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16, generator=gen)
    c = torch.empty_like(a)
    mm = time_calls([lambda: torch.matmul(a, b, out=c)], samples=samples, target_ms=10.0, max_reps=10)
    del a, b, c
    torch.cuda.empty_cache()
    return {
        "copy_bytes": copy_bytes,
        "copy_us": copy["median_us"],
        "copy_bytes_per_s": 2 * copy_bytes / (copy["median_us"] * 1e-6),
        "matmul_n": matmul_n,
        "matmul_us": mm["median_us"],
        "matmul_flops_per_s": 2 * matmul_n**3 / (mm["median_us"] * 1e-6),
    }
