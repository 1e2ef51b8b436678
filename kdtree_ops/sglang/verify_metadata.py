"""The packed tree mask of a TARGET_VERIFY step, built on the device from SGLang's verify metadata.

SGLang hands a verify step either a dense custom mask (FULL_MASK layout: request b's rows are
`[T_b x (L_b + T_b)]` booleans at `mask_indptr[b]`; EAGLE topk>1 and NGRAM trees) or no mask at all (DFLASH's
block and EAGLE chains: plain causal order among the draft tokens). Both become the op's packed mask
`[N, W]` int32 (bit j of row i: draft token i sees draft token j of its request):

- a dense mask through `tree_mask_from_dense`;
- no mask through `tree_mask_from_parents` with parent(j) = j - 1 (a chain).

Everything here is device work with shapes fixed by the caller: no `.item()`, no host sync, so the graph
variant is recorded into a CUDA graph and re-runs on every replay.
"""

from __future__ import annotations

import torch

# int32 words per packed-mask row for trees of up to N draft tokens (at least 1); the backend imports it here.
from ..shapes import mask_words


def chain_parents(qo_indptr: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[N] int32 parents of a causal chain per request: row qo_indptr[b] + j has parent j - 1 (root: -1).

    Args:
        qo_indptr: [B+1] int32, B >= 1.
        rows: [N] int32, arange(N) (a static buffer under graphs).
    Rows past qo_indptr[B] get arbitrary parents; the mask ops zero those rows.
    """
    num_reqs = qo_indptr.shape[0] - 1
    req = torch.searchsorted(qo_indptr[1:], rows, right=True).clamp_(max=max(num_reqs - 1, 0))
    return (rows - qo_indptr[req] - 1).to(torch.int32)


def packed_tree_mask(
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor,
    qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    num_tokens: int,
    words: int,
) -> torch.Tensor:
    """[num_tokens, words] int32 packed mask of one verify step (eager: the mask's presence is known).

    Args:
        custom_mask: SGLang's flat FULL_MASK (bool/uint8), or None for causal chains.
        mask_indptr: [>= B] int32/int64 start of each request's rows in custom_mask.
        qo_indptr: [B+1] int32 draft-token offsets.
        prefix_lens: [B] int32/int64 committed prefix lengths L_b (SGLang's verify `seq_lens`).
    """
    from kdtree_ops import ops

    bs = qo_indptr.shape[0] - 1
    if custom_mask is not None:
        return ops.tree_mask_from_dense(custom_mask, mask_indptr[:bs], qo_indptr, prefix_lens[:bs], num_tokens, words)
    rows = torch.arange(num_tokens, dtype=torch.int32, device=qo_indptr.device)
    return ops.tree_mask_from_parents(chain_parents(qo_indptr, rows), qo_indptr, words)


class GraphTreeMask:
    """Static buffers of the packed mask under CUDA graphs (shared by every captured batch size).

    `select_source` runs outside the graph (capture and every replay): it records on the device whether this
    step carries a dense mask. `refresh` runs inside the graph (`init_forward_metadata_in_graph`): it
    rebuilds `packed` from the dense verify buffer *and* the chain, and keeps the one the flag selects —
    so a graph captured from a spec info without a mask still honours the tree of a later replay.
    """

    def __init__(self, max_bs: int, max_num_tokens: int, words: int, device: torch.device | str):
        self.words = words
        self.packed = torch.zeros((max_num_tokens, words), dtype=torch.int32, device=device)  # [N_max, W]
        self.qo_indptr = torch.zeros((max_bs + 1,), dtype=torch.int32, device=device)  # [B_max+1] int32 view
        self.rows = torch.arange(max_num_tokens, dtype=torch.int32, device=device)  # [N_max]
        self.use_dense = torch.zeros((1,), dtype=torch.bool, device=device)  # set per step, read in graph

    def select_source(self, has_dense_mask: bool) -> None:
        """Outside the graph: one device fill, no sync."""
        self.use_dense.fill_(has_dense_mask)

    def refresh(
        self,
        dense_buffer: torch.Tensor | None,
        qo_indptr_src: torch.Tensor,
        mask_indptr: torch.Tensor,
        prefix_lens: torch.Tensor,
        bs: int,
    ) -> None:
        """Inside the graph: rebuild `packed` (all rows; rows past qo_indptr[bs] become zero).

        Args:
            dense_buffer: SGLang's static verify-mask buffer (FULL_MASK, uint8), or None when it has none.
            qo_indptr_src: [bs+1] any int dtype: the parent's static qo_indptr.
            mask_indptr: [>= bs] int64: the parent's static mask_indptr.
            prefix_lens: [bs] int: the runner's static seq_lens.
        """
        from kdtree_ops import ops

        qo = self.qo_indptr[: bs + 1]
        qo.copy_(qo_indptr_src[: bs + 1])
        num_tokens = self.packed.shape[0]
        chain = ops.tree_mask_from_parents(chain_parents(qo, self.rows), qo, self.words)
        if dense_buffer is None:
            self.packed.copy_(chain)
            return
        dense = ops.tree_mask_from_dense(
            dense_buffer, mask_indptr[:bs], qo, prefix_lens[:bs], num_tokens, self.words
        )
        torch.where(self.use_dense, dense, chain, out=self.packed)
