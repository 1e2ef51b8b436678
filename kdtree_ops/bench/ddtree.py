"""`python -m kdtree_ops bench --ddtree [--out DIR]`: the DDTree round's build and accept ops on the GPU beside
the host heap algorithm (DDTree's reference approach), timed in the same run.

Rows: B in {1, 8, 32}, K = 16, top-k in {8, 32}, budget in {16, 64, 256, 1024}. GPU columns are median µs per
call under CUDA-graph replay (timing.py: one graph, replays queued behind a GPU sleep). The build column is the
level-synchronous build (csrc/cuda/ddtree_build_levels.cu), timed with its gate lifted (KDTREE_OPS_UNVERIFIED=1
for those calls only: a bench measures the kernel whether or not the GPU suite has passed it yet); the kernel column
says which kernel that column's calls ran ("serial" where the level build does not take the shape and the op falls
back). The serial column is the serial one-warp kernel on the same inputs (KDTREE_OPS_SERIAL_TREE_BUILD=1). The
heap column is the
median wall time of the host algorithm for the whole batch (ddtree.reference.best_first_paths_heap per request,
then its tokens and parents), from log-probs already in host lists: the copy to the host, the sync and the
copy of the tree back that a host build also needs are not counted, so the speedup is a lower bound.
The CPU op column is this library's C++ kernel (csrc/cpu/ddtree.cpp) on the same inputs. Targets (issue 29):
build <= 20 µs and accept <= 5 µs at B = 1, budget 256; build >= 100x the heap at budget 1024; (issue 46)
the level-synchronous build <= 20 µs at budget 256 and <= 60 µs at 1024.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from .timing import environment

__all__ = ["ddtree_inputs", "ddtree_rows", "ddtree_markdown", "main"]

BATCHES = (1, 8, 32)
POSITIONS = 16
TOP_KS = (8, 32)
BUDGETS = (16, 64, 256, 1024)


def ddtree_inputs(batch: int, positions: int, top_k: int, budget: int, *, seed: int = 0, device: str = "cpu"):
    """A drafter's top-k (log-softmax of random logits, peaked like a trained drafter's), a built tree and
    target tokens that follow a child of each node with probability 0.8: (build args, accept args)."""
    from ..ddtree import ops as ddtree

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, positions, 4 * top_k, generator=gen) * 3
    logprobs = torch.log_softmax(logits, -1).topk(top_k, dim=-1).values.contiguous()
    tokens = torch.randint(0, 32000, (batch, positions, top_k), generator=gen)
    roots = torch.randint(0, 32000, (batch,), generator=gen)
    tree_tokens, parents, _, _ = ddtree.build_tree(logprobs, tokens, roots, budget)  # CPU op: the tree to walk
    target = torch.randint(0, 32000, tree_tokens.shape, generator=gen)
    child = torch.full(tree_tokens.shape, -1, dtype=torch.int64)
    for b, i in itertools.product(range(batch), range(tree_tokens.shape[1] - 1, 0, -1)):
        child[b, parents[b, i]] = i  # the first child in node order, written last
    follow = (child >= 0) & (torch.rand(tree_tokens.shape, generator=gen) < 0.8)
    target = torch.where(follow, torch.gather(tree_tokens, 1, child.clamp_min(0)), target)
    to = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    return to(logprobs, tokens, roots) + [budget], to(tree_tokens, parents, target) + [positions]


def _host_heap_us(logprobs: torch.Tensor, tokens: torch.Tensor, roots: torch.Tensor, budget: int, reps: int):
    from ..ddtree.reference import best_first_paths_heap, tree_from_paths

    lp, tok, root = logprobs.tolist(), tokens.tolist(), roots.tolist()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for b in range(len(lp)):
            tree_from_paths(best_first_paths_heap(lp[b], budget), tok[b], root[b])
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def _tree_build(kernel: str):
    """The op's CUDA tree build set to one kernel while inside: "levels" (KDTREE_OPS_UNVERIFIED=1 lifts its gate,
    KDTREE_OPS_SERIAL_TREE_BUILD=0) or "serial" (KDTREE_OPS_SERIAL_TREE_BUILD=1)."""
    return environment(**{"levels": {"KDTREE_OPS_UNVERIFIED": "1", "KDTREE_OPS_SERIAL_TREE_BUILD": "0"},
                          "serial": {"KDTREE_OPS_SERIAL_TREE_BUILD": "1"}}[kernel])


def _build_kernel(call) -> str:
    """"levels" or "serial": which CUDA kernel one call of the op ran (by the profiler's kernel names)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return "levels" if any("build_levels_kernel" in e.name for e in prof.events()) else "serial"


def _cpu_op_us(call, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def ddtree_rows(batches=BATCHES, top_ks=TOP_KS, budgets=BUDGETS, positions: int = POSITIONS, *, samples: int = 30,
                host_reps: int = 3, gpu: bool | None = None, seed: int = 0) -> list[dict]:
    """One row per (B, top-k, budget): GPU build/accept µs (graph replay; None without a GPU or gpu=False),
    the host heap's µs for the batch, the CPU op's µs, and the heap / GPU build speedup."""
    from ..ddtree import ops as ddtree

    gpu = torch.cuda.is_available() if gpu is None else gpu
    rows = []
    for batch, top_k, budget in itertools.product(batches, top_ks, budgets):
        build_args, accept_args = ddtree_inputs(batch, positions, top_k, budget, seed=seed)
        row = {"B": batch, "K": positions, "top_k": top_k, "budget": budget,
               "heap_us": _host_heap_us(*build_args, reps=host_reps),
               "cpu_op_build_us": _cpu_op_us(lambda: ddtree.build_tree(*build_args), host_reps),
               "build_us": None, "build_kernel": None, "serial_build_us": None, "accept_us": None}
        if gpu:
            from .timing import time_calls

            cuda_build = [a.cuda() if isinstance(a, torch.Tensor) else a for a in build_args]
            cuda_accept = [a.cuda() if isinstance(a, torch.Tensor) else a for a in accept_args]
            build = lambda: ddtree.build_tree(*cuda_build)  # noqa: E731
            with _tree_build("levels"):
                row["build_kernel"] = _build_kernel(build)
                row["build_us"] = time_calls([build], samples=samples)["median_us"]
            with _tree_build("serial"):
                row["serial_build_us"] = time_calls([build], samples=samples)["median_us"]
            row["accept_us"] = time_calls([lambda: ddtree.accept_greedy(*cuda_accept)], samples=samples)["median_us"]
        row["heap_over_build"] = row["heap_us"] / row["build_us"] if row["build_us"] else None
        rows.append(row)
        print(f"[ddtree] B={batch} k={top_k} budget={budget}: " + ", ".join(
            f"{k} {v:.1f}" for k, v in row.items() if k.endswith(("_us", "_build")) and v is not None), flush=True)
    return rows


def ddtree_markdown(rows: list[dict]) -> str:
    fmt = lambda v, spec=".1f": "—" if v is None else format(v, spec)  # noqa: E731
    lines = ["| B | K | top-k | budget | level build µs (GPU) | kernel | serial build µs (GPU) | accept µs (GPU) | "
             "host heap µs | CPU op build µs | heap / GPU build |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['B']} | {r['K']} | {r['top_k']} | {r['budget']} | {fmt(r['build_us'])} | "
                     f"{r.get('build_kernel') or '—'} | {fmt(r.get('serial_build_us'))} | {fmt(r['accept_us'])} | {fmt(r['heap_us'], '.0f')} | {fmt(r['cpu_op_build_us'], '.0f')} | "
                     f"{fmt(r['heap_over_build'], '.0f')} |")
    return "\n".join(lines)


def main(args) -> int:
    """The --ddtree mode of the bench CLI: writes ddtree.md and ddtree.json under args.out."""
    if not torch.cuda.is_available():
        print("kdtree_ops bench --ddtree: needs a CUDA device", file=sys.stderr)
        return 2
    from .. import ops  # noqa: F401  (builds and loads the library before anything is timed)
    from .report import environment

    env = environment()
    print(f"[ddtree] {env.get('device')} torch {env['torch']} commit {env['commit'][:12]}", flush=True)
    rows = ddtree_rows(samples=args.samples, seed=args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = ddtree_markdown(rows)
    (out / "ddtree.md").write_text(f"{__doc__.splitlines()[0]}\n\n{json.dumps(env)}\n\n{table}\n")
    (out / "ddtree.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    print(table)
    print(f"[ddtree] wrote {out / 'ddtree.md'}, {out / 'ddtree.json'}", flush=True)
    return 0
