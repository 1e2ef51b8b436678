"""Command line: `python -m kdtree_ops build` prebuilds the library; `python -m kdtree_ops bench` runs the
GPU benchmark (workloads G1-G5, M1-M5 side by side with the baselines)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kdtree_ops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="compile (or find in the cache) and load the kernels, print where they are")
    bench = sub.add_parser("bench", help="GPU benchmark; arguments after 'bench' go to the benchmark",
                           add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if args.command == "build":
        from . import build

        path = build.load()
        print(f"kdtree_ops: library {path} (CUDA: {'yes, sm_' + ', sm_'.join(build.cuda_archs()) if build.with_cuda() else 'no'})")
        return 0
    from .bench.cli import main as bench_main

    return bench_main(args.rest)


if __name__ == "__main__":
    sys.exit(main())
