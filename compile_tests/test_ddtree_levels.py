"""The level-synchronous tree build's algorithm (kdtree_ops/ddtree/levels_reference.py, the NumPy model of
csrc/cuda/ddtree_build_levels.cu) is bit-equal to the CPU op (the heap's best-first order) on fresh random inputs,
ties included: the kernel's own capacity, and capacities down to the budget itself, which force prunes every
level and tie cuts. This checks the algorithm; compile_tests/test_cuda_ddtree_levels.py checks the kernel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdtree_ops.ddtree import ops as ddtree
from kdtree_ops.ddtree.levels_reference import (build_tree_levels, capacity_for, keep_target, score_keys,
                                                select_cut)
from test_ddtree_ops import assert_trees_equal, drafter_topk, path_count


def random_case(seed: int):
    """(args, budget, name): K in 1..16, k in 1..32, B in 1..3, a budget up to 1100 (at most the paths), and one of
    four kinds of log-probs: a drafter's, rounded to halves (ties everywhere), constant rows (every path of a depth
    ties), or a drafter's with -inf tails."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (), generator=g))  # noqa: E731
    positions, top_k, batch = draw(1, 16), draw(1, 32), draw(1, 3)
    budget = min(path_count(positions, top_k), draw(0, 1100))
    kind = ("drafter", "halves", "constant", "minus_inf")[seed % 4]
    logprobs, tokens, roots = drafter_topk(batch, positions, top_k, ties=kind == "halves", seed=seed)
    if kind == "constant":
        logprobs = torch.full_like(logprobs, -float(draw(1, 3)) / 2)
    if kind == "minus_inf":
        logprobs[..., draw(0, top_k - 1):] = -float("inf")
    return (logprobs, tokens, roots), budget, f"K{positions}-k{top_k}-B{batch}-n{budget}-{kind}"


SEEDS = range(48)


# capacity -> the least the cases must exercise: prunes, tie cuts inside prunes, tie cuts in the final cut. With C =
# budget no final cut is left to make (what is stored never exceeds the budget).
COVERAGE = {"kernel": (40, 10, 10), "budget": (100, 50, 0), "budget+1": (100, 50, 1), "2*budget": (60, 10, 10)}


@pytest.mark.parametrize("capacity", list(COVERAGE))
def test_levels_model_matches_the_cpu_op(capacity):
    """Every case bit-equal to the CPU op; the cases together took every path of the algorithm."""
    stats = {}
    for seed in SEEDS:
        args, budget, name = random_case(seed)
        cap = {"kernel": None, "budget": budget, "budget+1": budget + 1, "2*budget": 2 * budget}[capacity]
        got = build_tree_levels(*args, budget, capacity=cap, stats=stats)
        want = ddtree.build_tree(*args, budget)
        for field, g, w in zip(("tree_tokens", "parents", "depths", "tree_mask"), got, want):
            assert torch.equal(g, w), f"{name}, capacity {capacity}: {field} differs"
    least = COVERAGE[capacity]
    assert all(stats[k] >= n for k, n in zip(("prunes", "prune_tie_cuts", "final_tie_cuts"), least)), stats


def test_levels_model_at_the_benchmark_shapes():
    """K = 16, top-k 8 and 32, budgets 16..1023 and 2047 (the kernel's largest), a drafter's and tied log-probs."""
    for seed, (top_k, budget, ties) in enumerate([(8, 16, False), (32, 64, True), (8, 256, True), (32, 256, False),
                                                  (8, 1023, False), (32, 1023, True), (32, 2047, False)]):
        args = drafter_topk(2, 16, top_k, ties=ties, seed=100 + seed)
        assert_trees_equal(build_tree_levels(*args, budget), ddtree.build_tree(*args, budget))


def test_levels_model_constant_rows_force_a_tie_cut_in_a_prune():
    """Every log-prob -1: 32 paths tie at depth 1, 1024 at depth 2. Budget 100 (C = 400, Ct = 150) overflows at
    depth 2 with 1056 candidates and the 100th key's ties run to 1056: the prune keeps depth 1 and the first 68
    depth-2 paths in rank order, exactly the heap's."""
    logprobs = torch.full((1, 3, 32), -1.0)
    tokens = torch.arange(96).reshape(1, 3, 32)
    roots = torch.tensor([5])
    stats = {}
    got = build_tree_levels(logprobs, tokens, roots, 100, stats=stats)
    assert stats["prunes"] == 1 and stats["prune_tie_cuts"] == 1, stats
    assert_trees_equal(got, ddtree.build_tree(logprobs, tokens, roots, 100))
    assert got[2][0].tolist() == [0] + [1] * 32 + [2] * 68


@pytest.mark.parametrize("seed", range(6))
def test_select_cut_keeps_a_head_of_at_least_the_budget(seed):
    """The cut keeps >= budget keys, all >= every dropped one; <= target unless it is the exact tie cut."""
    rng = np.random.default_rng(seed)
    keys = score_keys(-rng.choice(np.float32([0.0, 0.5, 1.0, 1.5, 7.25, 1e-30, np.inf]), 3000)
                      if seed % 2 else -rng.exponential(4.0, 3000).astype(np.float32))
    for budget in (1, 2, 50, 999, 3000):
        for target in (budget, budget + budget // 2, 3000):
            u, m, _ = select_cut(keys, budget, target)
            kept = (keys > u).sum() + m
            assert m <= (keys == u).sum() and kept >= budget
            assert kept <= target or (m > 0 and kept == budget)
            assert m == 0 or (keys > u).sum() < budget  # a tie cut only where the keys above fall short


def test_capacity_constants():
    """C = 4 * budget up to 4096 (4 stored nodes a thread of 1024), Ct = 1.5 * budget up to C: the kernel's."""
    assert [capacity_for(n) for n in (1, 256, 1024, 1025, 2047)] == [4, 1024, 4096, 4096, 4096]
    assert keep_target(256, 1024) == 384 and keep_target(2047, 4096) == 3070 and keep_target(1, 4) == 1
