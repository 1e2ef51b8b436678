"""`python -m kdtree_ops.bench.estimate BENCH_JSON [--out FILE]`: an estimate, never a measurement, of the kernels'
times on an RTX PRO 6000 Blackwell from a benchmark run under the 99 KB class's emulation on the H200
(KDTREE_OPS_EMULATE_ARCH=120: that class's configurations and code path under its limits).

Model: each call's bytes and FLOPs (from the run, floor.py) give the RTX PRO 6000's floor from NVIDIA's published
rates (1,792 GB/s GDDR7; 503.8 TFLOP/s dense bf16 with fp32 accumulation); the kernel is assumed to reach the same
fraction of its floor there as it did under emulation on the H200 (same configurations, 132 SMs against 188, HBM3e
against GDDR7, the L2 sizes and clocks ignored). The table says so above its numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RTX_PRO_6000 = {"name": "RTX PRO 6000 Blackwell (published: 1,792 GB/s, 503.8 TFLOP/s bf16 dense)",
                "bytes_per_s": 1.792e12, "flops_per_s": 503.8e12}


def estimate_rows(results: dict, target: dict = RTX_PRO_6000) -> list[dict]:
    """Per workload (and its fp8 column): the emulated time, its fraction of the H200 floor, the target's floor and
    the estimated time at the same fraction."""
    rows = []
    for w in results["workloads"]:
        for label, part in (("bf16", w), ("fp8", w.get("fp8"))):
            kdtree = (part or {}).get("impls", {}).get("kdtree", {})
            if not part or "median_us" not in kdtree or not kdtree.get("correct"):
                continue
            floor = part["floor"]
            fraction = floor["floor_us"] / kdtree["median_us"]
            target_floor = max(floor["bytes"] / target["bytes_per_s"], floor["flops"] / target["flops_per_s"]) * 1e6
            rows.append({"name": w["name"], "cache": label, "emulated_us": kdtree["median_us"],
                         "fraction_of_floor": fraction, "target_floor_us": target_floor,
                         "estimate_us": target_floor / fraction})
    return rows


def markdown(results: dict, rows: list[dict], target: dict = RTX_PRO_6000) -> str:
    env = results.get("environment", {})
    lines = [f"Estimate for the {target['name']}, not a measurement: the 99 KB class's configurations ran under "
             f"emulation on {env.get('device', '?')} (commit {str(env.get('commit', '?'))[:12]}, {env.get('date', '?')}),"
             " each workload's fraction of its floor carried over to the target's floor.", "",
             "| workload | KV cache | emulated µs (H200) | % of H200 floor | RTX PRO 6000 floor µs | estimate µs |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['cache']} | {r['emulated_us']:.1f} | {100 * r['fraction_of_floor']:.0f} % | "
                     f"{r['target_floor_us']:.1f} | {r['estimate_us']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kdtree_ops.bench.estimate", description=__doc__.splitlines()[0])
    p.add_argument("bench_json", help="bench.json of a run under KDTREE_OPS_EMULATE_ARCH=120")
    p.add_argument("--out", default=None, help="where to write the table (default: estimate.md beside the JSON)")
    args = p.parse_args(argv)
    path = Path(args.bench_json)
    results = json.loads(path.read_text())
    table = markdown(results, estimate_rows(results))
    out = Path(args.out) if args.out else path.with_name("estimate.md")
    out.write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
