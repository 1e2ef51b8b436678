"""Command line: `python -m kdtree_ops build` prebuilds the library; `python -m kdtree_ops bench` runs the
GPU benchmark (workloads G1-G5, M1-M5 side by side with the baselines)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # everything after 'bench' is the benchmark's own (python -m kdtree_ops bench -h)
        from .bench.cli import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m kdtree_ops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="compile (or find in the cache) and load the kernels, print where they are")
    sub.add_parser("bench", help="GPU benchmark (python -m kdtree_ops bench -h for its options)")
    parser.parse_args(argv)

    from . import build

    path = build.load()
    print(f"kdtree_ops: library {path} (CUDA: {'yes, sm_' + ', sm_'.join(build.cuda_archs()) if build.with_cuda() else 'no'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
