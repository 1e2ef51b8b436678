"""Plain-Python references of the DDTree round's ops: the oracles of compile_tests/test_ddtree_ops.py and the
CPU baseline of the benchmark (kdtree_ops/bench/ddtree.py).

`build_tree_heap` is the heap algorithm DDTree's reference implementation runs on the host: a heapq of
candidate paths keyed by (-score, depth, rank tuple), each popped path pushing its first child and its next
sibling. Scores are float32 like the op's: a path's score is its prefix's score plus its last log-prob, rounded
to float32 (a float64 sum of two float32 values rounded once to float32 is the correctly rounded float32 sum).
`build_tree_bruteforce` scores every path and sorts: a second oracle for small K, k.
"""

from __future__ import annotations

import heapq
import itertools
import struct

import torch

from ..testing.trees import ancestor_mask

__all__ = ["build_tree_heap", "best_first_paths_heap", "tree_from_paths", "build_tree_bruteforce",
           "accept_greedy_reference", "commit_kv_reference", "f32_add"]


def f32_add(a: float, b: float) -> float:
    """a + b rounded to float32 (a, b float32 values)."""
    return struct.unpack("f", struct.pack("f", a + b))[0]


def tree_from_paths(paths: list[tuple[int, ...]], tokens_b: list[list[int]], root: int):
    """Node lists of one request from its paths in best-first order (root excluded)."""
    index = {(): 0}
    tree_tokens, parents, depths = [root], [-1], [0]
    for path in paths:
        index[path] = len(tree_tokens)
        parents.append(index[path[:-1]])  # KeyError if a parent came after its child
        depths.append(len(path))
        tree_tokens.append(tokens_b[len(path) - 1][path[-1]])
    return tree_tokens, parents, depths


def _outputs(per_request, budget: int, device):
    batch = len(per_request)
    nodes = budget + 1
    words = (nodes + 31) // 32
    tree_tokens = torch.tensor([r[0] for r in per_request], dtype=torch.int64).reshape(batch, nodes)
    parents = torch.tensor([r[1] for r in per_request], dtype=torch.int32).reshape(batch, nodes)
    depths = torch.tensor([r[2] for r in per_request], dtype=torch.int32).reshape(batch, nodes)
    mask = torch.cat([ancestor_mask(r[1], words) for r in per_request]) if batch else (
        torch.zeros(0, words, dtype=torch.int32))
    return tuple(t.to(device) for t in (tree_tokens, parents, depths, mask))


def best_first_paths_heap(lp: list[list[float]], budget: int) -> list[tuple[int, ...]]:
    """The `budget` best rank tuples of one request's log-probs lp[position][rank], best first (heapq)."""
    positions, top_k = len(lp), len(lp[0]) if lp else 0
    heap = [(-lp[0][0], 1, (0,))] if positions and top_k else []
    scores = {}
    paths = []
    while len(paths) < budget:
        neg_score, depth, path = heapq.heappop(heap)
        score = -neg_score
        paths.append(path)
        scores[path] = score
        if depth < positions:  # first child: rank 0 at the next position
            heapq.heappush(heap, (-f32_add(score, lp[depth][0]), depth + 1, path + (0,)))
        if path[-1] + 1 < top_k:  # next sibling: the last rank + 1
            prefix_score = scores[path[:-1]] if depth > 1 else 0.0
            sibling = path[:-1] + (path[-1] + 1,)
            heapq.heappush(heap, (-f32_add(prefix_score, lp[depth - 1][path[-1] + 1]), depth, sibling))
    return paths


def build_tree_heap(logprobs: torch.Tensor, tokens: torch.Tensor, root_tokens: torch.Tensor, budget: int):
    """ddtree_build_tree by a heapq per request (the host algorithm). Same arguments and outputs as
    kdtree_ops.ddtree.build_tree; outputs on the device of logprobs."""
    lp_all, tok_all, roots = logprobs.float().tolist(), tokens.tolist(), root_tokens.tolist()
    per_request = [tree_from_paths(best_first_paths_heap(lp, budget), tok, root)
                   for lp, tok, root in zip(lp_all, tok_all, roots)]
    return _outputs(per_request, budget, logprobs.device)


def build_tree_bruteforce(logprobs: torch.Tensor, tokens: torch.Tensor, root_tokens: torch.Tensor, budget: int):
    """ddtree_build_tree by scoring all sum_d k^d paths and sorting (small K and k only)."""
    per_request = []
    for lp, tok, root in zip(logprobs.float().tolist(), tokens.tolist(), root_tokens.tolist()):
        scored = []
        for depth in range(1, len(lp) + 1):
            for path in itertools.product(range(len(lp[0])), repeat=depth):
                score = 0.0
                for position, rank in enumerate(path):
                    score = f32_add(score, lp[position][rank])
                scored.append((-score, depth, path))
        scored.sort()
        per_request.append(tree_from_paths([p for _, _, p in scored[:budget]], tok, root))
    return _outputs(per_request, budget, logprobs.device)


def accept_greedy_reference(tree_tokens: torch.Tensor, parents: torch.Tensor, target_tokens: torch.Tensor,
                            max_depth: int):
    """ddtree_accept_greedy walked node by node; same arguments and outputs as kdtree_ops.ddtree.accept_greedy."""
    accepted, lengths, bonus = [], [], []
    for tok, par, target in zip(tree_tokens.tolist(), parents.tolist(), target_tokens.tolist()):
        path = [0]
        while len(path) <= max_depth:
            here = path[-1]
            children = [c for c in range(len(par)) if par[c] == here and c > 0 and tok[c] == target[here]]
            if not children:
                break
            path.append(children[0])
        lengths.append(len(path) - 1)
        bonus.append(target[path[-1]])
        accepted.append(path + [-1] * (max_depth + 1 - len(path)))
    device = tree_tokens.device
    batch = tree_tokens.shape[0]
    return (torch.tensor(accepted, dtype=torch.int32).reshape(batch, max_depth + 1).to(device),
            torch.tensor(lengths, dtype=torch.int32).reshape(batch).to(device),
            torch.tensor(bonus, dtype=torch.int64).reshape(batch).to(device))


def commit_kv_reference(k_cache: torch.Tensor, v_cache: torch.Tensor | None, accepted: torch.Tensor,
                        node_slots: torch.Tensor, dest_slots: torch.Tensor) -> None:
    """ddtree_commit_kv on tensors: every source row of all requests is read first, then the rows are written."""
    sources, dests = node_slots.tolist(), dest_slots.tolist()  # read once (a device tensor: one copy, not one a row)
    moves = [(sources[b][node], dests[b][d])
             for b in range(accepted.shape[0]) for d, node in enumerate(accepted[b].tolist()) if node >= 0]
    for cache in (k_cache, v_cache):
        if cache is None or not moves:
            continue
        rows = cache[[src for src, _ in moves]].clone()
        cache[[dst for _, dst in moves]] = rows
