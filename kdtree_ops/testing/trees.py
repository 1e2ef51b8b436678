"""Draft-tree utilities: random DDTree-like trees, ancestor bitmasks, depths and positions.

A tree of T draft tokens is a parents list: `parents[i]` is the index of token i's parent within the tree,
or -1 for the root. Trees are in the order the op expects: root first, every parent before its children
(so `parents[i] < i`).

The packed mask layout (shared with the op): row i, bit `j % 32` of int32 word `j // 32` set iff token i
attends token j. `pack_mask_bits` / `unpack_mask_bits` convert between that and a dense bool matrix.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch

from ..shapes import mask_words

__all__ = [
    "random_tree",
    "tree_depths",
    "tree_positions",
    "ancestor_matrix",
    "ancestor_mask",
    "pack_mask_bits",
    "unpack_mask_bits",
]


def random_tree(
    num_nodes: int,
    max_depth: int | None = None,
    branching: int = 4,
    generator: torch.Generator | None = None,
) -> list[int]:
    """A random draft tree grown best-first under a node budget, as DDTree's drafter grows it.

    Every node offers `branching` candidate children whose scores are the node's cumulative log-probability
    plus a random log-probability (a log-softmax of random logits, as a drafter's top-k gives). The tree
    repeatedly admits the highest-scoring candidate on the frontier until it holds `num_nodes` nodes, so
    likely paths grow deep and unlikely ones stay short.

    Args:
        num_nodes: node budget T (>= 0); the result has exactly T nodes.
        max_depth: deepest allowed node (the root has depth 0); None for no limit.
        branching: candidate children per node (>= 1).
        generator: torch RNG for reproducible trees.

    Returns:
        parents: list of T ints, root first (-1), every parent before its children.
    """
    if num_nodes < 0 or branching < 1:
        raise ValueError(f"random_tree: need num_nodes >= 0 and branching >= 1, got {num_nodes}, {branching}")
    if max_depth is not None:
        capacity = sum(branching**d for d in range(max_depth + 1))
        if capacity < num_nodes:
            raise ValueError(
                f"random_tree: {num_nodes} nodes do not fit in depth {max_depth} with branching {branching}"
            )
    if num_nodes == 0:
        return []
    parents: list[int] = []
    depths: list[int] = []
    # Candidates: (-score, tie-breaker, parent, depth). The root is the one candidate at the start.
    frontier: list[tuple[float, int, int, int]] = [(0.0, 0, -1, 0)]
    counter = 1
    while len(parents) < num_nodes:
        neg_score, _, parent, depth = heapq.heappop(frontier)
        node = len(parents)
        parents.append(parent)
        depths.append(depth)
        if max_depth is None or depth < max_depth:
            logits = torch.randn(branching, generator=generator, dtype=torch.float64)
            for logp in torch.log_softmax(logits, 0).tolist():
                heapq.heappush(frontier, (neg_score - logp, counter, node, depth + 1))
                counter += 1
    return parents


def _as_list(parents: Sequence[int] | torch.Tensor) -> list[int]:
    return parents.tolist() if isinstance(parents, torch.Tensor) else list(parents)


def tree_depths(parents: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """[T] int64: depth of each node (root 0). Parents must come before children."""
    parents = _as_list(parents)
    depths: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"tree_depths: parents[{i}] = {p} must be -1 or an earlier node")
        depths.append(0 if p < 0 else depths[p] + 1)
    return torch.tensor(depths, dtype=torch.int64)


def tree_positions(parents: Sequence[int] | torch.Tensor, prefix_len: int) -> torch.Tensor:
    """[T] int64: position ids of the draft tokens, prefix_len + depth (the root sits right after the prefix)."""
    return tree_depths(parents) + prefix_len


def ancestor_matrix(parents: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """[T, T] bool: row i is true at token i and every ancestor of i (the ancestor-only attention mask)."""
    parents = _as_list(parents)
    t = len(parents)
    dense = torch.zeros(t, t, dtype=torch.bool)
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"ancestor_matrix: parents[{i}] = {p} must be -1 or an earlier node")
        if p >= 0:
            dense[i] = dense[p]
        dense[i, i] = True
    return dense


def pack_mask_bits(dense: torch.Tensor, words: int) -> torch.Tensor:
    """Packs a bool [R, C] matrix (C <= 32 * words) into the op's [R, words] int32 bitmask."""
    rows, cols = dense.shape
    if cols > 32 * words:
        raise ValueError(f"pack_mask_bits: {cols} columns do not fit in {words} words")
    bits = torch.zeros(rows, 32 * words, dtype=torch.int64, device=dense.device)
    bits[:, :cols] = dense.to(torch.int64)
    weights = torch.ones(32, dtype=torch.int64, device=dense.device) << torch.arange(32, device=dense.device)
    packed = (bits.view(rows, words, 32) * weights).sum(-1)  # in [0, 2^32)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)  # reinterpret as int32
    return packed.to(torch.int32)


def unpack_mask_bits(mask: torch.Tensor, cols: int) -> torch.Tensor:
    """The first `cols` bits of each row of an [R, W] int32 bitmask, as bool [R, cols]."""
    rows, words = mask.shape
    unsigned = mask.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(32, device=mask.device)
    bits = (unsigned.unsqueeze(-1) >> shifts) & 1  # [R, W, 32]
    return bits.reshape(rows, words * 32)[:, :cols].bool()


def ancestor_mask(parents: Sequence[int] | torch.Tensor, words: int | None = None) -> torch.Tensor:
    """[T, words] int32 packed ancestor mask of one tree (words defaults to ceil(T / 32), at least 1)."""
    parents = _as_list(parents)
    words = mask_words(len(parents)) if words is None else words
    return pack_mask_bits(ancestor_matrix(parents), words)
