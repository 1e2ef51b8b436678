"""Seconds from `import kdtree_ops.ops` to the first op call's result, and which library served it.

    python examples/first_call.py [--device cuda] [--expect prebuilt|cache]

The op call is tree_verify_attention (bf16 on CUDA, float32 on the CPU; Dqk = Dv = 128, GQA 32/8, one request of a
64-token tree over a 1000-token prefix), checked against the float64 reference; the time ends after the result is
on the host. Prints one line `first_call {json}`: the seconds (and torch's import apart), the library and whether it
is a binary wheel's prebuilt one, the package's folder, whether the build cache (KDTREE_OPS_CACHE_DIR) holds any
build afterwards, and the compilers on PATH. --expect prebuilt fails unless the wheel's library served without a
build appearing in the cache; --expect cache fails unless a cached (JIT) build served. The GPU suite's `wheel` part
runs it for the JIT build (cold and warm cache) and for the wheel installed in a fresh virtual environment.
From a checkout, run it with PYTHONPATH=. (as the GPU suite does: examples/ alone on the path finds an installed
package); for an installed package, run it from outside the checkout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

start = time.monotonic()
import torch  # noqa: E402  (timed apart: every caller pays it)

torch_s = time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--expect", choices=("prebuilt", "cache"))
    args = parser.parse_args()
    t = time.monotonic()
    import kdtree_ops.ops as ops  # loads: the wheel's library, a cached build, or compiles one
    from kdtree_ops import build, prebuilt
    from kdtree_ops.testing.reference import tree_verify_attention_reference
    from kdtree_ops.testing.trees import random_tree

    device, dtype = torch.device(args.device), torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    gen = torch.Generator().manual_seed(0)
    T, L, Hq, Hkv, D = 64, 1000, 32, 8, 128
    parents = torch.tensor(random_tree(T), dtype=torch.int32, device=device)
    qo = torch.tensor([0, T], dtype=torch.int32, device=device)
    kv = torch.tensor([0, L + T], dtype=torch.int32, device=device)
    indices = torch.randperm(L + T, generator=gen).to(device=device, dtype=torch.int32)
    mask = ops.tree_mask_from_parents(parents, qo, (T + 31) // 32)
    q, k, v = (torch.randn(n, h, D, generator=gen).to(device, dtype) for n, h in ((T, Hq), (L + T, Hkv), (L + T, Hkv)))
    out = torch.empty_like(q).fill_(float("nan"))  # poisoned: a row the op leaves unwritten fails the check
    ops.tree_verify_attention_out(q, k, v, qo, kv, indices, mask, D**-0.5, out=out)
    result = out.cpu()
    seconds = time.monotonic() - t

    args_cpu = [x.cpu() for x in (q, k, v, qo, kv, indices, mask)]
    error = (result.double() - tree_verify_attention_reference(*args_cpu, D**-0.5)).abs().max().item()
    library = build.load()
    cache_builds = sorted(p.name for p in build.cache_dir().glob("kdtree_ops_*")) if build.cache_dir().exists() else []
    report = {
        "seconds": round(seconds, 2), "import_torch_s": round(torch_s, 2), "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "library": str(library), "prebuilt": library.parent == prebuilt.PREBUILT_DIR, "archs": build.built_archs(),
        "package": str(Path(ops.__file__).parent), "cache": str(build.cache_dir()), "cache_builds": cache_builds,
        "compilers_on_path": {x: shutil.which(x) for x in ("c++", "nvcc", "ninja")}, "max_abs_error": error,
        "torch": torch.__version__, "python": sys.version.split()[0],
    }
    print("first_call", json.dumps(report))
    problems = []
    if not error < 3e-2:  # bf16 output of a softmax-weighted mean of N(0, 1) values
        problems.append(f"max |out - float64 reference| = {error}")
    if args.expect == "prebuilt" and (not report["prebuilt"] or cache_builds):
        problems.append(f"expected the wheel's prebuilt library and an empty cache; got {library}, cache {cache_builds}")
    if args.expect == "cache" and report["prebuilt"]:
        problems.append(f"expected a cached (JIT) build; got the prebuilt {library}")
    for problem in problems:
        print(f"first_call: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
