"""The GPU suite's `enginebench` part: `python -m kdtree_ops bench --engine` on the Llama-3-8B-shaped target at
several drafter agreement levels (sglang_gpu/llama8b.py: attn_std sets how often the target follows its drafter),
CUDA graphs on, over the triton base (the engine bundle's machine has no flashinfer or fa3).

    cd compile_tests && python -m sglang_gpu.engine_bench_gpu --out DIR [--attn-stds 0.024,0.030] [bench options]

Each level writes DIR/attn_std-<x>/ (engine_bench.json, engine_bench.md); options after the known ones go to the
bench unchanged (e.g. --configs, --batch-sizes, --new-tokens).
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

from sglang_gpu import llama8b  # noqa: E402

CONFIGS = "none,dflash,dflash-kdtree,ddtree16,ddtree64,ddtree256,ddtree1023,ddtree64-budgets"
# What the bench suggested from the H100 table of 2026-12-05 (examples/results/2026-12-05-enginebench): trees of 64
# tokens below 16 requests, plain decode from 16 (eager: one verify width is captured)
BUDGETS = "1:64,16:1"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--attn-stds", default="0.024,0.030", help="agreement levels (CPU calibration: 0.024 ~ 89 %%, "
                                                                "0.030 ~ 34 %% of positions follow the drafter)")
    ap.add_argument("--models-root", default="/tmp/kdtree_engine_models/llama8b")
    args, bench_args = ap.parse_known_args()
    status = 0
    for std in (float(s) for s in args.attn_stds.split(",")):
        paths = llama8b.build(Path(args.models_root), attn_std=std)
        engine = dict(paths["engine"], cuda_graph_max_bs_decode=32)
        words = paths["words"]
        cmd = [sys.executable, "-m", "kdtree_ops", "bench", "--engine", "--model-path", paths["target"],
               "--draft-model-path", paths["dflash"], "--eagle-draft-model-path", paths["eagle"],
               "--configs", CONFIGS, "--batch-sizes", "1,4,16,32", "--base-backend", "triton",
               "--vocab-range", f"{words.start},{words.stop}", "--engine-args", json.dumps(engine), "--profile",
               "--ddtree-budgets", BUDGETS,
               "--out", str(Path(args.out) / f"attn_std-{std}"), *bench_args]
        print(f"=== attn_std {std}: {' '.join(cmd)}", flush=True)
        status |= subprocess.run(cmd, env=dict(os.environ, SGLANG_GPU_STANDIN="1")).returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
