"""`python -m kdtree_ops bench [--only G1,M3] [--out DIR]`: check, time and report every implementation.

For each workload: build the inputs (bf16, random DDTree-like trees, fragmented slots), compute the float64
reference, check each implementation against it (relative L2 error < 1e-2, no non-finite output), then
time it (timing.py) and compare with the floor (floor.py) from ceilings measured at the start of the run.
An implementation that fails the check is still timed and marked ✗; one that raises is reported with its
error. Exit status 0 when kdtree ran and passed on every selected workload, else 1 (2: no CUDA).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback

import torch

__all__ = ["main"]

REL_L2_TOLERANCE = 1e-2  # bf16 inputs and output: ~4e-3 expected from rounding alone


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kdtree_ops bench", description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated workloads, e.g. G1,M3 (default: all)")
    p.add_argument("--out", default="bench_results", help="directory for bench.md, bench.json, bench.png")
    p.add_argument("--impls", default="kdtree,sglang_triton,torch_sdpa",
                   help="comma-separated implementations (default: all available)")
    p.add_argument("--samples", type=int, default=30, help="timing samples per implementation (median taken)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ddtree", action="store_true", help="the DDTree round's build/accept ops instead (bench/ddtree.py)")
    return p


def _clone_inputs(case):
    """The case's float tensors copied to new addresses (aliases kept): another input set for L2 rotation."""
    def alias_or_clone(view, base, base_clone):
        if view is None:
            return None
        if view.data_ptr() == base.data_ptr():
            return base_clone.as_strided(view.shape, view.stride(), base_clone.storage_offset())
        return view.clone()

    k_cache = case.k_cache.clone()
    k_draft = None if case.k_draft is None else case.k_draft.clone()
    return dataclasses.replace(
        case, q=case.q.clone(), k_cache=k_cache, v_cache=alias_or_clone(case.v_cache, case.k_cache, k_cache),
        k_draft=k_draft, v_draft=None if k_draft is None else alias_or_clone(case.v_draft, case.k_draft, k_draft))


def _errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    out = out.double()
    finite = bool(torch.isfinite(out).all())
    diff = (out - ref).nan_to_num(nan=float("inf"))
    rel = (diff.norm() / ref.norm().clamp_min(1e-30)).item()
    max_abs = diff.abs().max().item() if diff.numel() else 0.0
    return {"rel_l2": rel, "max_abs": max_abs, "finite": finite, "correct": finite and rel < REL_L2_TOLERANCE}


def _run_workload(w, impls, ceilings, args) -> dict:
    from ..testing.reference import tree_verify_attention_reference
    from .baselines import IMPLEMENTATIONS
    from .floor import floor_us
    from .timing import rotation_sets, time_calls

    t0 = time.monotonic()
    case = w.case(device="cuda", seed=args.seed)
    floor = floor_us(case, ceilings["read_bytes_per_s"], ceilings["matmul_flops_per_s"])
    ref = tree_verify_attention_reference(*case.args())
    sets = [case] + [_clone_inputs(case) for _ in range(rotation_sets(floor["bytes"]) - 1)]
    record = {"name": w.name, "shape": w.shape, "workload": dataclasses.asdict(w), "floor": floor,
              "input_sets": len(sets), "impls": {}}
    for impl in impls:
        entry: dict = {}
        try:
            calls = [IMPLEMENTATIONS[impl](c) for c in sets]
            entry.update(_errors(calls[0]().clone(), ref))
            torch.cuda.synchronize()
            entry.update(time_calls(calls, samples=args.samples))
            entry["pct_of_floor"] = 100 * floor["floor_us"] / entry["median_us"]
        except Exception as e:  # report and go on: one broken implementation must not hide the others
            entry["error"] = f"{type(e).__name__}: {e}"
            entry["correct"] = False
            traceback.print_exc()
        record["impls"][impl] = entry
        del entry
        torch.cuda.synchronize()
    del sets, case, ref
    torch.cuda.empty_cache()
    cells = ", ".join(
        f"{i} {e['median_us']:.1f} µs{'' if e.get('correct') else ' ✗'}" if "median_us" in e else f"{i} ERROR"
        for i, e in record["impls"].items())
    print(f"[bench] {w.name} ({w.shape}): floor {floor['floor_us']:.1f} µs ({floor['bound']}); {cells}"
          f"  [{time.monotonic() - t0:.0f} s]", flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.ddtree:
        from .ddtree import main as ddtree_main

        return ddtree_main(args)
    if not torch.cuda.is_available():
        print("kdtree_ops bench: needs a CUDA device", file=sys.stderr)
        return 2
    from .. import ops  # noqa: F401  (builds and loads the library before anything is timed)
    from .baselines import IMPLEMENTATIONS, unavailable_reason
    from .ceilings import measure_ceilings
    from .report import environment, markdown_table, write_report
    from .workloads import select

    workloads = select(args.only)
    wanted = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = [i for i in wanted if i not in IMPLEMENTATIONS]
    if unknown:
        print(f"kdtree_ops bench: unknown implementations {unknown}; choose from {list(IMPLEMENTATIONS)}",
              file=sys.stderr)
        return 2
    skipped = {i: r for i in wanted if (r := unavailable_reason(i)) is not None}
    impls = [i for i in wanted if i not in skipped]
    for i, reason in skipped.items():
        print(f"[bench] skipping {i}: {reason}", flush=True)

    env = environment()
    print(f"[bench] {env.get('device')} torch {env['torch']} commit {env['commit'][:12]}", flush=True)
    ceilings = measure_ceilings()
    print(f"[bench] ceilings: read {ceilings['read_bytes_per_s'] / 1e12:.2f} TB/s, copy "
          f"{ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write), bf16 matmul "
          f"{ceilings['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s", flush=True)

    records = [_run_workload(w, impls, ceilings, args) for w in workloads]
    results = {"environment": env, "ceilings": ceilings, "implementations": impls, "skipped": skipped,
               "rel_l2_tolerance": REL_L2_TOLERANCE, "workloads": records}
    written = write_report(results, args.out)
    print(markdown_table(results))
    print("[bench] wrote " + ", ".join(written.values()), flush=True)
    ok = all("median_us" in r["impls"].get("kdtree", {}) and r["impls"]["kdtree"].get("correct")
             for r in records) and "kdtree" in impls
    return 0 if ok else 1
