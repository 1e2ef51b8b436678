"""The level-synchronous CUDA tree build's own kernel source (csrc/cuda/ddtree_build_levels.cu), run on the host
under a SIMT emulation (compile_tests/simt_emulation/simt.h: a thread per CUDA thread, barriers for __syncthreads,
warp intrinsics as exchanges among the warp's 32 threads), bit-equal to the CPU op; under ThreadSanitizer, no
shared-memory access unordered by a barrier. This runs the kernel's indexing, scans, prunes and sort where no GPU
is; it says nothing of timing or of the compiled device code, which compile_tests/test_cuda_ddtree_levels.py
checks on the GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from kdtree_ops.ddtree import ops as ddtree
from test_ddtree_levels import random_case
from test_ddtree_ops import drafter_topk

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "csrc" / "cuda" / "ddtree_build_levels.cu"
HARNESS = Path(__file__).resolve().parent / "simt_emulation"
# The kernel and its helpers: from the namespace's opening to the host-side launch code.
BEGIN, END = "namespace kdtree::cuda {", "bool serial_build_forced()"
SHARED_DECLARATION = "extern __shared__ __align__(16) char smem[];"


def kernel_header() -> str:
    source = KERNEL.read_text()
    assert BEGIN in source and END in source and SHARED_DECLARATION in source, (
        f"{KERNEL.name} no longer has the markers this harness cuts at: {BEGIN!r}, {END!r}, {SHARED_DECLARATION!r}")
    body = source[source.index(BEGIN):source.index(END)].replace(SHARED_DECLARATION, "char* smem = g_dynamic_smem;")
    return ('#include "simt.h"\n#include "ddtree_order.h"\n#include "cuda/block_primitives.cuh"\n'
            'inline char* g_dynamic_smem;  // the dynamic shared memory\n'
            + body + "}  // namespace\n}  // namespace kdtree::cuda\n")


def compile_harness(out: Path, *flags: str) -> Path:
    compiler = shutil.which("c++") or shutil.which("g++")
    assert compiler, "no C++ compiler on PATH (the library's own build needs one too)"
    (out / "levels_kernel.h").write_text(kernel_header())
    binary = out / ("run_levels" + "".join(f.strip("-=") for f in flags))
    command = [compiler, "-std=c++20", "-O1", "-pthread", *flags, f"-I{out}", f"-I{HARNESS}", f"-I{ROOT / 'csrc'}",
               str(HARNESS / "run_levels.cpp"), "-o", str(binary)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{' '.join(command)}\n{run.stderr[-4000:]}"
    return binary


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    return compile_harness(tmp_path_factory.mktemp("levels_emulated"))


def run_emulated(binary: Path, logprobs, tokens, roots, budget, env=None):
    batch, positions, top_k = logprobs.shape
    data = (f"{batch} {positions} {top_k} {budget}\n".encode() + logprobs.numpy().astype(np.float32).tobytes()
            + tokens.numpy().astype(np.int64).tobytes() + roots.numpy().astype(np.int64).tobytes())
    run = subprocess.run([str(binary)], input=data, capture_output=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr.decode()[-4000:]
    nodes, words = budget + 1, (budget + 32) // 32
    sizes = [(np.int64, batch * nodes), (np.int32, batch * nodes), (np.int32, batch * nodes),
             (np.int32, batch * nodes * words)]
    outputs, offset = [], 0
    for dtype, count in sizes:
        outputs.append(torch.from_numpy(np.frombuffer(run.stdout, dtype, count, offset).copy()))
        offset += count * np.dtype(dtype).itemsize
    assert offset == len(run.stdout)
    shapes = [(batch, nodes)] * 3 + [(batch * nodes, words)]
    return [o.view(shape) for o, shape in zip(outputs, shapes)], run.stderr.decode()


def inputs(positions, top_k, kind, seed, batch=2):
    logprobs, tokens, roots = drafter_topk(batch, positions, top_k, ties=kind == "halves", vocab=32000, seed=seed)
    if kind == "constant":
        logprobs = torch.full_like(logprobs, -1.0)
    if kind == "minus_inf":
        logprobs[..., top_k // 3:] = -float("inf")
    return logprobs, tokens, roots


def assert_equal_to_cpu_op(got, args, budget, label):
    for field, g, w in zip(("tree_tokens", "parents", "depths", "tree_mask"), got, ddtree.build_tree(*args, budget)):
        assert torch.equal(g, w), f"{label}: {field} differs from the CPU op"


# Both thread configurations (256 up to budget 256, else 1024), the sort in pairs past 1024 (1800, 2047), ties.
SHAPES = [(16, 8, 16, "drafter"), (16, 32, 100, "constant"), (16, 8, 255, "halves"), (16, 32, 256, "drafter"),
          (16, 8, 257, "minus_inf"), (16, 32, 1023, "halves"), (16, 8, 1024, "drafter"), (16, 32, 1800, "halves"),
          (16, 8, 2047, "constant"), (3, 5, 155, "constant"), (1, 40, 40, "drafter")]


@pytest.mark.parametrize("shape", SHAPES, ids=["-".join(map(str, s)) for s in SHAPES])
def test_emulated_kernel_matches_the_cpu_op(emulated, shape):
    positions, top_k, budget, kind = shape
    args = inputs(positions, top_k, kind, seed=budget)
    got, _ = run_emulated(emulated, *args, budget)
    assert_equal_to_cpu_op(got, args, budget, str(shape))


def test_emulated_kernel_on_random_cases(emulated):
    """test_ddtree_levels' random cases (K, k, B, kinds of ties) where the budget is at most 256: 256 threads."""
    cases = [c for c in map(random_case, range(60)) if c[1] <= 256][:16]
    assert len(cases) >= 10
    for args, budget, name in cases:
        got, _ = run_emulated(emulated, *args, budget)
        assert_equal_to_cpu_op(got, args, budget, name)


def test_emulated_kernel_has_no_unordered_shared_memory_access(tmp_path):
    """ThreadSanitizer over runs with prunes and tie cuts, in both thread configurations: no race reported."""
    binary = compile_harness(tmp_path, "-fsanitize=thread", "-g")
    for shape in [(16, 32, 100, "constant"), (16, 8, 200, "halves"), (16, 8, 300, "halves")]:
        positions, top_k, budget, kind = shape
        args = inputs(positions, top_k, kind, seed=budget, batch=1)
        got, log = run_emulated(binary, *args, budget, env={"TSAN_OPTIONS": "halt_on_error=1"})
        assert "ThreadSanitizer" not in log, log[-4000:]
        assert_equal_to_cpu_op(got, args, budget, str(shape))
