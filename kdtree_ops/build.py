"""JIT build of csrc/ into one shared library, cached by what it holds, loaded once per process.

A build is keyed by its sources, compiler flags, compilers, torch version and the CUDA targets it holds (not by
Python's: the library uses no Python API, torch.ops.load_library dlopens it); its folder records those targets
(`build.json`, written last: a killed build leaves none). Loading takes the binary wheel's prebuilt library when
it serves this process (prebuilt.py: built against this torch, from these sources, for targets that cover this
machine), else any complete cached build of the same sources that covers this machine, so an image prebuilt for
several targets (`python -m kdtree_ops build --archs "80;90a;120"`) serves every GPU it covers without compiling.
Processes that start together (SGLang's TP ranks) share one build: they serialize on a file lock and re-check
for the finished library after locking.

CUDA targets: `KDTREE_OPS_CUDA_ARCHS` (or PyTorch's `TORCH_CUDA_ARCH_LIST`) when set; otherwise the visible
GPUs'; with neither, CPU only (a machine without a GPU does not wait minutes for kernels it cannot run).
sm_90 builds as sm_90a, which the wgmma kernels need.

Environment:
  KDTREE_OPS_CACHE_DIR    where builds live (default: $XDG_CACHE_HOME/kdtree_ops or ~/.cache/kdtree_ops)
  KDTREE_OPS_CUDA_ARCHS   CUDA targets, e.g. "90a;120" (TORCH_CUDA_ARCH_LIST's "9.0;12.0" form is read too)
  KDTREE_OPS_CPU_ONLY=1   build the CPU kernels only, even where nvcc and GPUs are found
  KDTREE_OPS_VERBOSE=1    show the compiler commands
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from . import prebuilt
from .linkage import check_linkage, share_cxx_runtime

_loaded_library: Path | None = None
_MANIFEST = "build.json"


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


MIN_CAPABILITY = 80  # the kernels' instructions (cp.async, mma.sync bf16, __reduce_max_sync) start at sm_80


def _target(arch: str) -> str:
    """A build target from "90", "9.0", "9.0a" or "12.0+PTX": digits (and suffix); sm_90 builds as 90a."""
    arch = arch.strip().lower().removeprefix("sm_").removesuffix("+ptx").replace(".", "")
    if not re.fullmatch(r"\d{2,3}[af]?", arch):
        raise ValueError(f"kdtree_ops: CUDA target {arch!r} is not of the form 80, 90a, 120 or 8.0, 9.0a, 12.0")
    return "90a" if arch == "90" else arch  # Hopper's kernels need the wgmma target


def _digits(target: str) -> int:
    return int(target.rstrip("af"))


def parse_archs(text: str) -> list[str]:
    """Targets from "80;90a;120", "8.0 9.0 12.0+PTX" or "80,90a" (sorted, without repeats); a target before
    sm_80 is an error naming it (the kernels' instructions do not exist there)."""
    targets = sorted({_target(a) for a in re.split(r"[;, ]+", text) if a.strip()})
    old = [t for t in targets if _digits(t) < MIN_CAPABILITY]
    if old:
        raise ValueError(f"kdtree_ops: CUDA target(s) {', '.join('sm_' + t for t in old)} are not supported: the "
                         f"kernels need sm_{MIN_CAPABILITY} or later")
    return targets


def requested_archs() -> list[str] | None:
    """Targets named by KDTREE_OPS_CUDA_ARCHS, else TORCH_CUDA_ARCH_LIST; None when neither names any.

    PyTorch's list is shared with other extensions: its named entries ("Ampere") and targets before sm_80 are
    skipped rather than refused, and a list with nothing left counts as not set (the visible GPUs decide), with
    a line saying so: an empty request would otherwise make a CPU-only build look like it serves every GPU.
    """
    if os.environ.get("KDTREE_OPS_CUDA_ARCHS", "").strip():
        return parse_archs(os.environ["KDTREE_OPS_CUDA_ARCHS"])
    listed = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if listed:
        targets = []
        for entry in re.split(r"[;, ]+", listed):
            try:
                targets.append(_target(entry))
            except ValueError:
                continue
        usable = sorted({t for t in targets if _digits(t) >= MIN_CAPABILITY})
        if usable:
            return usable
        _note_once(f"kdtree_ops: TORCH_CUDA_ARCH_LIST={listed!r} names no target the kernels support (sm_"
                   f"{MIN_CAPABILITY} or later); building for the visible GPUs instead")
    return None


@functools.lru_cache(maxsize=None)
def _note_once(line: str) -> None:
    print(line, file=sys.stderr)


def visible_capabilities(initialize_cuda: bool = True) -> list[str] | None:
    """Compute capabilities ("90", "86", ...) of the visible GPUs; None when they cannot be known.

    With initialize_cuda=False (import time: SGLang imports this package in processes that fork later, and a
    CUDA context must not exist before a fork) only torch's already initialized runtime or NVML is asked.
    """
    if torch.version.cuda is None or os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return []
    if initialize_cuda or torch.cuda.is_initialized():
        if not torch.cuda.is_available():
            return []
        return sorted({"{}{}".format(*torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())})
    has_device_files = any(Path("/dev").glob("nvidia[0-9]*")) or Path("/dev/dxg").exists()  # dxg: WSL2
    try:
        import pynvml
    except ImportError:
        return [] if not has_device_files else None  # GPUs present, their capabilities unknown
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: no GPU to serve
        return [] if not has_device_files else None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return sorted({"{}{}".format(*pynvml.nvmlDeviceGetCudaComputeCapability(h)) for h in handles})
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def covers(targets: list[str], capability: str) -> bool:
    """Whether a build for `targets` runs on a GPU of `capability` ("86"): an exact "a" target; an "f" (family)
    target of the same major and a minor at most the GPU's (sm_120f code runs on sm_121); or a plain target of the
    same major and a minor at most the GPU's (sm_80 code runs on sm_86 and sm_89). sm_90 needs 90a: the build's
    Hopper kernels are the wgmma ones."""
    major, minor = int(capability[:-1]), int(capability[-1])
    for t in targets:
        digits = t.rstrip("af")
        same_family = int(digits[:-1]) == major and int(digits[-1]) <= minor
        if t.endswith("a"):
            if digits == capability:
                return True
        elif t.endswith("f"):
            if same_family:
                return True
        elif (major, minor) != (9, 0) and same_family:
            return True
    return False


def supported_capabilities(capabilities: list[str]) -> list[str]:
    """The GPUs the kernels can serve (sm_80 or later); a line names those left out (they get no CUDA kernels:
    the op answers no for them and runs on the CPU only)."""
    old = sorted(c for c in capabilities if int(c) < MIN_CAPABILITY)
    if old:
        _note_once(f"kdtree_ops: GPU(s) sm_{', sm_'.join(old)} are below sm_{MIN_CAPABILITY}, which the kernels need: "
                   "no CUDA kernels for them")
    return [c for c in capabilities if int(c) >= MIN_CAPABILITY]


def cpu_only_requested() -> bool:
    return os.environ.get("KDTREE_OPS_CPU_ONLY", "0") not in ("", "0")


def with_cuda() -> bool:
    """CUDA kernels can be compiled here: torch has CUDA, nvcc is found, and the CPU-only switch is off."""
    return not cpu_only_requested() and torch.version.cuda is not None and cuda_home() is not None


def cuda_archs(capabilities: list[str] | None = None) -> list[str]:
    """Targets a new build compiles: the requested ones, else the visible GPUs' (none: CPU only)."""
    if not with_cuda():
        return []
    requested = requested_archs()
    if requested is not None:
        return requested
    caps = visible_capabilities() if capabilities is None else capabilities
    return sorted({_target(c) for c in supported_capabilities(caps or [])})


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


def _flags(root: Path, archs: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(C++ flags, nvcc flags, link flags): the one place compiler and linker flags are set.

    The link names the shared C++ runtime first, by file name and outside --as-needed, so every C++ runtime
    symbol resolves to libstdc++.so.6, the one torch uses: a static libstdc++.a that the driver would otherwise
    take (where the toolchain's libstdc++.so link is missing, or a -static-libstdc++ is in the environment) is
    never pulled into the library (see check_linkage).
    """
    cflags = ["-O3", "-std=c++20", "-DNDEBUG", f"-I{root}"]
    ldflags = ["-Wl,--push-state,--no-as-needed", "-l:libstdc++.so.6", "-Wl,--pop-state"]
    if not archs:
        return cflags, [], ldflags
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    cuda_flags = ["-O3", "-std=c++20", "-DNDEBUG", f"-I{root}", "-lineinfo", "--expt-relaxed-constexpr",
                  "-Xptxas=-warn-spills", *_cuda_library_headers(cuda_home()), *gencode]
    return cflags, cuda_flags, ldflags


@functools.lru_cache(maxsize=None)
def _tool_version(*command: str) -> str:
    """First line of `command --version` ("" when the tool is missing): compilers are part of a build's key."""
    try:
        run = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
        return (run.stdout or run.stderr).strip().splitlines()[0] if run.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def cache_dir() -> Path:
    if os.environ.get("KDTREE_OPS_CACHE_DIR"):
        return Path(os.environ["KDTREE_OPS_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kdtree_ops"


def _source_key(root: Path | None = None) -> str:
    """Digest of every source and header (CPU and CUDA) and of the torch they build against: builds of any target
    set from the same sources share it, and loading takes only builds that carry it. Python's version is not in
    it: the library calls no Python API (wheel.py checks its symbols), so one build serves every Python."""
    root = source_root() if root is None else root
    digest = hashlib.sha256()
    patterns = ("*.cpp", "*.h", "cpu/*", "cuda/*.cu", "cuda/*.cuh", "cuda/*.h")
    for path in sorted({p for pattern in patterns for p in root.glob(pattern) if p.is_file()}):
        digest.update(str(path.relative_to(root)).encode())  # where the sources sit is not part of the build
        digest.update(path.read_bytes())
    digest.update(Path(__file__).read_bytes())  # how it is built (flags, link) belongs to what is built
    digest.update(repr((torch.__version__, torch.version.cuda)).encode())
    return digest.hexdigest()[:16]


def _build_key(root: Path, flags: tuple[list[str], ...], cuda: bool, source_key: str | None = None) -> str:
    """Digest of a build: its sources (source_key, computed when not given), flags (the CUDA targets among them)
    and compilers."""
    portable_flags = [[f.replace(str(root), "<csrc>") for f in group] for group in flags]
    compilers = [_tool_version(os.environ.get("CXX", "c++"))]
    if cuda:
        compilers.append(_tool_version(str(cuda_home() / "bin" / "nvcc")))
    key = _source_key(root) if source_key is None else source_key
    return hashlib.sha256(repr((key, portable_flags, compilers)).encode()).hexdigest()[:16]


def _complete_builds() -> list[tuple[Path, list[str]]]:
    """(library, targets) of every finished build of these sources in the cache, fewest targets first."""
    key = _source_key()
    found = []
    for manifest in cache_dir().glob(f"kdtree_ops_*/{_MANIFEST}"):
        try:
            meta = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        library = manifest.parent / meta.get("library", "")
        if meta.get("source_key") == key and library.is_file():
            found.append((library, list(meta.get("archs", []))))
    return sorted(found, key=lambda item: (len(item[1]), str(item[0])))


def _unserved_reason(targets: list[str], wanted: list[str] | None, capabilities: list[str]) -> str:
    """Why a build of `targets` does not serve ("" when it does): it must hold every requested target (or, with
    none requested, cover every visible GPU); KDTREE_OPS_CPU_ONLY=1 takes only a CPU-only build."""
    if cpu_only_requested():
        return "KDTREE_OPS_CPU_ONLY=1 asks for a CPU-only build" if targets else ""
    if wanted is not None:
        missing = sorted(set(wanted) - set(targets))
        return f"the requested CUDA targets sm_{', sm_'.join(missing)} are not among its own" if missing else ""
    uncovered = [c for c in supported_capabilities(capabilities) if not covers(targets, c)]
    return f"it has no code for the GPU(s) sm_{', sm_'.join(uncovered)}" if uncovered else ""


def _serves(targets: list[str], wanted: list[str] | None, capabilities: list[str]) -> bool:
    return not _unserved_reason(targets, wanted, capabilities)


def _register(library: Path) -> Path:
    global _loaded_library
    share_cxx_runtime()
    torch.ops.load_library(str(library))
    _loaded_library = library
    return library


def _load_built(wanted: list[str] | None, capabilities: list[str]) -> Path | None:
    """Loads, without compiling, the wheel's prebuilt library when it serves this process, else the smallest
    complete cached build that serves this machine; returns its path, or None (nothing loaded).

    A prebuilt library passed over (another torch, other sources, targets that miss this machine, a failed
    dlopen) is named in one line with the reason: the JIT build takes over, compiling on first use.
    """
    shipped = prebuilt.shipped()
    if shipped is not None:
        library, meta = shipped
        why = prebuilt.mismatch(meta, _source_key()) or _unserved_reason(meta.get("archs", []), wanted, capabilities)
        if not why:
            try:
                return _register(library)
            except OSError as exc:  # dlopen: e.g. an older C library than the build machine's
                why = f"it did not load ({exc})"
        _note_once(f"kdtree_ops: not using the wheel's prebuilt library ({prebuilt.describe(meta)}): {why}; "
                   "taking a JIT build instead (compiled into the cache on first use)")
    for library, targets in _complete_builds():
        if _serves(targets, wanted, capabilities):
            return _register(library)
    return None


def load_cached() -> Path | None:
    """Loads the wheel's prebuilt library or a complete cached build that serves this machine, without compiling
    or initializing CUDA.

    Returns its path, or None (nothing loaded) when none serves or the GPUs cannot be known without CUDA.
    """
    if _loaded_library is not None:
        return _loaded_library
    capabilities = visible_capabilities(initialize_cuda=False)
    if capabilities is None:
        return None
    return _load_built(requested_archs() if with_cuda() else None, capabilities)


def load(archs: list[str] | None = None, verbose: bool | None = None) -> Path:
    """Builds (when neither the wheel's prebuilt library nor a cached build serves this machine) and loads the
    library; returns its path.

    archs: CUDA targets to build for instead of the environment's choice (e.g. ["80", "90a", "120"] for an
    image). Safe to call repeatedly and concurrently; the ops are registered once per process.
    """
    verbose = _verbose(verbose)
    if _loaded_library is not None:
        if archs is None or set(parse_archs(";".join(archs))) <= set(built_archs()):
            return _loaded_library
        # An image build for other targets than the library this process loaded (import time took a cached one):
        # compile it into the cache for the processes to come; this one keeps the ops it registered (a library
        # registers its schemas once per process: loading a second would abort it).
        library = _build(parse_archs(";".join(archs)), verbose)
        print(f"kdtree_ops: built {library}; this process keeps the library it had loaded ({_loaded_library}), "
              "new processes take the new build", file=sys.stderr)
        return library
    capabilities = visible_capabilities()
    wanted = parse_archs(";".join(archs)) if archs is not None else (requested_archs() if with_cuda() else None)
    if archs is None:
        library = _load_built(wanted, capabilities)
        if library is not None:
            return library
    return _register(_build(wanted if wanted is not None else cuda_archs(capabilities), verbose))


def build_library(archs: list[str], verbose: bool | None = None) -> Path:
    """Compiles the library for `archs` into the cache (or finds it built there) without loading it; returns its
    path. A binary wheel (wheel.py) packs it."""
    return _build(archs, _verbose(verbose))


def _verbose(verbose: bool | None) -> bool:
    return os.environ.get("KDTREE_OPS_VERBOSE", "0") not in ("", "0") if verbose is None else verbose


def _build(archs: list[str], verbose: bool) -> Path:
    """Compiles the library for `archs` (empty: CPU only) into the cache, or finds it built; returns its path."""
    if archs and not with_cuda():
        raise RuntimeError(f"kdtree_ops: CUDA targets {archs} asked for, but "
                           + ("KDTREE_OPS_CPU_ONLY is set" if cpu_only_requested() else
                              "no CUDA toolkit (nvcc) was found and torch " + (
                                  "has no CUDA" if torch.version.cuda is None else "has CUDA")))
    root = source_root()
    cuda = bool(archs)
    sources = _sources(root, cuda)
    flags = _flags(root, archs)
    source_key = _source_key(root)  # once: a source edited during the compile must not lend the build its key
    name = f"kdtree_ops_{_build_key(root, flags, cuda, source_key)}"
    build_dir = cache_dir() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    library = build_dir / f"{name}.so"
    manifest = build_dir / _MANIFEST
    with open(build_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building this very key: wait, then re-check
        if not manifest.exists():
            _compile(name, sources, flags, build_dir, archs, verbose)
            check_linkage(library)
            meta = {"library": library.name, "archs": archs, "source_key": source_key, **prebuilt.torch_build(),
                    "built": time.strftime("%Y-%m-%d %H:%M:%S")}
            tmp = manifest.with_suffix(".tmp")
            tmp.write_text(json.dumps(meta, indent=1))
            tmp.replace(manifest)
    return library


def built_archs() -> list[str]:
    """CUDA targets of the loaded library ([] for a CPU-only build or when none is loaded)."""
    if _loaded_library is None:
        return []
    try:
        return list(json.loads((_loaded_library.parent / _MANIFEST).read_text()).get("archs", []))
    except (OSError, ValueError):
        return []


def _compile(name: str, sources: list[Path], flags: tuple[list[str], list[str], list[str]], build_dir: Path,
             archs: list[str], verbose: bool) -> None:
    """Compiles the library in a child process, never in this one.

    torch's cpp_extension.load always loads what it builds (is_python_module=False: torch.ops.load_library), and
    a process may register the kdtree schemas once: a second library aborts it, and the first would load before
    the runtime sharing and the linkage check. The child imports this module under a bare package object (not
    the package's __init__, which would load a cached build at import), builds, and exits; this process then
    checks the library and loads it through _register."""
    target = "CPU" + (" + CUDA " + ", ".join(f"sm_{a}" for a in archs) if archs else " only (no CUDA targets)")
    print(f"kdtree_ops: compiling {len(sources)} sources for {target} into {build_dir} "
          "(first use only; about a minute per target on a few cores) ...", file=sys.stderr, flush=True)
    start = time.monotonic()
    env = dict(os.environ)
    if archs:
        env["CUDA_HOME"] = str(cuda_home())
    job = json.dumps({"name": name, "sources": [str(s) for s in sources], "flags": list(flags),
                      "build_dir": str(build_dir), "cuda": bool(archs), "verbose": verbose})
    child = ("import importlib, json, sys, types\n"
             "package = types.ModuleType('kdtree_ops')\n"
             f"package.__path__ = [{str(Path(__file__).parent)!r}]\n"
             "sys.modules['kdtree_ops'] = package\n"
             "importlib.import_module('kdtree_ops.build')._compile_here(json.loads(sys.argv[1]))\n")
    done = subprocess.run([sys.executable, "-c", child, job], env=env)
    if done.returncode != 0:
        raise RuntimeError(f"kdtree_ops: compiling {name} failed (exit {done.returncode}); the compiler's output is "
                           "above (KDTREE_OPS_VERBOSE=1 shows the commands)")
    print(f"kdtree_ops: built in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def _compile_here(job: dict) -> None:
    """The child's side of _compile: one cpp_extension build (which loads the result into the child, harmlessly)."""
    from torch.utils import cpp_extension

    if job["cuda"]:
        cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # torch may have guessed another at import
    cflags, cuda_flags, ldflags = job["flags"]
    cpp_extension.load(name=job["name"], sources=job["sources"], extra_cflags=cflags, extra_cuda_cflags=cuda_flags,
                       extra_ldflags=ldflags, build_directory=job["build_dir"], with_cuda=job["cuda"],
                       is_python_module=False, verbose=job["verbose"])
