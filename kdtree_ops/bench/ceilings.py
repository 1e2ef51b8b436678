"""The machine's ceilings, measured in the same run as the kernels (same clocks, same driver state):

- read bandwidth: the faster of two read streams over 1 GiB (a float32 sum and a max), bytes read per second:
  what the floor divides the bytes a call reads by (the copy's rate, 2.77 TB/s counted read + write in the run of
  2026-12-01, read low for kernels that only read: G3/G4 printed 117 %/136 % of that "floor");
- copy bandwidth: a 1 GiB device-to-device copy, bytes read + written per second (reported beside it);
- bf16 matmul rate: torch.matmul of random 8192 x 8192 bf16 matrices, 2·8192³ FLOPs per call.

Both timed like the kernels (timing.time_calls: medians of CUDA-graph replays).
"""

from __future__ import annotations

import torch

from .timing import time_calls

__all__ = ["measure_ceilings"]


def measure_ceilings(copy_bytes: int = 1 << 30, matmul_n: int = 8192, samples: int = 20) -> dict:
    """{read_bytes_per_s, read_us, copy_bytes_per_s, copy_us, matmul_flops_per_s, matmul_us, copy_bytes, matmul_n}."""
    src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy = time_calls([lambda: dst.copy_(src)], samples=samples, target_ms=5.0, max_reps=10)
    del dst
    values = torch.randn(copy_bytes // 4, device="cuda")
    total, peak = torch.empty((), device="cuda"), torch.empty((), device="cuda")
    reads = [time_calls([call], samples=samples, target_ms=5.0, max_reps=10)["median_us"]
             for call in (lambda: torch.sum(values, dim=0, out=total), lambda: torch.amax(values, dim=0, out=peak))]
    del src, values

    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16, generator=gen)
    c = torch.empty_like(a)
    mm = time_calls([lambda: torch.matmul(a, b, out=c)], samples=samples, target_ms=10.0, max_reps=10)
    del a, b, c
    torch.cuda.empty_cache()
    return {
        "copy_bytes": copy_bytes,
        "read_us": min(reads),
        "read_bytes_per_s": copy_bytes / (min(reads) * 1e-6),
        "copy_us": copy["median_us"],
        "copy_bytes_per_s": 2 * copy_bytes / (copy["median_us"] * 1e-6),
        "matmul_n": matmul_n,
        "matmul_us": mm["median_us"],
        "matmul_flops_per_s": 2 * matmul_n**3 / (mm["median_us"] * 1e-6),
    }
