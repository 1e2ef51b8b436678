"""The parallel CUDA tree build's algorithm (csrc/cuda/ddtree_build_levels.cu) step for step in NumPy: the model
that compile_tests/test_ddtree_levels.py holds bit-equal to the CPU op (it checks the algorithm, not the kernel),
and that the GPU test asks which of the kernel's paths an input takes.

Why it is exact. The op's order on paths is (score descending, depth ascending, rank tuple ascending), a total
order in which every path sorts after its parent (a child's score is its parent's plus a log-prob <= 0, rounded
to float32: never higher; a tie goes to the shallower) and after its lower-ranked siblings (rows are sorted
descending; a tie goes to the smaller rank). So the best-first heap pops the `budget` first paths of that order,
and any set that holds those paths, sorted by that order, gives the heap's tree. The build:

1. Level by level, depth d -> d+1: every stored node of depth d counts its children whose order key (the score's
   order-preserving uint32, ddtree_order.h) is >= the threshold t. Those children are a prefix of its row, so the
   count is a binary search. The children are stored after the level in parent order, then rank order: each
   level's nodes stay in rank-tuple order, so storage order is (depth, rank tuple) order.
2. When the level would overflow the capacity C, the stored nodes and the level's candidates are cut to a best
   set of at least `budget` of them (a prune): a radix selection on the keys (11, 11, then 10 bits from the top)
   finds the budget-th largest key, stopping early once the count at or above a bucket's lowest key is at most
   the target Ct (then everything at or above it stays: "key > u" with u = that key - 1). Where even the exact
   key leaves more than Ct (ties), the nodes above it stay and of those equal to it the first m in storage order
   (= the op's order among equal scores). Either way what stays is a head of the op's order over stored and
   candidate nodes, holding at least `budget`, so it holds every one of the `budget` best paths seen so far; the
   threshold becomes max(t, u + 1): a deeper path equal to u sorts after every node kept at u.
3. After the last level the same selection with Ct = budget cuts to exactly `budget` nodes, and a sort by
   (key descending, storage index ascending) gives the op's order.

Start: t = 1, which every key passes (-inf's key is 0x007FFFFF; 0 means "no entry").
"""

from __future__ import annotations

import numpy as np
import torch


__all__ = ["RADIX_DIGITS", "capacity_for", "keep_target", "score_keys", "select_cut", "build_tree_levels",
           "level_paths"]

RADIX_DIGITS = ((21, 11), (10, 11), (0, 10))  # (shift, bits) of the selection's passes, top bits first
MAX_CAPACITY = 4096  # stored nodes: 4 per thread of the kernel's 1024-thread configuration


def capacity_for(budget: int) -> int:
    """C: the nodes the kernel stores at most (kLevelsCapacity in the kernel: 4 * budget, at most 4096)."""
    return min(4 * budget, MAX_CAPACITY)


def keep_target(budget: int, capacity: int) -> int:
    """Ct: a prune keeps at most this many nodes unless ties force the exact cut (budget * 1.5, at most C)."""
    return min(capacity, budget + budget // 2)


def score_keys(scores: np.ndarray) -> np.ndarray:
    """ddtree_score_key of float32 scores: uint32, a higher score a larger key, -0 and +0 one key."""
    bits = np.ascontiguousarray(scores, dtype=np.float32).view(np.uint32).copy()
    bits[bits == 0x80000000] = 0
    return np.where(bits & 0x80000000, ~bits, bits | 0x80000000).astype(np.uint32)


def select_cut(keys: np.ndarray, budget: int, target: int) -> tuple[int, int, int]:
    """(u, m, passes): keep the keys > u and the first m equal to u. At least `budget` stay (budget <= len(keys));
    at most `target` unless the budget-th key's ties force the exact cut, which keeps exactly `budget`."""
    prefix, prefix_mask, above = 0, 0, 0
    for index, (shift, bits) in enumerate(RADIX_DIGITS):
        digit_mask = (1 << bits) - 1
        selected = keys[(keys & np.uint32(prefix_mask)) == np.uint32(prefix)]
        hist = np.bincount((selected >> np.uint32(shift)) & np.uint32(digit_mask), minlength=1 << bits)
        higher = np.concatenate([np.cumsum(hist[::-1])[::-1][1:], [0]])  # count in the buckets above each
        bucket = int(np.flatnonzero(above + higher + hist >= budget)[-1])  # the lowest bucket still short of it
        at_or_above = above + int(higher[bucket]) + int(hist[bucket])
        lowest = prefix | (bucket << shift)  # the smallest key of the bucket
        if at_or_above <= target:
            return lowest - 1, 0, index + 1
        if index == len(RADIX_DIGITS) - 1:  # lowest is the budget-th key: a tie cut
            return lowest, budget - (above + int(higher[bucket])), index + 1
        above += int(higher[bucket])
        prefix, prefix_mask = lowest, prefix_mask | (digit_mask << shift)
    raise AssertionError("unreachable")


def _kept(keys: np.ndarray, u: int, m: int) -> np.ndarray:
    tied = keys == np.uint32(u)
    return (keys > np.uint32(u)) | (tied & (np.cumsum(tied) <= m))


def level_paths(lp: np.ndarray, budget: int, capacity: int | None = None, stats: dict | None = None):
    """One request: lp [K, k] float32 -> (parent, depth, rank) of nodes 1..budget in the op's order (parent: the
    output index, 0 for the root). `stats` (a dict) counts levels, prunes, tie cuts and selection passes."""
    stats = {} if stats is None else stats
    for name in ("levels", "prunes", "prune_tie_cuts", "final_tie_cuts", "passes"):
        stats.setdefault(name, 0)
    positions, top_k = lp.shape
    capacity = capacity_for(budget) if capacity is None else capacity
    target = keep_target(budget, capacity)
    assert budget <= capacity
    score = np.zeros(0, np.float32)
    parent = np.zeros(0, np.int64)  # storage index of the parent, -1: the root
    depth = np.zeros(0, np.int64)
    rank = np.zeros(0, np.int64)
    level_begin, threshold = 0, 1
    for d in range(positions if budget else 0):
        if d == 0:
            par_index, par_score = np.array([-1]), np.zeros(1, np.float32)
        else:
            par_index = np.arange(level_begin, len(score))
            par_score = score[par_index]
        if len(par_index) == 0:
            break
        stats["levels"] += 1
        child = (par_score[:, None] + lp[d][None, :]).astype(np.float32)  # float32 sums, as on every device
        passing = score_keys(child) >= np.uint32(threshold)
        counts = passing.sum(1)
        assert all(passing[i, :c].all() for i, c in enumerate(counts)), "children above t are not a row prefix"
        if counts.sum() == 0:
            break
        rows = np.repeat(np.arange(len(par_index)), counts)
        ranks = np.concatenate([np.arange(c) for c in counts])
        cand_score, cand_parent = child[rows, ranks], par_index[rows]
        stored = len(score)
        if stored + len(rows) > capacity:  # prune: stored nodes, then the candidates, in storage order
            keys = np.concatenate([score_keys(score), score_keys(cand_score)])
            u, m, passes = select_cut(keys, budget, target)
            stats["prunes"] += 1
            stats["prune_tie_cuts"] += m > 0
            stats["passes"] += passes
            keep = _kept(keys, u, m)
            keep_stored, keep_cand = keep[:stored], keep[stored:]
            # old storage index -> new (parents precede their children); the last entry maps the root's -1 to -1
            remap = np.append(np.cumsum(keep_stored) - 1, -1)
            assert all(keep_stored[p] for p in parent[keep_stored] if p >= 0), "a kept node lost its parent"
            new_parent = lambda p: remap[p]  # noqa: E731
            score, depth, rank = score[keep_stored], depth[keep_stored], rank[keep_stored]
            parent = new_parent(parent[keep_stored])
            cand_parent = cand_parent[keep_cand]
            assert all(keep_stored[p] for p in cand_parent if p >= 0), "a kept candidate lost its parent"
            cand_score, cand_parent, ranks = cand_score[keep_cand], new_parent(cand_parent), ranks[keep_cand]
            threshold = max(threshold, u + 1)
        level_begin = len(score)
        score = np.concatenate([score, cand_score])
        parent = np.concatenate([parent, cand_parent])
        depth = np.concatenate([depth, np.full(len(cand_score), d + 1)])
        rank = np.concatenate([rank, ranks])
    keys = score_keys(score)
    assert len(score) >= budget, "fewer nodes than the budget: the threshold dropped a best path"
    keep = np.ones(len(score), bool)
    if len(score) > budget:
        u, m, passes = select_cut(keys, budget, budget)
        stats["final_tie_cuts"] += m > 0
        stats["passes"] += passes
        keep = _kept(keys, u, m)
    kept = np.flatnonzero(keep)
    assert len(kept) == budget
    order = kept[np.lexsort((kept, ~keys[kept]))]  # the kernel's sort: (~key, storage index) ascending
    out_index = np.full(len(score), -1)
    out_index[order] = np.arange(1, budget + 1)
    out_parent = np.where(parent[order] >= 0, out_index[np.maximum(parent[order], 0)], 0)
    assert (out_parent >= 0).all() and (out_parent < np.arange(1, budget + 1)).all(), "a parent after its child"
    return out_parent, depth[order], rank[order]


def build_tree_levels(logprobs: torch.Tensor, tokens: torch.Tensor, root_tokens: torch.Tensor, budget: int, *,
                      capacity: int | None = None, stats: dict | None = None):
    """ddtree_build_tree by the level-synchronous algorithm (same arguments and outputs as
    kdtree_ops.ddtree.build_tree, on the CPU). `capacity` overrides C (at least `budget`) to force prunes."""
    batch, nodes = logprobs.shape[0], budget + 1
    words = (nodes + 31) // 32
    tree_tokens = torch.empty(batch, nodes, dtype=torch.int64)
    parents = torch.empty(batch, nodes, dtype=torch.int32)
    depths = torch.empty(batch, nodes, dtype=torch.int32)
    lp_all, tok_all = logprobs.float().cpu().numpy(), tokens.cpu()
    for b in range(batch):
        parent, depth, rank = level_paths(lp_all[b], budget, capacity, stats)
        tree_tokens[b, 0], parents[b, 0], depths[b, 0] = root_tokens[b], -1, 0
        tree_tokens[b, 1:] = tok_all[b][torch.from_numpy(depth - 1), torch.from_numpy(rank)] if budget else 0
        parents[b, 1:] = torch.from_numpy(parent)
        depths[b, 1:] = torch.from_numpy(depth)
    from .. import ops  # the ancestor mask is the library's (not the algorithm under test); builds it if needed

    qo_indptr = torch.arange(batch + 1, dtype=torch.int32) * nodes
    return tree_tokens, parents, depths, ops.tree_mask_from_parents(parents.flatten(), qo_indptr, words)
