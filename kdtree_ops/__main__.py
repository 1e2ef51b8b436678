"""Command line: `python -m kdtree_ops build [--archs "80;90a;120"]` prebuilds the library (e.g. into an image);
`python -m kdtree_ops build --wheel [--archs ...] [--out dist]` writes a binary wheel holding it (kdtree_ops/wheel.py);
`python -m kdtree_ops bench` runs the GPU benchmark (workloads G1-G5, M1-M5 side by side with the baselines)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # everything after 'bench' is the benchmark's own (python -m kdtree_ops bench -h)
        from .bench.cli import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m kdtree_ops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="compile (or find in the cache) and load the kernels, print where they are")
    build_cmd.add_argument("--archs", help='CUDA targets, e.g. "80;90a;120" (default: KDTREE_OPS_CUDA_ARCHS, '
                           "TORCH_CUDA_ARCH_LIST, or the visible GPUs; none: CPU only)")
    build_cmd.add_argument("--wheel", action="store_true", help="write a binary wheel holding the library for these "
                           "targets, named and pinned for this torch (from a checkout; the build is reused from the "
                           "cache when it is there)")
    build_cmd.add_argument("--out", default="dist", help="folder the wheel is written to (default: dist)")
    sub.add_parser("bench", help="GPU benchmark (python -m kdtree_ops bench -h for its options)")
    args = parser.parse_args(argv)

    from . import build, load

    if args.wheel:
        from . import wheel

        requested = build.parse_archs(args.archs) if args.archs else build.requested_archs()
        targets = requested if requested is not None else build.cuda_archs()
        path = wheel.write(build.build_library(targets), Path(args.out))
        print(f"kdtree_ops: wheel {path} ({path.stat().st_size / 2**20:.1f} MiB; CUDA: "
              f"{'sm_' + ', sm_'.join(targets) if targets else 'none, CPU only'})")
        return 0
    path = load(archs=build.parse_archs(args.archs) if args.archs else None)
    archs = build.built_archs()
    print(f"kdtree_ops: library {path} (CUDA: {'sm_' + ', sm_'.join(archs) if archs else 'none, CPU only'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
