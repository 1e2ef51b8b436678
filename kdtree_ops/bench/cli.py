"""`python -m kdtree_ops bench [--only G1,M3] [--out DIR]`: check, time and report every implementation.

For each workload: build the inputs (bf16, random DDTree-like trees, fragmented slots), compute the float64
reference, check each implementation against it (relative L2 error < 1e-2, no non-finite output), then
time it (timing.py) and compare with the floor (floor.py) from ceilings measured at the start of the run; then
the fp8 column: the same over an e4m3 cache with a scale (kdtree by its default path and by the fp8 overlap path,
kdtree_fp8_overlap, and SGLang's Triton kernel: the ones that read fp8 pools), its floor counting one byte per cached
element.
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
FP8_IMPLEMENTATIONS = ("kdtree", "kdtree_fp8_overlap", "sglang_triton")  # the ones that read fp8 pools


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kdtree_ops bench", description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated workloads, e.g. G1,M3 (default: all)")
    p.add_argument("--out", default="bench_results", help="directory for bench.md, bench.json, bench.png")
    p.add_argument("--impls", default="kdtree,sglang_triton,torch_sdpa",
                   help="comma-separated implementations (default: the verified ones available); "
                        "kdtree_fp8_overlap (the unverified fp8 overlap path, named only) runs in the fp8 column only")
    p.add_argument("--samples", type=int, default=30, help="timing samples per implementation (median taken)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-fp8", dest="fp8", action="store_false",
                   help="skip the fp8 column (each workload again over an e4m3 cache)")
    p.add_argument("--ddtree", action="store_true", help="the DDTree round's build/accept ops instead (bench/ddtree.py)")
    p.add_argument("--engine", action="store_true",
                   help="end-to-end SGLang engines per algorithm and batch size instead (bench/engine.py; its own options)")
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


def _run_impls(case, impls, floor, ref, args) -> dict:
    """{impl: {errors, timing, pct_of_floor} or {error}} for one case."""
    from .baselines import IMPLEMENTATIONS
    from .timing import rotation_sets, time_calls

    sets = [case] + [_clone_inputs(case) for _ in range(rotation_sets(floor["bytes"]) - 1)]
    results = {}
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
        results[impl] = entry
        del entry
        torch.cuda.synchronize()
    results["input_sets"] = len(sets)
    return results


def _cells(impls: dict) -> str:
    return ", ".join(
        f"{i} {e['median_us']:.1f} µs{'' if e.get('correct') else ' ✗'}" if "median_us" in e else f"{i} ERROR"
        for i, e in impls.items())


def _run_workload(w, impls, ceilings, args) -> dict:
    from ..testing.reference import tree_verify_attention_reference
    from .baselines import FP8_ONLY
    from .floor import floor_us

    t0 = time.monotonic()
    record = {"name": w.name, "shape": w.shape, "workload": dataclasses.asdict(w)}
    # bf16 caches, then (the fp8 column) the same workload over an e4m3 cache with its scale: every implementation
    # that reads fp8 pools, each checked against the float64 reference on the dequantized cache.
    for kv_dtype, label in ((None, "bf16"), (torch.float8_e4m3fn, "fp8")):
        if label == "fp8" and not args.fp8:
            continue
        case = w.case(device="cuda", seed=args.seed, kv_dtype=kv_dtype)
        floor = floor_us(case, ceilings["read_bytes_per_s"], ceilings["matmul_flops_per_s"])
        ref = tree_verify_attention_reference(*case.scaled_args())
        chosen = ([i for i in impls if i not in FP8_ONLY] if label == "bf16"
                  else [i for i in impls if i in FP8_IMPLEMENTATIONS])
        timed = _run_impls(case, chosen, floor, ref, args)
        part = {"floor": floor, "input_sets": timed.pop("input_sets"), "impls": timed}
        if label == "bf16":
            record.update(part)
        else:
            record["fp8"] = dict(part, kv_dtype="float8_e4m3fn", scale=case.k_scale)
        del case, ref
        torch.cuda.empty_cache()
        print(f"[bench] {w.name} {label} ({w.shape}): floor {floor['floor_us']:.1f} µs ({floor['bound']}); "
              f"{_cells(timed)}  [{time.monotonic() - t0:.0f} s]", flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--engine" in argv:  # end-to-end SGLang engines: a parser of its own (engine.py)
        from .engine import main as engine_main

        return engine_main(argv)
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
    ok = all("median_us" in part["impls"].get("kdtree", {}) and part["impls"]["kdtree"].get("correct")
             for r in records for part in (r, r.get("fp8", r))) and "kdtree" in impls
    return 0 if ok else 1
