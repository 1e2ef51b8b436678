"""The binary wheel (`python -m kdtree_ops build --wheel`): hatchling's wheel of the checkout plus the library this
session built (CPU and, in CI, sm_80, sm_90a, sm_120), named and pinned for this torch; installed into a fresh
virtual environment with no compiler on PATH it registers every op without compiling and answers `has_kernel_for`
as the JIT build does; a wheel for another torch, other sources or other GPUs is passed over in one line and the
JIT build takes over."""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from kdtree_ops import build, prebuilt, wheel
from kdtree_ops.testing.wheel_venv import make_wheel_venv

REPO = Path(__file__).resolve().parent.parent
OPS = ("tree_verify_attention", "tree_verify_attention_out", "tree_mask_from_parents", "tree_mask_from_dense",
       "record_divergence", "ddtree_sample_targets")

# What a process reports about the library it loaded: the same code runs here (the JIT build) and in the venv.
REPORT = """
import json, shutil, time
import torch
t = time.monotonic()
import kdtree_ops.ops as ops
from kdtree_ops import build
from kdtree_ops.testing.reference import tree_verify_attention_reference
from kdtree_ops.testing.trees import random_tree

def report():
    configs = [(device, dtype, dqk, dv, hkv, kv) for device in ("cpu", "cuda")
               for dtype in (torch.float32, torch.bfloat16, torch.float16)
               for dqk, dv, hkv in ((64, 64, 2), (128, 128, 8), (256, 256, 1), (576, 512, 1), (96, 96, 2))
               for kv in (None, torch.float8_e4m3fn)]
    return {"archs": build.built_archs(), "families": ops.verified_families(),
            "answers": [ops.kernel_unsupported_reason(*c) for c in configs],
            "registered": {op: [torch._C._dispatch_has_kernel_for_dispatch_key(f"kdtree::{op}", key)
                                for key in ("CPU", "CUDA", "Meta")] for op in %r}}

def first_call():
    torch.manual_seed(0)
    T, L, Hq, Hkv, D = 16, 100, 8, 2, 64
    parents = torch.tensor(random_tree(T), dtype=torch.int32)
    qo, kv = torch.tensor([0, T], dtype=torch.int32), torch.tensor([0, L + T], dtype=torch.int32)
    mask = torch.ops.kdtree.tree_mask_from_parents(parents, qo, 1)
    q, k, v = torch.randn(T, Hq, D), torch.randn(L + T, Hkv, D), torch.randn(L + T, Hkv, D)
    args = (q, k, v, qo, kv, torch.randperm(L + T, dtype=torch.int32), mask, D**-0.5)
    out = torch.ops.kdtree.tree_verify_attention(*args)
    return (out.double() - tree_verify_attention_reference(*args)).abs().max().item()

if __name__ == "__main__":
    error = first_call()
    print("REPORT", json.dumps({"seconds": time.monotonic() - t, "error": error, "library": str(build.load()),
                                "package": ops.__file__, "tools": [shutil.which(x) for x in ("c++", "nvcc", "ninja")],
                                **report()}))
""" % (OPS,)


def _run(python: Path | str, env: dict, code: str = REPORT, cwd: Path | None = None) -> tuple[dict | None, str]:
    """Runs `code` under `python` in `cwd` (not the checkout, whose kdtree_ops would shadow the installed one);
    returns (its REPORT line's object or None, its stderr)."""
    run = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    line = [x for x in run.stdout.splitlines() if x.startswith("REPORT ")]
    return (json.loads(line[0].removeprefix("REPORT ")) if line else None), run.stderr


@pytest.fixture(scope="module")
def binary_wheel(ops, tmp_path_factory) -> Path:
    """The README's command, for the targets of this session's build (CI's: the cached build is packed, nothing is
    compiled again)."""
    out = tmp_path_factory.mktemp("dist")
    archs = ["--archs", ";".join(build.built_archs())] if build.built_archs() else []
    run = subprocess.run([sys.executable, "-m", "kdtree_ops", "build", "--wheel", *archs, "--out", str(out)],
                         capture_output=True, text=True, timeout=900, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert "compiling" not in run.stderr, run.stderr
    (path,) = out.glob("*.whl")
    print(run.stdout.strip())
    return path


@pytest.fixture(scope="module")
def venv(binary_wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment that sees this Python's packages (torch, numpy, ninja: nothing is downloaded)
    with the binary wheel installed, offline, by pip's ordinary resolution of its pinned requirements."""
    root = tmp_path_factory.mktemp("venv")
    make_wheel_venv(root, binary_wheel)
    return root


def _bare_env(venv: Path, cache: Path) -> dict:
    """The venv's bin/ alone on PATH (no c++, nvcc or ninja), no CUDA toolkit named, the given build cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CXX", "CC", "PYTHONPATH")}
    return {**env, "PATH": str(venv / "bin"), "KDTREE_OPS_CACHE_DIR": str(cache)}


def _installed_manifest(venv: Path) -> Path:
    (manifest,) = venv.glob(f"lib/python*/site-packages/kdtree_ops/_prebuilt/{prebuilt.MANIFEST}")
    return manifest


def test_the_wheel_is_hatchlings_wheel_plus_the_library_pinned_to_this_torch(binary_wheel, tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)], check=True)
    (pure,) = tmp_path.glob("kdtree_ops-*.whl")
    pure_zip, binary_zip = zipfile.ZipFile(pure), zipfile.ZipFile(binary_wheel)
    release, variant = torch.__version__.split("+")[0], "cu" + torch.version.cuda.replace(".", "") if torch.version.cuda else "cpu"
    version = f"0.1.0+torch{release}.{variant}"
    assert binary_wheel.name == f"kdtree_ops-{version}-py3-none-{wheel.platform_tag()}.whl"
    info, pure_info = f"kdtree_ops-{version}.dist-info", "kdtree_ops-0.1.0.dist-info"
    library = build.load()
    prebuilt_files = {f"kdtree_ops/_prebuilt/{library.name}", "kdtree_ops/_prebuilt/build.json"}
    expected = {n.replace(pure_info, info) for n in pure_zip.namelist()} | prebuilt_files
    assert set(binary_zip.namelist()) == expected
    for name in pure_zip.namelist():
        if not name.startswith(pure_info):
            assert binary_zip.read(name) == pure_zip.read(name), name
    assert binary_zip.read(f"kdtree_ops/_prebuilt/{library.name}") == library.read_bytes()
    meta = json.loads(binary_zip.read("kdtree_ops/_prebuilt/build.json"))
    assert (meta["archs"], meta["torch"], meta["cuda"]) == (build.built_archs(), torch.__version__, torch.version.cuda)
    assert binary_zip.read(f"{info}/entry_points.txt") == pure_zip.read(f"{pure_info}/entry_points.txt")
    header = {}
    for name, archive, folder in (("pure", pure_zip, pure_info), ("binary", binary_zip, info)):
        text = archive.read(f"{folder}/METADATA").decode()
        fields, _, header[name + " body"] = text.partition("\n\n")
        header[name] = sorted(line for line in fields.splitlines()
                              if not line.startswith(("Metadata-Version", "Version", "Requires-Dist: torch")))
        header[name + " torch"] = re.findall(r"(?m)^Requires-Dist: torch\b.*$", text)
    assert header["binary"] == header["pure"] and header["binary body"] == header["pure body"]
    assert header["binary torch"] == [f"Requires-Dist: torch=={release}"], header["binary torch"]
    tags = binary_zip.read(f"{info}/WHEEL").decode()
    assert f"Tag: py3-none-{wheel.platform_tag()}" in tags and "Root-Is-Purelib: false" in tags
    record = binary_zip.read(f"{info}/RECORD").decode().splitlines()
    assert sorted(line.split(",")[0] for line in record) == sorted(binary_zip.namelist())


def test_installed_wheel_registers_every_op_without_a_compiler(ops, venv, tmp_path):
    # The JIT build's own report, then the venv's: PATH holds no compiler and the cache is empty, so any build
    # would fail or leave a folder there.
    jit, _ = _run(sys.executable, {**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    cache = tmp_path / "empty_cache"
    installed, stderr = _run(venv / "bin" / "python", _bare_env(venv, cache), cwd=tmp_path)
    print(f"import kdtree_ops.ops to the first op call: wheel {installed['seconds']:.2f} s, "
          f"JIT (cached build) {jit['seconds']:.2f} s")
    assert installed["tools"] == [None, None, None]
    assert installed["package"].startswith(str(venv)), installed["package"]
    assert Path(installed["library"]).parent == _installed_manifest(venv).parent, installed["library"]
    assert "compiling" not in stderr and "prebuilt" not in stderr, stderr
    assert not cache.exists() or not any(cache.iterdir()), list(cache.iterdir())
    assert all(keys[0] and keys[2] and keys[1] == bool(jit["archs"]) for keys in installed["registered"].values()), \
        installed["registered"]
    for field in ("archs", "families", "answers", "registered"):
        assert installed[field] == jit[field], field
    assert installed["error"] < 1e-4 and jit["error"] < 1e-4, (installed["error"], jit["error"])


def test_a_wheel_for_another_torch_falls_back_to_the_jit_build_in_one_line(ops, venv, tmp_path):
    # The installed copy's manifest edited to name another torch: the prebuilt library is not loaded; with an empty
    # cache the import registers nothing (load() would compile), with the JIT cache it takes the JIT build.
    manifest = _installed_manifest(venv)
    original = manifest.read_text()
    meta = json.loads(original)
    manifest.write_text(json.dumps({**meta, "torch": "2.13.0+cu126", "cuda": "12.6"}))
    try:
        code = "import json, kdtree_ops; from kdtree_ops import build; print('REPORT', json.dumps(build._loaded_library is None))"
        loaded_nothing, stderr = _run(venv / "bin" / "python", _bare_env(venv, tmp_path / "empty"), code, tmp_path)
        assert loaded_nothing is True
        lines = [line for line in stderr.splitlines() if "prebuilt" in line]
        other = prebuilt.describe({**meta, "torch": "2.13.0+cu126"})
        assert lines == [f"kdtree_ops: not using the wheel's prebuilt library ({other}): it was built against torch "
                         f"2.13.0+cu126 (CUDA 12.6) and this process runs torch {torch.__version__} (CUDA "
                         f"{torch.version.cuda or 'none'}); a C++ extension runs only with the torch it was compiled "
                         "against (install the wheel built for this torch); taking a JIT build instead (compiled into "
                         "the cache on first use)"], stderr
        jit_cache = build.load().parent.parent
        fallback, stderr = _run(venv / "bin" / "python", _bare_env(venv, jit_cache), cwd=tmp_path)
        assert Path(fallback["library"]).parent.parent == jit_cache, fallback["library"]
        assert sum("not using the wheel's prebuilt library" in line for line in stderr.splitlines()) == 1, stderr
        assert "compiling" not in stderr and fallback["error"] < 1e-4
    finally:
        manifest.write_text(original)


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A prebuilt folder and a cache with a CPU-only and an sm_90a build of these sources; _register records."""
    for var in ("KDTREE_OPS_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST", "KDTREE_OPS_CPU_ONLY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KDTREE_OPS_CACHE_DIR", str(tmp_path / "cache"))
    key = build._source_key()
    for name, archs in (("cpu", []), ("h200", ["90a"])):
        folder = tmp_path / "cache" / f"kdtree_ops_{name}"
        folder.mkdir(parents=True)
        (folder / "lib.so").write_bytes(b"")
        (folder / "build.json").write_text(json.dumps({"library": "lib.so", "archs": archs, "source_key": key}))
    folder = tmp_path / "_prebuilt"
    folder.mkdir()
    (folder / "wheel.so").write_bytes(b"")
    monkeypatch.setattr(prebuilt, "PREBUILT_DIR", folder)
    monkeypatch.setattr(build, "_register", lambda library: library)
    build._note_once.cache_clear()

    def ship(**changes):
        meta = {"library": "wheel.so", "archs": ["120", "80", "90a"], "source_key": key, **prebuilt.torch_build()}
        (folder / "build.json").write_text(json.dumps({**meta, **changes}))

    return ship


@pytest.mark.parametrize("changes, capabilities, taken, reason", [
    ({}, [], "_prebuilt", ""),                  # no GPU: the wheel's library before the cache's CPU-only build
    ({}, ["90", "86"], "_prebuilt", ""),        # an H200 and an A6000: sm_90a and sm_80 code
    ({"archs": ["80"]}, ["90"], "kdtree_ops_h200", "it has no code for the GPU(s) sm_90"),
    ({"torch": "2.13.0+cu130"}, [], "kdtree_ops_cpu", "it was built against torch 2.13.0+cu130"),
    ({"cuda": "12.8"}, [], "kdtree_ops_cpu", "(CUDA 12.8) and this process runs"),
    ({"source_key": "0123"}, [], "kdtree_ops_cpu", "built from other sources than this installation's"),
    ({"library": "gone.so"}, [], "kdtree_ops_cpu", "its library"),
])
def test_the_prebuilt_library_serves_when_it_matches_else_one_line_says_why(shipped, capsys, changes, capabilities,
                                                                          taken, reason):
    shipped(**changes)
    library = build._load_built(None, capabilities)
    assert library.parent.name == taken
    lines = capsys.readouterr().err.splitlines()
    if reason:
        assert len(lines) == 1 and reason in lines[0] and "taking a JIT build instead" in lines[0], lines
    else:
        assert lines == []


def test_a_prebuilt_library_that_does_not_load_falls_back(shipped, capsys, monkeypatch):
    # dlopen fails (e.g. an older C library than the build machine's): the JIT build takes over, the line says why.
    shipped()

    def register(library):
        if library.parent.name == "_prebuilt":
            raise OSError("version `GLIBC_2.99' not found")
        return library

    monkeypatch.setattr(build, "_register", register)
    assert build._load_built(None, []).parent.name == "kdtree_ops_cpu"
    assert "it did not load (version `GLIBC_2.99' not found)" in capsys.readouterr().err


def test_a_checkout_has_no_prebuilt_library():
    # A source install keeps JIT: only a binary wheel carries _prebuilt/ (wheel.py adds it; a checkout has none).
    assert prebuilt.PREBUILT_DIR == REPO / "kdtree_ops" / "_prebuilt" and prebuilt.shipped() is None
