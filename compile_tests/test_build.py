"""The JIT build: CUDA kernels compiled for the visible GPUs or the named targets (CI names sm_80, sm_90a, sm_120),
builds cached by what they hold and reused wherever they cover the machine, the ops registered on import when such
a build is cached, sources shipped in the wheel, one build shared by processes that start together (SGLang's TP
ranks), and a library that takes the process's C++ runtime."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from kdtree_ops import build, linkage

REPO = Path(__file__).resolve().parent.parent
OPS = ("tree_verify_attention", "tree_verify_attention_out", "tree_mask_from_parents", "tree_mask_from_dense",
       "record_divergence", "ddtree_sample_targets")


def _has_kernel(op: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"kdtree::{op}", key)


def test_cuda_kernels_built_exactly_for_the_chosen_targets(ops):
    # CI has no GPU but has nvcc and names its targets: the CUDA kernels must have compiled for all three.
    archs = build.built_archs()
    for op in OPS:
        assert _has_kernel(op, "CPU"), op
        assert _has_kernel(op, "CUDA") == bool(archs), (op, archs)
    if os.environ.get("CI") == "true":
        assert archs == ["120", "80", "90a"], archs
    elif build.requested_archs() is not None and build.with_cuda():
        assert set(build.requested_archs()) <= set(archs), archs


def test_default_targets_are_the_visible_gpus_or_none(monkeypatch):
    for var in ("KDTREE_OPS_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST", "KDTREE_OPS_CPU_ONLY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(build, "with_cuda", lambda: True)
    assert build.cuda_archs([]) == []  # no GPU, nothing named: CPU only
    assert build.cuda_archs(["90", "86"]) == ["86", "90a"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0 12.0+PTX")
    assert build.cuda_archs([]) == ["120", "80", "90a"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.0 7.5 Ampere 8.6 9.0+PTX")  # PyTorch's list serves others too
    assert build.cuda_archs([]) == ["86", "90a"]
    monkeypatch.setenv("KDTREE_OPS_CUDA_ARCHS", "90a;120")  # ours wins over PyTorch's
    assert build.cuda_archs(["80"]) == ["120", "90a"]
    with pytest.raises(ValueError, match="not of the form"):
        build.parse_archs("hopper")


def test_targets_before_sm80_never_build_and_never_hide_a_gpu(monkeypatch):
    # A PyTorch list with nothing the kernels support once made an empty request, and a cached CPU-only build then
    # "served" an H100; a visible sm_75 GPU became an nvcc target and the build failed (__reduce_max_sync).
    for var in ("KDTREE_OPS_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST", "KDTREE_OPS_CPU_ONLY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(build, "with_cuda", lambda: True)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5 Turing")
    assert build.requested_archs() is None         # as if unset: the visible GPUs decide
    assert build.cuda_archs(["90"]) == ["90a"]
    assert not build._serves([], build.requested_archs(), ["90"])  # a CPU-only build does not serve an H100
    assert build.cuda_archs(["75"]) == []          # an sm_75 GPU alone: CPU only, no failing nvcc target
    assert build.cuda_archs(["75", "86"]) == ["86"]
    assert build._serves([], None, ["75"])         # ... and a CPU-only build serves that machine
    monkeypatch.setenv("KDTREE_OPS_CUDA_ARCHS", "75;90a")  # named by us: an error that says why
    with pytest.raises(ValueError, match=r"sm_75 are not supported: the kernels need sm_80 or later"):
        build.requested_archs()


def test_load_with_new_targets_after_a_load_compiles_without_loading(monkeypatch, tmp_path):
    # After import time loaded a cached build, `load(archs)` for other targets compiled through cpp_extension.load,
    # which loads what it builds: a second TORCH_LIBRARY(kdtree) aborted the process. Now the build is made for
    # later processes and this one keeps its library.
    monkeypatch.setattr(build, "_loaded_library", Path("/cached/kdtree_ops_x.so"))
    monkeypatch.setattr(build, "built_archs", lambda: ["90a"])
    made = []
    monkeypatch.setattr(build, "_build", lambda archs, verbose: made.append(archs) or tmp_path / "new.so")
    monkeypatch.setattr(build, "_register", lambda library: pytest.fail("a second library was loaded"))
    assert build.load(archs=["90a"]) == Path("/cached/kdtree_ops_x.so")  # already held: nothing to do
    assert build.load(archs=["80", "90a"]) == tmp_path / "new.so"
    assert made == [["80", "90a"]]


def test_a_build_in_a_process_that_loaded_one_compiles_in_a_child(ops, tmp_path):
    # The compile itself: a second build (other flags, so another key) in a process whose ops are registered must
    # neither abort it nor load the new library into it (it loaded before the runtime sharing and the linkage check).
    code = f"""
import os, sys
import kdtree_ops.ops
from kdtree_ops import build
first = build.load()
os.environ["KDTREE_OPS_CACHE_DIR"] = {str(tmp_path)!r}
os.environ["KDTREE_OPS_CPU_ONLY"] = "1"
flags = build._flags
build._flags = lambda root, archs: tuple(group + ["-DKDTREE_OPS_TEST_VARIANT=1"] for group in flags(root, archs))
second = build._build([], False)
loaded = sorted({{line.split()[-1] for line in open("/proc/self/maps") if "kdtree_ops_" in line and line.endswith(".so\\n")}})
print("RESULT", second != first, second.is_file(), (second.parent / "build.json").is_file(), loaded == [str(first)])
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("RESULT")[-1].split() == ["True", "True", "True", "True"], run.stdout + run.stderr[-2000:]


@pytest.mark.parametrize("targets, capability, expected", [
    (["80", "90a", "120"], "90", True),    # the prebuilt image serves an H200
    (["80", "90a", "120"], "86", True),    # sm_80 code runs on sm_86 (A10, A6000) and sm_89
    (["80", "90a", "120"], "121", True),   # sm_120 code runs on sm_121 (DGX Spark)
    (["80"], "90", False),                 # Hopper's kernels are the wgmma ones: sm_90 needs 90a
    (["90a"], "100", False),               # an "a" target runs on its own architecture only
    (["86"], "80", False),                 # never on an older minor
    (["120"], "89", False),
    (["120f"], "121", True),               # a family target runs on its family's later minors
    (["100f"], "103", True),
    (["100f"], "120", False),              # ... of its own major only
    (["121f"], "120", False),
    (["120a"], "121", False),
    ([], "90", False),
])
def test_a_build_covers_the_gpus_its_code_runs_on(targets, capability, expected):
    assert build.covers(targets, capability) == expected


def test_loading_reuses_any_cached_build_that_covers_the_machine(tmp_path, monkeypatch):
    # Builds of these sources for (CPU), (80;90a;120) and (90a): which one each machine takes, without compiling.
    monkeypatch.setenv("KDTREE_OPS_CACHE_DIR", str(tmp_path))
    for var in ("KDTREE_OPS_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST", "KDTREE_OPS_CPU_ONLY"):
        monkeypatch.delenv(var, raising=False)
    key = build._source_key()
    for name, archs in (("cpu", []), ("image", ["120", "80", "90a"]), ("h200", ["90a"]), ("stale", ["86"])):
        folder = tmp_path / f"kdtree_ops_{name}"
        folder.mkdir()
        (folder / "lib.so").write_bytes(b"")
        meta = {"library": "lib.so", "archs": archs, "source_key": key if name != "stale" else "other sources"}
        (folder / "build.json").write_text(json.dumps(meta))
    (tmp_path / "kdtree_ops_unfinished").mkdir()  # a build killed before its manifest: never taken
    (tmp_path / "kdtree_ops_unfinished" / "lib.so").write_bytes(b"")

    def chosen(capabilities, wanted=None):
        return [lib.parent.name for lib, archs in build._complete_builds() if build._serves(archs, wanted, capabilities)][0]

    assert [lib.parent.name for lib, _ in build._complete_builds()] == ["kdtree_ops_cpu", "kdtree_ops_h200",
                                                                         "kdtree_ops_image"]
    assert chosen([]) == "kdtree_ops_cpu"            # no GPU: the smallest build
    assert chosen(["90"]) == "kdtree_ops_h200"       # an H200
    assert chosen(["86", "90"]) == "kdtree_ops_image"  # an A6000 beside it: only the image covers both
    assert chosen(["120"]) == "kdtree_ops_image"
    assert chosen([], wanted=["80", "90a", "120"]) == "kdtree_ops_image"  # CI names its three targets
    monkeypatch.setenv("KDTREE_OPS_CPU_ONLY", "1")
    assert chosen(["90"]) == "kdtree_ops_cpu"        # CPU only asked for: a CPU-only build, GPU or not


def test_import_registers_the_ops_when_a_build_is_cached(ops, tmp_path):
    # The session's build is in the cache: a fresh process registers torch.ops.kdtree.* on `import kdtree_ops`
    # alone, without compiling; with an empty cache the import stays cheap and registers nothing.
    code = ("import sys, time, torch; t = time.monotonic(); import kdtree_ops; "
            "print(hasattr(torch.ops.kdtree, 'tree_verify_attention'), round(time.monotonic() - t, 2))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    registered = run.stdout.split()[0]
    assert registered == "True", run.stdout + run.stderr
    assert "compiling" not in run.stderr
    empty = dict(os.environ, KDTREE_OPS_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=empty)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[0] == "False" and "compiling" not in run.stderr, run.stdout + run.stderr


def test_an_op_before_any_build_says_how_to_load_it(tmp_path):
    """With an empty cache, `torch.ops.kdtree.<op>` after `import kdtree_ops` names the fix (main raised torch's
    bare "'_OpNamespace' 'kdtree' object has no attribute ..."), without compiling anything."""
    code = ("import torch, kdtree_ops\n"
            "try:\n    torch.ops.kdtree.tree_verify_attention\nexcept AttributeError as exc:\n    print(exc)\n")
    empty = dict(os.environ, KDTREE_OPS_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=empty)
    assert run.returncode == 0, run.stderr
    assert "torch.ops.kdtree.tree_verify_attention: the kdtree ops library is not loaded" in run.stdout
    assert "kdtree_ops.load()" in run.stdout and "compiling" not in run.stderr, run.stdout + run.stderr


def test_library_takes_the_process_cxx_runtime(ops):
    # A library without libstdc++ among its needed libraries, or with stream/locale code of its own, formats
    # integers in error messages with another runtime's locale facets: a crash instead of a RuntimeError.
    readelf, nm = shutil.which("readelf"), shutil.which("nm")
    if readelf is None or nm is None:
        pytest.fail("binutils (readelf, nm) are needed to check the library's linkage")
    library = str(build.load())
    needed = subprocess.run([readelf, "-d", library], capture_output=True, text=True, check=True).stdout
    assert "libstdc++.so" in needed, needed
    defined = subprocess.run([nm, "-D", "--defined-only", library], capture_output=True, text=True, check=True).stdout
    own = [line.split()[-1] for line in defined.splitlines() if linkage.RUNTIME_SYMBOL.match(line.split()[-1])]
    assert not own, own[:5]
    with pytest.raises(RuntimeError, match=r"query heads of q \(3\) must be a multiple of the KV heads of k_cache \(2\)"):
        torch.ops.kdtree.tree_verify_attention(
            torch.zeros(1, 3, 8), torch.zeros(4, 2, 8), torch.zeros(4, 2, 8), torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([0, 2], dtype=torch.int32), torch.arange(2, dtype=torch.int32),
            torch.ones(1, 1, dtype=torch.int32), 1.0)


def test_wheel_ships_the_sources(tmp_path):
    # SGLang images install non-editably: the wheel itself must carry csrc/ for the first-use build.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(REPO)], check=True)
    (wheel,) = tmp_path.glob("kdtree_ops-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"kdtree_ops/_csrc/{p.relative_to(REPO / 'csrc')}" for p in (REPO / "csrc").rglob("*") if p.is_file()}
    assert shipped and shipped <= names, sorted(shipped - names)


def test_processes_that_start_together_share_one_build(tmp_path):
    # Two processes, an empty cache: one compiles, the other waits on the lock and loads the same library.
    code = ("import kdtree_ops.ops, torch; from kdtree_ops import build; "
            "print(build.load()); print(torch.ops.kdtree.tree_mask_from_parents.default._schema)")
    env = dict(os.environ, KDTREE_OPS_CACHE_DIR=str(tmp_path), KDTREE_OPS_CPU_ONLY="1")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [p.communicate(timeout=1200) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    libraries = {out.splitlines()[0] for out, _ in results}
    assert len(libraries) == 1
    compiled = sum("compiling" in err for _, err in results)
    assert compiled == 1, [err for _, err in results]  # exactly one process compiled
    assert len(list(tmp_path.glob("kdtree_ops_*/*.so"))) == 1


def test_build_key_ignores_where_the_sources_sit(tmp_path):
    # A checkout and a wheel install of the same sources share one cached build.
    keys = set()
    for place in ("checkout", "site-packages"):
        root = tmp_path / place / "csrc"
        shutil.copytree(REPO / "csrc", root)
        keys.add(build._build_key(root, build._flags(root, []), False))
    assert len(keys) == 1
    (root / "cuda" / "mma.cuh").write_text((root / "cuda" / "mma.cuh").read_text() + "\n// changed\n")
    assert build._build_key(root, build._flags(root, []), False) not in keys  # CUDA headers are sources too


def test_wgmma_header_matches_its_generator(tmp_path):
    # wgmma.cuh's operand lists are written by wgmma_gen.py: an edit of one without the other fails here.
    cuda = REPO / "csrc" / "cuda"
    for name in ("wgmma.cuh", "wgmma_gen.py"):
        shutil.copy(cuda / name, tmp_path / name)
    (tmp_path / "wgmma.cuh").write_text((cuda / "wgmma.cuh").read_text().replace("Wgmma<256>", "Wgmma<0>"))
    subprocess.run([sys.executable, str(tmp_path / "wgmma_gen.py")], check=True)
    assert (tmp_path / "wgmma.cuh").read_text() == (cuda / "wgmma.cuh").read_text()
