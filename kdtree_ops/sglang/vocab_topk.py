"""The drafter's top-k log-probabilities over the target's vocabulary-parallel lm_head, the same on every TP rank.

Under tensor parallelism SGLang's `ParallelLMHead` holds one shard of the vocabulary per rank
(vocab_parallel_embedding.py): rank r's rows are global ids `org_vocab_start_index ..` (`num_org_elements` real
rows), then padding rows (`num_org_elements_padded` in all: the same count on every rank), then LoRA's added
vocabulary. A drafter that projects with its own rank's rows drafts from half a vocabulary (at TP 2), each rank
different tokens: the embedding's all-reduce then mixes different tokens, the ranks accept different lengths, and
their schedulers fall out of step (a gloo collective of mismatched sizes on the CPU engine). The drafter needs only
the top-k of each drafted position, so the ranks exchange candidates, not logits (as DFLASH's `candidate_topk`,
sglang/srt/models/dflash.py, does):

  1. each rank scores its real rows (padding rows score -inf: never a candidate, nothing in the normaliser),
     takes its local top-k with ids offset by the shard's start, and the log-sum-exp of its scores;
  2. one all-gather over the head's TP group (SGLang's `get_tp_group()`, or `get_attn_tp_group()` for a head on
     the attention-TP group) brings every rank's candidates and log-sum-exp: a row of 2 k + 1 float64 per drafted
     position (float32 scores and ids are exact in float64), so one collective a round, through the group's own
     all-gather (pynccl on GPUs, graph-safe; gloo on the CPU);
  3. every rank merges the same gathered rows: the global top-k of the candidates minus the global normaliser
     (the log-sum-exp of the per-rank log-sum-exps).

Ties: `topk` does not say which of equal scores it keeps, and the ranks must agree with one another and with TP 1.
Both selections rank by one int64 key per candidate, the float32 score's order-preserving bits above the id's
complement, so equal scores go to the lowest global id, on every rank and at every TP size (`_order_keys`).
Shapes come from (rows, k, the shard's padded size): no host sync, capture-safe. LoRA's added vocabulary is not
drafted (as DFLASH's candidates).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

_LOW32 = 0xFFFFFFFF


@dataclass(frozen=True)
class VocabShard:
    """This rank's part of the lm_head's vocabulary."""

    start: int        # global id of the shard's first row
    rows: int         # real vocabulary rows of the shard (0 on a rank that holds padding only)
    padded_rows: int  # rows + padding: the same on every rank, so every rank gathers equal shapes
    vocab_size: int   # the whole (unpadded) vocabulary
    group: object = None  # SGLang GroupCoordinator of the head's TP group; None on one rank

    @property
    def ranks(self) -> int:
        return 1 if self.group is None else int(self.group.world_size)


def vocab_shard(lm_head, vocab_size: int) -> VocabShard:
    """The shard of SGLang's `ParallelLMHead` (or of any head whose rows are the whole vocabulary)."""
    vocab_size = int(getattr(lm_head, "org_vocab_size", vocab_size))  # LoRA's added rows excluded
    indices = getattr(lm_head, "shard_indices", None)
    tp_size = int(getattr(lm_head, "tp_size", 1) or 1)
    if indices is None or tp_size == 1:
        return VocabShard(start=0, rows=vocab_size, padded_rows=vocab_size, vocab_size=vocab_size)
    if getattr(lm_head, "use_attn_tp_group", False):
        from sglang.srt.distributed.parallel_state import get_attn_tp_group as head_group
    else:
        from sglang.srt.distributed.parallel_state import get_tp_group as head_group
    group = head_group()
    if int(group.world_size) != tp_size:
        raise ValueError(f"DDTREE: the target's lm_head is split {tp_size} ways but its TP group has "
                         f"{group.world_size} ranks")
    return VocabShard(start=int(indices.org_vocab_start_index), rows=int(indices.num_org_elements),
                      padded_rows=int(indices.num_org_elements_padded), vocab_size=vocab_size, group=group)


def _order_keys(scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """int64 keys, descending in (score, -id): float32 scores' bits made order-preserving as int32 (negative
    floats' magnitude bits flipped; -0.0 folded into +0.0) in the high half, 2**32 - 1 - id in the low half (ids
    below 2**32). Keys are distinct, so `topk` over them has one answer: equal scores keep the lowest ids."""
    bits = (scores.float() + 0.0).view(torch.int32)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return ordered.to(torch.int64) * (_LOW32 + 1) + (_LOW32 - ids.to(torch.int64))


def local_candidates(logits: torch.Tensor, shard: VocabShard, k: int) -> torch.Tensor:
    """[N, 2 k_local + 1] float64: this shard's top-k_local scores (float32 values), their global ids, and the
    log-sum-exp of its scores; k_local = min(k, padded_rows).

    logits: [N, >= shard.rows] float32, the scores of this rank's head rows (columns past `rows` ignored)."""
    logits = logits[:, : shard.rows]
    if shard.padded_rows > shard.rows:  # padding scores -inf: equal shapes on every rank, never picked
        logits = F.pad(logits, (0, shard.padded_rows - shard.rows), value=float("-inf"))
    k_local = min(k, shard.padded_rows)
    ids = torch.arange(shard.start, shard.start + shard.padded_rows, device=logits.device)
    pick = _order_keys(logits, ids).topk(k_local, dim=-1).indices
    scores = logits.gather(-1, pick)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    return torch.cat([scores.double(), (pick + shard.start).double(), lse.double()], dim=-1)


def merge_candidates(gathered: torch.Tensor, ranks: int, k: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global top-k from every rank's `local_candidates` rows concatenated along the last dim ([N, ranks * (2
    k_local + 1)], rank order): (log-probs [N, min(k, vocab)] float32 descending, ids [N, min(k, vocab)] int64)."""
    per_rank = gathered.view(gathered.shape[0], ranks, -1)
    k_local = (per_rank.shape[-1] - 1) // 2
    scores = per_rank[..., :k_local].reshape(gathered.shape[0], -1)
    ids = per_rank[..., k_local: 2 * k_local].reshape(gathered.shape[0], -1).long()
    lse = torch.logsumexp(per_rank[..., -1], dim=-1, keepdim=True)
    pick = _order_keys(scores, ids).topk(min(k, vocab_size), dim=-1).indices
    return (scores.gather(-1, pick) - lse).float(), ids.gather(-1, pick)


def gathered_topk_logprobs(logits: torch.Tensor, shard: VocabShard, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, >= shard.rows] float32 of this rank's rows -> (log-probs [N, k'] float32 descending, global ids
    [N, k'] int64), k' = min(k, vocab): equal on every rank of the shard's group, and to one rank's answer."""
    rows = local_candidates(logits, shard, k)
    if shard.group is not None:
        rows = shard.group.all_gather(rows, dim=-1)
    return merge_candidates(rows, shard.ranks, k, shard.vocab_size)


def global_topk_logprobs(hidden: torch.Tensor, weight: torch.Tensor, shard: VocabShard,
                         k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [..., H] through this rank's head rows `weight` ([>= shard.rows, H]) -> (log-probs [..., k'] float32
    descending, global ids [..., k'] int64), k' = min(k, vocab); equal on every rank of the head's TP group."""
    lead = hidden.shape[:-1]
    logits = F.linear(hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype), weight[: shard.rows]).float()
    logprobs, ids = gathered_topk_logprobs(logits, shard, k)
    return logprobs.view(*lead, -1), ids.view(*lead, -1)
