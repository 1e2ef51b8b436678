"""JIT build of csrc/ into one shared library, loaded once per process.

The library is cached under a key of (sources, compiler flags, torch version, CUDA targets), so a changed
source, a new torch or another GPU gets its own build. Processes that start together (SGLang's TP ranks)
share one build: they serialize on a file lock and re-check for the finished library after locking.

Environment:
  KDTREE_OPS_CACHE_DIR    where builds live (default: $XDG_CACHE_HOME/kdtree_ops or ~/.cache/kdtree_ops)
  KDTREE_OPS_CUDA_ARCHS   CUDA targets, e.g. "90a;120" (default: the visible GPUs', or 80;90a;120 with none;
                          90 builds as 90a, which the wgmma kernels need)
  KDTREE_OPS_CPU_ONLY=1   build the CPU kernels only, even where nvcc is found
  KDTREE_OPS_VERBOSE=1    show the compiler commands
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

_loaded_library: Path | None = None

# Targets for a machine with no visible GPU (CI compiles for them): sm_80 (Ampere, and Ada runs its code) takes
# the portable mma.sync path; Hopper's wgmma needs the "a" target; sm_120 is Blackwell workstation
# (RTX PRO 6000), the first production target.
_DEFAULT_ARCHS_WITHOUT_GPU = ("80", "90a", "120")


def source_root() -> Path:
    """csrc/ of this installation: inside the wheel (kdtree_ops/_csrc) or the checkout's top level."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_csrc", here.parent / "csrc"):
        if (candidate / "ops.cpp").is_file():
            return candidate
    raise FileNotFoundError(f"kdtree_ops: C++ sources not found next to {here} (looked for _csrc/ and ../csrc/)")


@functools.lru_cache(maxsize=None)
def cuda_home() -> Path | None:
    """The CUDA toolkit to compile with, or None.

    CUDA_HOME/CUDA_PATH when set; otherwise the toolkit that `nvcc` on PATH runs. nvcc may be a wrapper
    script, so ask it (`--dryrun` prints the real toolkit on its TOP= line) rather than follow the path.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var) and (Path(os.environ[var]) / "bin" / "nvcc").exists():
            return Path(os.environ[var])
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        dry = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"],
                             capture_output=True, text=True, timeout=60)
        top = re.search(r"^#\$ TOP=(.*)$", dry.stderr + dry.stdout, re.M)
        if top and (Path(top.group(1)) / "bin" / "nvcc").exists():
            return Path(top.group(1)).resolve()
    except (OSError, subprocess.SubprocessError):
        pass
    return Path(nvcc).resolve().parent.parent


def cuda_archs() -> list[str]:
    """CUDA targets to build: KDTREE_OPS_CUDA_ARCHS, else the visible GPUs' (sm_90 builds as 90a)."""
    if os.environ.get("KDTREE_OPS_CUDA_ARCHS"):
        archs = {a.strip() for a in re.split(r"[;, ]+", os.environ["KDTREE_OPS_CUDA_ARCHS"]) if a.strip()}
    elif torch.cuda.is_available():
        archs = {"{}{}".format(*torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())}
    else:
        archs = set(_DEFAULT_ARCHS_WITHOUT_GPU)
    return sorted("90a" if a == "90" else a for a in archs)  # Hopper's kernels need the wgmma target


def with_cuda() -> bool:
    """Build the CUDA kernels: torch has CUDA, nvcc is found, and the CPU-only switch is off."""
    if os.environ.get("KDTREE_OPS_CPU_ONLY", "0") not in ("", "0"):
        return False
    return torch.version.cuda is not None and cuda_home() is not None


def _sources(root: Path, cuda: bool) -> list[Path]:
    patterns = ["*.cpp", "cpu/*.cpp"] + (["cuda/*.cu"] if cuda else [])
    return sorted(p for pattern in patterns for p in root.glob(pattern))


def _cuda_library_headers(home: Path) -> list[str]:
    """Where cuSPARSE/cuBLAS headers live when the toolkit lacks them (torch's pip wheels ship them).

    They go in as -isystem, after the toolkit's own headers: the wheels' crt/ headers may be another CUDA
    release than the nvcc that generates the host stubs.
    """
    if (home / "include" / "cusparse.h").exists():
        return []
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for include in sorted(Path(base).glob("*/include")):
            if (include / "cusparse.h").exists():
                return ["-isystem", str(include)]
    return []


def _flags(root: Path, archs: list[str]) -> tuple[list[str], list[str]]:
    """(C++ flags, nvcc flags): the one place compiler flags are set."""
    cflags = ["-O3", "-std=c++20", "-DNDEBUG", f"-I{root}"]
    if not archs:
        return cflags, []
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    cuda_flags = ["-O3", "-std=c++20", "-DNDEBUG", f"-I{root}", "-lineinfo", "--expt-relaxed-constexpr",
                  "-Xptxas=-warn-spills", *_cuda_library_headers(cuda_home()), *gencode]
    return cflags, cuda_flags


def cache_dir() -> Path:
    if os.environ.get("KDTREE_OPS_CACHE_DIR"):
        return Path(os.environ["KDTREE_OPS_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kdtree_ops"


def _build_key(sources: list[Path], root: Path, flags: tuple[list[str], list[str]], cuda: bool) -> str:
    digest = hashlib.sha256()
    patterns = ("*.h", "cpu/*.h") + (("cuda/*.cuh", "cuda/*.h") if cuda else ())
    headers = sorted(p for pattern in patterns for p in root.glob(pattern))
    for path in sorted(set(sources) | set(headers)):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    # Where the sources sit (a checkout, site-packages) is not part of what gets built.
    portable_flags = [[f.replace(str(root), "<csrc>") for f in group] for group in flags]
    digest.update(repr((portable_flags, torch.__version__, torch.version.cuda, sys.version_info[:2])).encode())
    return digest.hexdigest()[:16]


def load(verbose: bool | None = None) -> Path:
    """Builds (first use) and loads the library; returns its path. Safe to call repeatedly and concurrently."""
    global _loaded_library
    if _loaded_library is not None:
        return _loaded_library
    verbose = os.environ.get("KDTREE_OPS_VERBOSE", "0") not in ("", "0") if verbose is None else verbose
    root = source_root()
    cuda = with_cuda()
    archs = cuda_archs() if cuda else []
    sources = _sources(root, cuda)
    flags = _flags(root, archs)
    name = f"kdtree_ops_{_build_key(sources, root, flags, cuda)}"
    build_dir = cache_dir() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    library = build_dir / f"{name}.so"
    complete = build_dir / "complete"  # written after a successful build: a killed build leaves none

    with open(build_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building this very key: wait, then re-check
        if not complete.exists():
            _compile(name, sources, flags, build_dir, archs, verbose)
            complete.touch()
    torch.ops.load_library(str(library))
    _loaded_library = library
    return library


def _compile(name: str, sources: list[Path], flags: tuple[list[str], list[str]], build_dir: Path,
             archs: list[str], verbose: bool) -> None:
    if archs:
        os.environ["CUDA_HOME"] = str(cuda_home())
    from torch.utils import cpp_extension

    if archs:
        cpp_extension.CUDA_HOME = str(cuda_home())  # in case torch had made its own guess at an earlier import
    target = "CPU" + (" + CUDA " + ", ".join(f"sm_{a}" for a in archs) if archs else "")
    print(f"kdtree_ops: compiling {len(sources)} sources for {target} into {build_dir} "
          "(first use only; takes minutes) ...", file=sys.stderr, flush=True)
    start = time.monotonic()
    cpp_extension.load(
        name=name,
        sources=[str(s) for s in sources],
        extra_cflags=flags[0],
        extra_cuda_cflags=flags[1],
        build_directory=str(build_dir),
        with_cuda=bool(archs),
        is_python_module=False,
        verbose=verbose,
    )
    print(f"kdtree_ops: built in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
