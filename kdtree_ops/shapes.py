"""Output shapes of the kdtree ops, from input shapes only: shared by the typed wrappers, the fakes (so they
cannot drift) and callers that preallocate (CUDA-graph buffers). Plain Python on ints or SymInts; importing it
builds nothing."""

from __future__ import annotations

import torch

__all__ = ["mask_words", "attention_output_shape", "build_tree_shapes", "build_tree_path_count"]

INT64_MAX = 2**63 - 1


def mask_words(num_tokens):
    """int32 words per tree-mask row that hold `num_tokens` bits: ceil(num_tokens / 32), at least 1 (int or
    SymInt). The verify op takes at most 32 (trees of up to 1024 tokens)."""
    return torch.sym_max(1, (num_tokens + 31) // 32)


def attention_output_shape(q: torch.Tensor, v_cache: torch.Tensor) -> tuple:
    """[N, Hq, Dv]: the output of tree_verify_attention."""
    return (q.shape[0], q.shape[1], v_cache.shape[2])


def build_tree_shapes(batch, budget) -> tuple:
    """Shapes of ddtree_build_tree's four outputs: tree_tokens, parents, depths [B, budget+1] and the mask
    [B*(budget+1), mask_words(budget+1)]."""
    nodes = budget + 1
    return (batch, nodes), (batch, nodes), (batch, nodes), (batch * nodes, mask_words(nodes))


def build_tree_path_count(positions: int, top_k: int) -> int:
    """The largest budget ddtree_build_tree takes for K = `positions` drafted positions and k = `top_k` candidates
    each: the number of paths of depth 1..K, sum over d = 1..K of k^d, saturated at 2^63 - 1 as the op's own check
    (csrc/ddtree_args.cpp, ddtree_path_count) saturates, so huge k and K cost K steps at most, never a huge power."""
    total, level = 0, 1  # level = k^d
    for _ in range(max(int(positions), 0) if top_k > 0 else 0):
        level = min(level * int(top_k), INT64_MAX)
        total = min(total + level, INT64_MAX)
        if total == INT64_MAX:
            break
    return total
