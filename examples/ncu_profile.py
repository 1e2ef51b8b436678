"""Where a verify call's time goes: Nsight Compute on one tree_verify_attention kernel per workload and cache.

    python examples/ncu_profile.py --out DIR [--workloads G2,M5] [--ncu ncu]   # runs ncu, a process per case
    python examples/ncu_profile.py --case G2 fp8-overlap                      # the process ncu profiles
    python examples/ncu_profile.py --out DIR --summarize                      # DIR/ncu.md again from its CSVs

The cases of each bench workload (kdtree_ops/bench/workloads.py): `bf16` (a bf16 cache), `fp8-widen` (an e4m3
cache by the default fp8 path) and `fp8-overlap` (by KDTREE_OPS_FP8_PATH=overlap, unverified: the gate is lifted
for the profile). The profiled process makes WARMUP calls, then one more: ncu skips the warm-up calls' verify
kernels and profiles the last (SpeedOfLight, plus the warp-stall and shared-memory counters). Writes
DIR/<workload>-<case>.csv (ncu's raw page) and DIR/ncu.md: per case the kernel's duration (µs), DRAM and SM throughput
(% of peak), shared-memory wavefronts and bank conflicts, and its largest warp-stall reasons (warps stalled per
issued instruction). The GPU suite's `bench` part runs it (stage `ncu`).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

CASES = ("bf16", "fp8-widen", "fp8-overlap")
WARMUP = 2
CASE_TIMEOUT_S = 180  # ncu replays the kernel once per counter pass: seconds, unless the kernel hangs
KERNEL = "regex:tree_verify_attention_kernel"
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
METRICS = ",".join([f"regex:{STALL_PREFIX}.*{STALL_SUFFIX.replace('.', '[.]')}",
                    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
                    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"])
COLUMNS = {  # the table's column -> the ncu raw metrics that give it, the first present wins (ncu versions differ)
    "duration µs": ("gpu__time_duration.sum",),
    "DRAM %": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "SM %": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "smem wavefronts": ("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",),
    "smem bank conflicts": ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",),
}
TO_MICROSECONDS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
UNITS = "units"  # a kernel's key holding its metrics' units (read_raw)


def run_case(workload: str, case: str) -> None:
    """The profiled process: WARMUP + 1 calls of the op on the workload's inputs."""
    import torch

    from kdtree_ops.bench.baselines import IMPLEMENTATIONS
    from kdtree_ops.bench.workloads import WORKLOADS

    kv_dtype = None if case == "bf16" else torch.float8_e4m3fn
    inputs = WORKLOADS[workload].case(device="cuda", kv_dtype=kv_dtype)
    call = IMPLEMENTATIONS["kdtree_fp8_overlap" if case == "fp8-overlap" else "kdtree"](inputs)
    for _ in range(WARMUP + 1):
        call()
    torch.cuda.synchronize()


def read_raw(path: Path) -> list[dict]:
    """ncu's `--page raw --csv`: a header row of metric names, a row of units, then a row per profiled kernel. Each
    kernel is a dict of metric -> text, with the units row under UNITS."""
    rows = list(csv.reader(path.read_text().splitlines()))
    start = next((i for i, row in enumerate(rows) if row and row[0] == "ID"), None)
    if start is None:
        return []
    header, body = rows[start], rows[start + 1:]
    units = dict(zip(header, body[0])) if body and not (body[0] and body[0][0].strip().isdigit()) else {}
    return [{**dict(zip(header, row)), UNITS: units} for row in body if row and row[0].strip().isdigit()]


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def summarize(kernel: dict, stalls: int = 4) -> dict:
    """The table's cells of one profiled kernel: COLUMNS (the duration in µs, by its unit), then its largest stall
    reasons."""
    cells = {}
    for column, metrics in COLUMNS.items():
        metric = next((m for m in metrics if m in kernel), None)
        value = _number(kernel[metric]) if metric else None
        if value is not None and column == "duration µs":
            value *= TO_MICROSECONDS.get(kernel.get(UNITS, {}).get(metric, "usecond"), 1.0)
        cells[column] = value
    reasons = [(name[len(STALL_PREFIX):-len(STALL_SUFFIX)], _number(value)) for name, value in kernel.items()
               if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX)]
    reasons = sorted((r for r in reasons if r[1] is not None), key=lambda r: -r[1])[:stalls]
    cells["stalls"] = ", ".join(f"{name} {value:.2f}" for name, value in reasons)
    return cells


def summarize_dir(out: Path, workloads: list[str]) -> dict:
    """(workload, case) -> summarize()'s cells of the CSVs in `out` (the last kernel of each), or why none."""
    results = {}
    for workload in workloads:
        for case in CASES:
            path = out / f"{workload}-{case}.csv"
            kernels = read_raw(path) if path.exists() else []
            results[(workload, case)] = summarize(kernels[-1]) if kernels else f"no kernel in {path.name}"
    return results


def _cell(value: float | None) -> str:
    if value is None:
        return ""
    return f"{int(value):,}" if value.is_integer() else f"{value:.4g}"


def markdown(results: dict) -> str:
    """results: (workload, case) -> summarize()'s cells, or an error string."""
    columns = [*COLUMNS, "stalls"]
    lines = ["| workload | case | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for (workload, case), cells in results.items():
        if isinstance(cells, str):
            lines.append(f"| {workload} | {case} | {cells} |")
            continue
        text = [v if k == "stalls" else _cell(v) for k, v in cells.items()]
        lines.append(f"| {workload} | {case} | " + " | ".join(text) + " |")
    return "\n".join(lines) + "\n"


def profile(out: Path, workloads: list[str], ncu: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    results, status = {}, 0
    for workload in workloads:
        for case in CASES:
            csv_path = out / f"{workload}-{case}.csv"
            cmd = [ncu, "--csv", "--page", "raw", "--section", "SpeedOfLight", "--metrics", METRICS, "-k", KERNEL,
                   "--launch-skip", str(WARMUP), "--launch-count", "1", sys.executable, __file__, "--case",
                   workload, case]
            env = dict(os.environ, KDTREE_OPS_UNVERIFIED="1")
            try:
                run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=CASE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                status, results[(workload, case)] = 1, f"no profile in {CASE_TIMEOUT_S} s"
                continue
            csv_path.write_text(run.stdout)
            kernels = read_raw(csv_path)
            if run.returncode or not kernels:
                status = 1
                results[(workload, case)] = f"ncu exit {run.returncode}: {(run.stderr or run.stdout)[-300:]!r}"
            else:
                results[(workload, case)] = summarize(kernels[-1])
            print(f"{workload} {case}: {results[(workload, case)]}", flush=True)
    text = markdown(results)
    (out / "ncu.md").write_text(text)
    print(text)
    return status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--workloads", default="G2,M5")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--case", nargs=2, metavar=("WORKLOAD", "CASE"))
    ap.add_argument("--summarize", action="store_true", help="rebuild DIR/ncu.md from the CSVs in --out, no ncu")
    args = ap.parse_args()
    if args.case:
        from kdtree_ops.bench.workloads import WORKLOADS

        if args.case[1] not in CASES or args.case[0].upper() not in WORKLOADS:
            ap.error(f"--case WORKLOAD CASE: one of {', '.join(WORKLOADS)} and one of {', '.join(CASES)}")
        run_case(args.case[0].upper(), args.case[1])
        return 0
    if not args.out:
        ap.error("--out is needed (or --case WORKLOAD CASE, the profiled process)")
    workloads = [w.strip().upper() for w in args.workloads.split(",")]
    if args.summarize:
        text = markdown(summarize_dir(Path(args.out), workloads))
        (Path(args.out) / "ncu.md").write_text(text)
        print(text)
        return 0
    return profile(Path(args.out), workloads, args.ncu)


if __name__ == "__main__":
    sys.exit(main())
