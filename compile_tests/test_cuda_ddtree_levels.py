"""The level-synchronous CUDA tree build (csrc/cuda/ddtree_build_levels.cu) bit-equal to the CPU op on fresh random
inputs: budgets 16..1023 and up to its largest, 2047 (the sort in shared-memory pairs past 1024), batches of 3,
a drafter's log-probs and forced ties (halves, constant rows, -inf tails), in and out of a CUDA graph; outputs
poisoned first. Inputs are checked to take the kernel's prune and tie-cut paths (its NumPy model,
kdtree_ops/ddtree/levels_reference.py, says which an input takes), the kernel is checked to be the one that ran
(profiler), and the serial kernel (KDTREE_OPS_SERIAL_TREE_BUILD=1) and shapes past the level build's limits give the
same trees. The build is gated until verified: these tests lift the gate as the GPU suite does."""

from __future__ import annotations

import pytest
import torch

from kdtree_ops.ddtree import ops as ddtree
from kdtree_ops.ddtree.levels_reference import build_tree_levels
from test_ddtree_ops import drafter_topk

pytestmark = pytest.mark.cuda

BATCH = 3


@pytest.fixture(autouse=True)
def level_build(monkeypatch):
    monkeypatch.setenv("KDTREE_OPS_UNVERIFIED", "1")
    monkeypatch.delenv("KDTREE_OPS_SERIAL_TREE_BUILD", raising=False)


def inputs(positions, top_k, kind, seed):
    logprobs, tokens, roots = drafter_topk(BATCH, positions, top_k, ties=kind == "halves", vocab=32000, seed=seed)
    if kind == "constant":  # every path of a depth ties: prunes cut among ties
        logprobs = torch.full_like(logprobs, -1.0)
    if kind == "minus_inf":
        logprobs[..., top_k // 3:] = -float("inf")
    return logprobs, tokens, roots


def poison_outputs(budget):
    """Leaves the caching allocator's next blocks of the outputs' sizes filled with a poison pattern, so a value the
    kernel fails to write shows instead of an earlier call's right answer."""
    nodes = budget + 1
    shapes = [((BATCH, nodes), torch.int64), ((BATCH, nodes), torch.int32), ((BATCH, nodes), torch.int32),
              ((BATCH * nodes, (nodes + 31) // 32), torch.int32)]
    blocks = [torch.full(shape, -7777, dtype=dtype, device="cuda") for shape, dtype in shapes]
    del blocks


def check_equal(args, budget, label):
    on_device = [a.cuda() for a in args]
    poison_outputs(budget)
    got = ddtree.build_tree(*on_device, budget)
    want = ddtree.build_tree(*args, budget)
    for field, g, w in zip(("tree_tokens", "parents", "depths", "tree_mask"), got, want):
        assert torch.equal(g.cpu(), w), f"{label}: {field} differs from the CPU op"


# (K, top-k, budget, kind): the benchmark's shapes, budgets across 16..1023 (both thread configurations: <= 256 and
# above), 2047, and the forced ties.
SHAPES = [(16, 8, 16, "drafter"), (16, 32, 16, "halves"), (16, 8, 63, "drafter"), (16, 32, 100, "constant"),
          (16, 8, 255, "halves"), (16, 32, 256, "drafter"), (16, 8, 257, "minus_inf"), (16, 32, 511, "halves"),
          (16, 8, 777, "constant"), (16, 32, 1000, "drafter"), (16, 8, 1023, "halves"), (16, 32, 1023, "drafter"),
          (16, 32, 1024, "minus_inf"), (16, 32, 1800, "halves"), (16, 8, 2047, "drafter"), (6, 3, 500, "halves"),
          (3, 5, 155, "constant"), (1, 40, 40, "drafter")]


@pytest.mark.parametrize("shape", SHAPES, ids=["-".join(map(str, s)) for s in SHAPES])
def test_level_build_matches_the_cpu_op(shape):
    positions, top_k, budget, kind = shape
    for seed in range(3):  # fresh inputs a seed
        check_equal(inputs(positions, top_k, kind, seed=1000 * seed + budget), budget, f"{shape} seed {seed}")


def test_the_shapes_take_every_path_of_the_kernel():
    """Prunes, tie cuts inside prunes and in the final cut all occur among SHAPES (by the kernel's model)."""
    stats = {}
    for positions, top_k, budget, kind in SHAPES:
        build_tree_levels(*inputs(positions, top_k, kind, seed=budget), budget, stats=stats)
    assert stats["prunes"] >= 10 and stats["prune_tie_cuts"] >= 1 and stats["final_tie_cuts"] >= 1, stats


def kernel_names(call) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if "build" in e.name and "kernel" in e.name]


def test_the_level_build_runs_and_the_switch_selects_the_serial_one(monkeypatch):
    args = [a.cuda() for a in inputs(16, 32, "halves", seed=7)]
    names = kernel_names(lambda: ddtree.build_tree(*args, 300))
    assert any("build_levels_kernel" in n for n in names), names
    level = ddtree.build_tree(*args, 300)
    monkeypatch.setenv("KDTREE_OPS_SERIAL_TREE_BUILD", "1")
    names = kernel_names(lambda: ddtree.build_tree(*args, 300))
    assert names and not any("build_levels_kernel" in n for n in names), names
    for g, w in zip(level, ddtree.build_tree(*args, 300)):
        assert torch.equal(g, w)

def test_the_gate_runs_the_serial_kernel_while_the_level_build_is_unverified(ops, monkeypatch):
    monkeypatch.setenv("KDTREE_OPS_UNVERIFIED", "0")
    entry = [f for f in ops.verified_families() if f["family"] == "ddtree_build_tree levels"]
    assert len(entry) == 1, "the level build is missing from the verified-families table"
    args = [a.cuda() for a in inputs(16, 8, "drafter", seed=8)]
    ran_levels = any("build_levels_kernel" in n for n in kernel_names(lambda: ddtree.build_tree(*args, 200)))
    assert ran_levels == entry[0]["verified"][ops.cuda_launch_class("cuda")]


def test_shapes_past_the_level_build_fall_back_to_the_serial_kernel():
    """top-k 300 (> 256) and budget 2048 (> 2047): the serial kernel, the same trees."""
    for positions, top_k, budget in ((2, 300, 500), (16, 8, 2048)):
        args = inputs(positions, top_k, "halves", seed=budget)
        assert not any("build_levels_kernel" in n
                       for n in kernel_names(lambda: ddtree.build_tree(*[a.cuda() for a in args], budget)))
        check_equal(args, budget, f"K={positions} k={top_k} budget {budget}")


def test_level_build_in_a_graph_with_new_inputs_each_replay():
    """Captured once at budget 1023, replayed with new log-probs of every kind: each replay equal to the CPU op."""
    budget = 1023
    buffers = [a.cuda() for a in inputs(16, 32, "drafter", seed=1)]
    ddtree.build_tree(*buffers, budget)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = ddtree.build_tree(*buffers, budget)
    for seed, kind in enumerate(("halves", "constant", "minus_inf", "drafter")):
        new = inputs(16, 32, kind, seed=50 + seed)
        for buffer, value in zip(buffers, new):
            buffer.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        for field, g, w in zip(("tree_tokens", "parents", "depths", "tree_mask"), outputs, ddtree.build_tree(*new,
                                                                                                            budget)):
            assert torch.equal(g.cpu(), w), f"replay {kind}: {field}"
