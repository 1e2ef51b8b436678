"""The GPU suite's `enginebench` part: `python -m kdtree_ops bench --engine` on a real-sized markov target (--model:
the Llama-3-8B-shaped one, sglang_gpu/llama8b.py, or DeepSeek-V2-Lite's attention shape, sglang_gpu/mla_lite.py) at
several drafter agreement levels (attn_std sets how often the target follows its drafter), CUDA graphs on, over the
triton base (the engine bundle's machine has no flashinfer or fa3).

    cd compile_tests && python -m sglang_gpu.engine_bench_gpu --out DIR [--model mla_lite] [--attn-stds 0.024,0.030]
        [bench options]

Each level writes DIR/[<model>-]attn_std-<x>/ (engine_bench.json, engine_bench.md; llama8b's without the model's
name); options after the known ones go to the bench unchanged (e.g. --configs, --batch-sizes, --new-tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from sglang_gpu import llama8b, mla_lite  # noqa: E402

MODELS = {"llama8b": llama8b, "mla_lite": mla_lite}

# The synchronous rows at 16-1023 tokens, and on the overlap scheduler with draft graphs small to launch-sized trees
# (the bench suggests budgets from one variant's rows at every batch size: small trees at large batches are the
# question of the 2026-12-06 profile, where a tree of 64 at 32 requests spent 35 of its 45 ms in the verify)
CONFIGS = ("none,dflash,dflash-kdtree,ddtree16,ddtree64,ddtree256,ddtree1023,ddtree64-overlap,ddtree8-graphs-overlap,"
           "ddtree16-graphs-overlap,ddtree64-graphs-overlap,ddtree64-graphs-overlap-budgets")
# The -budgets rows' policy: what the bench suggested from the H100 table of 2026-12-05 (synchronous DDTREE rows
# against no speculation on the overlap scheduler, warm-ups of 4 tokens): trees of 64 tokens below 16 requests,
# plain decode from 16 (its verify replays graphs of its own width: verify_widths.py)
BUDGETS = "1:64,16:1"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=sorted(MODELS), default="llama8b")
    ap.add_argument("--attn-stds", default=None, help="agreement levels (llama8b's CPU calibration: 0.024 ~ 89 %%, "
                                                      "0.030 ~ 34 %% of positions follow the drafter; default "
                                                      "0.024,0.030, mla_lite's its DEFAULT_ATTN_STD)")
    ap.add_argument("--models-root", default="/tmp/kdtree_engine_models")
    ap.add_argument("--no-profile", action="store_true", help="leave out the profiled reruns (a call's time)")
    args, bench_args = ap.parse_known_args()
    module = MODELS[args.model]
    stds = args.attn_stds or ("0.024,0.030" if args.model == "llama8b" else str(module.DEFAULT_ATTN_STD))
    tag = "" if args.model == "llama8b" else f"{args.model}-"
    status = 0
    for std in (float(s) for s in stds.split(",")):
        paths = module.build(Path(args.models_root) / args.model, attn_std=std)
        # decode rounds replay CUDA graphs (what the bench compares); prefill graphs are left out: each engine
        # would spend ~20 s capturing them for the timed batches' one short prefill
        engine = dict(paths["engine"], cuda_graph_max_bs_decode=32, disable_prefill_cuda_graph=True)
        words = paths["words"]
        cmd = [sys.executable, "-m", "kdtree_ops", "bench", "--engine", "--model-path", paths["target"],
               "--draft-model-path", paths["dflash"], "--eagle-draft-model-path", paths["eagle"],
               "--configs", CONFIGS, "--batch-sizes", "1,4,16,32", "--base-backend", "triton",
               "--vocab-range", f"{words.start},{words.stop}", "--engine-args", json.dumps(engine),
               *([] if args.no_profile else ["--profile"]),
               "--ddtree-budgets", BUDGETS,
               "--out", str(Path(args.out) / f"{tag}attn_std-{std}"), *bench_args]
        print(f"=== attn_std {std}: {' '.join(cmd)}", flush=True)
        status |= subprocess.run(cmd, env=dict(os.environ, SGLANG_GPU_STANDIN="1")).returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
