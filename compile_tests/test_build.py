"""The JIT build: CUDA kernels compiled wherever the toolkit is, sources shipped in the wheel, one build shared
by processes that start together (SGLang's TP ranks)."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import torch

from kdtree_ops import build

REPO = Path(__file__).resolve().parent.parent
OPS = ("tree_verify_attention", "tree_verify_attention_out", "tree_mask_from_parents", "tree_mask_from_dense",
       "record_divergence")


def _has_kernel(op: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"kdtree::{op}", key)


def test_cuda_kernels_built_exactly_when_the_toolkit_is_there(ops):
    # CI has no GPU but has nvcc: the CUDA kernels must have compiled (sm_80, sm_90a, sm_120) and registered.
    for op in OPS:
        assert _has_kernel(op, "CPU"), op
        assert _has_kernel(op, "CUDA") == build.with_cuda(), (op, build.with_cuda())


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
        keys.add(build._build_key(build._sources(root, False), root, build._flags(root, []), False))
    assert len(keys) == 1
    (root / "ops.cpp").write_text((root / "ops.cpp").read_text() + "\n// changed\n")
    assert build._build_key(build._sources(root, False), root, build._flags(root, []), False) not in keys


def test_wgmma_header_matches_its_generator(tmp_path):
    # wgmma.cuh's operand lists are written by wgmma_gen.py: an edit of one without the other fails here.
    cuda = REPO / "csrc" / "cuda"
    for name in ("wgmma.cuh", "wgmma_gen.py"):
        shutil.copy(cuda / name, tmp_path / name)
    (tmp_path / "wgmma.cuh").write_text((cuda / "wgmma.cuh").read_text().replace("Wgmma<256>", "Wgmma<0>"))
    subprocess.run([sys.executable, str(tmp_path / "wgmma_gen.py")], check=True)
    assert (tmp_path / "wgmma.cuh").read_text() == (cuda / "wgmma.cuh").read_text()
