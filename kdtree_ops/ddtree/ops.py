"""The DDTree round's ops: tree build, greedy acceptance and KV commit (schemas in csrc/ops.cpp).

One DDTree step on the device, with no host sync: the block drafter's top-k per future position goes into
`build_tree` (the best-first tree, its tokens, parents, depths and the packed ancestor mask the verify op
reads), the target's greedy token after every node into `accept_greedy` (the accepted path, its length and
the bonus token), and the accepted nodes' K/V rows into the request's next cache slots through `commit_kv`
(or, with page size 1, only the bookkeeping of `accepted_slots`). Every output shape is a function of input
shapes, so each op is one opaque node under torch.compile and a CUDA graph replays it for any values.

Scores are float32: a path's score is its parent's score plus its own log-prob, rounded to float32 at each
step (the root scores 0), the same additions in the same order on every device and in the references
(kdtree_ops/ddtree_reference.py), so the CPU and CUDA trees are identical, ties included.
"""

from __future__ import annotations

import torch

from .. import build
from ..shapes import build_tree_shapes, mask_words  # noqa: F401  (re-exported)

build.load()

__all__ = ["build_tree", "accept_greedy", "commit_kv", "commit_kv_layers", "values_view_keys", "accepted_slots",
           "emitted_tokens", "build_tree_shapes", "mask_words"]


def build_tree(logprobs: torch.Tensor, tokens: torch.Tensor, root_tokens: torch.Tensor, budget: int):
    """The root plus the `budget` best paths of every request, in best-first order.

    Args:
        logprobs: [B, K, k] float32, each row [b, p, :] sorted descending and <= 0: the drafter's top-k
            log-probabilities at future position p + 1.
        tokens: [B, K, k] int64: the candidate tokens of those log-probs (duplicates are kept as distinct nodes).
        root_tokens: [B] int64: the token of each request's root (the last committed token).
        budget: draft nodes per request, 0 <= budget <= sum over d = 1..K of k^d.

    Returns:
        tree_tokens: [B, budget+1] int64: node 0 is the root, nodes 1..budget the paths by descending score,
            ties to the shallower path, then to the lexicographically smaller tuple of candidate ranks.
        parents: [B, budget+1] int32: parent node index within the request (-1 for the root); parents precede
            their children.
        depths: [B, budget+1] int32: the root has depth 0, a path of d picks depth d.
        tree_mask: [B*(budget+1), ceil((budget+1)/32)] int32: row b*(budget+1)+i has bit j%32 of word j//32 set
            iff node j is node i or one of its ancestors (tree_mask_from_parents' layout, the verify op's input).
    """
    return torch.ops.kdtree.ddtree_build_tree.default(logprobs, tokens, root_tokens, budget)


def accept_greedy(tree_tokens: torch.Tensor, parents: torch.Tensor, target_tokens: torch.Tensor, max_depth: int):
    """The longest path from the root whose every draft token equals the target's greedy token before it.

    From the root, the walk moves to the first child (in node order) of the current node whose token is the
    current node's target token, while one exists and fewer than `max_depth` draft nodes are accepted.

    Args:
        tree_tokens: [B, T] int64: node tokens (node 0 is the root).
        parents: [B, T] int32: parent index of each node (-1 for the root; -1 after node 0 marks padding, never
            accepted); every parent precedes its children.
        target_tokens: [B, T] int64: the target model's argmax after each node.
        max_depth: most draft nodes accepted (>= 0; build_tree's K is always enough).

    Returns:
        accepted: [B, max_depth+1] int32: node indices of the accepted path, root first, padded with -1.
        accept_len: [B] int32: accepted draft nodes (the root excluded).
        next_tokens: [B] int64: the target token after the last accepted node (the bonus token).
    """
    return torch.ops.kdtree.ddtree_accept_greedy.default(tree_tokens, parents, target_tokens, max_depth)


def commit_kv(k_cache: torch.Tensor, v_cache: torch.Tensor | None, accepted: torch.Tensor, node_slots: torch.Tensor,
              dest_slots: torch.Tensor) -> None:
    """Copies the accepted nodes' K/V rows to their destination slots, in place.

    For each b and d with accepted[b, d] >= 0: cache[dest_slots[b, d]] = cache[node_slots[b, accepted[b, d]]]
    for K (and V). All reads of a request happen before its writes, so a destination may be another entry's
    source (dest prefix + d, sources prefix + node >= prefix + d: the usual contiguous layout).
    Destinations must be distinct and no request may write a slot another request reads (checked on CPU).

    Args:
        k_cache: [S, Hkv, Dk] any dtype, last dim contiguous; written in place.
        v_cache: [S, Hkv', Dv] with the dtype of k_cache, last dim contiguous, not overlapping k_cache; or None
            (MLA, where V is a view of K: only k_cache is copied). Written in place.
        accepted: [B, D+1] int32: node indices (accept_greedy's `accepted`), -1 entries skipped.
        node_slots: [B, T] int64: cache slot of tree node i of request b.
        dest_slots: [B, D+1] int64: the slot accepted entry d of request b goes to.
    """
    torch.ops.kdtree.ddtree_commit_kv.default(k_cache, v_cache, accepted, node_slots, dest_slots)


def commit_kv_layers(kv_layers, accepted: torch.Tensor, node_slots: torch.Tensor, dest_slots: torch.Tensor) -> None:
    """`commit_kv` over every layer of a cache: kv_layers yields each layer's (k_cache, v_cache). A v_cache that is
    a view of its k_cache's rows (MLA: the value is the first columns of the latent row) moves with the keys, so it
    is passed as None; other arguments as commit_kv's."""
    for k_cache, v_cache in kv_layers:
        commit_kv(k_cache, None if values_view_keys(k_cache, v_cache) else v_cache, accepted, node_slots, dest_slots)


def values_view_keys(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether v_cache views k_cache's rows from their first byte (MLA's value cache): the same storage at the same
    offset. Reads only metadata (fake tensors included); a V elsewhere in K's storage is its own cache."""
    return (torch._C._is_alias_of(v_cache, k_cache)
            and v_cache.storage_offset() * v_cache.element_size() == k_cache.storage_offset() * k_cache.element_size())


def accepted_slots(accepted: torch.Tensor, node_slots: torch.Tensor) -> torch.Tensor:
    """[B, D+1] int64: the cache slot of each accepted node (-1 padding), for page size 1 bookkeeping.

    Pure torch, no host sync: with page size 1 the accepted nodes' slots simply become the request's next
    positions (req_to_token), and the rejected nodes' slots are freed.

    Args:
        accepted: [B, D+1] int32 node indices, -1 padded (accept_greedy's `accepted`).
        node_slots: [B, T] int64: cache slot of tree node i of request b.
    """
    valid = accepted >= 0
    slots = torch.gather(node_slots, 1, accepted.clamp_min(0).to(torch.int64))
    return torch.where(valid, slots, torch.full_like(slots, -1))


def emitted_tokens(tree_tokens: torch.Tensor, accepted: torch.Tensor, accept_len: torch.Tensor,
                   next_tokens: torch.Tensor) -> torch.Tensor:
    """[B, D+1] int64: each request's output of a round, its accepted draft tokens then the bonus token.

    Pure torch, no host sync. Row b holds accept_len[b] + 1 tokens; the columns after them are padding (a
    -1 entry of `accepted` reads the root's token; the last column is the bonus token).

    Args:
        tree_tokens: [B, T] int64 node tokens (node 0 the root).
        accepted, accept_len, next_tokens: accept_greedy's outputs ([B, D+1] int32, [B] int32, [B] int64).
    """
    drafted = tree_tokens.gather(1, accepted[:, 1:].clamp_min(0).to(torch.int64))      # [B, D]
    emitted = torch.cat([drafted, next_tokens[:, None]], 1)                            # [B, D+1]
    return emitted.scatter_(1, accept_len[:, None].to(torch.int64), next_tokens[:, None])  # bonus after the drafts


@torch.library.register_fake("kdtree::ddtree_build_tree")
def _ddtree_build_tree_fake(logprobs, tokens, root_tokens, budget):
    torch._check(budget >= 0, lambda: f"ddtree_build_tree: budget must be >= 0, got {budget}")
    tokens_shape, parents_shape, depths_shape, mask_shape = build_tree_shapes(logprobs.shape[0], budget)
    return (logprobs.new_empty(tokens_shape, dtype=torch.int64), logprobs.new_empty(parents_shape, dtype=torch.int32),
            logprobs.new_empty(depths_shape, dtype=torch.int32), logprobs.new_empty(mask_shape, dtype=torch.int32))


@torch.library.register_fake("kdtree::ddtree_accept_greedy")
def _ddtree_accept_greedy_fake(tree_tokens, parents, target_tokens, max_depth):
    torch._check(max_depth >= 0, lambda: f"ddtree_accept_greedy: max_depth must be >= 0, got {max_depth}")
    batch = tree_tokens.shape[0]
    return (tree_tokens.new_empty((batch, max_depth + 1), dtype=torch.int32),
            tree_tokens.new_empty((batch,), dtype=torch.int32), tree_tokens.new_empty((batch,), dtype=torch.int64))


@torch.library.register_fake("kdtree::ddtree_commit_kv")
def _ddtree_commit_kv_fake(k_cache, v_cache, accepted, node_slots, dest_slots):
    return None
