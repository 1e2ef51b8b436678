"""DDTREE's drafter top-k over a vocabulary split across TP ranks (kdtree_ops/sglang/vocab_topk.py), on the CPU.

The reference is one rank's view in float64: the log-softmax of the whole vocabulary's logits, ranked by
log-probability descending and, among equal ones, by id ascending (a stable sort). Logits are drawn on a coarse grid,
so most rows hold ties, at the k-th place too, and -0.0 beside +0.0: the ids must be exactly the reference's.

a. Two ranks in two processes over gloo (`torch.distributed`, the backend SGLang's CPU engine uses): each rank
   scores its shard of the head, laid out as SGLang's ParallelLMHead lays it out (the vocabulary padded to a
   multiple of 64 and split evenly; a shard's rows past the real vocabulary are padding, here poisoned with huge
   logits), and gathers through `_GlooGroup`, which all-gathers along the last dim in rank order as SGLang's
   GroupCoordinator.all_gather does (parallel_state.py:1374-1439). Both ranks return the same ids and log-probs,
   bit for bit, equal to the one-rank answer's ids and to the reference.
b. More ranks (4, 8), simulated in one process (the gathered rows concatenated in rank order), shards with no real
   rows and k above a shard's rows.
c. The drafter's call shape: [B, K, H] hidden through the head -> [B, K, k], one all-gather of [B K, 2 k + 1]
   float64 rows.
The engine at TP 2 (test_sglang_tp_engine.py) runs the same code over SGLang's own TP group.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kdtree_ops.sglang.vocab_topk import (
    VocabShard,
    gathered_topk_logprobs,
    global_topk_logprobs,
    local_candidates,
    merge_candidates,
)

POISON = 1e4  # a padding row's logit: any padding row that were read would top every real token


def shards(vocab: int, ranks: int, pad_to: int = 64) -> list[VocabShard]:
    """ParallelLMHead's layout (vocab_parallel_embedding.py: __init__'s padding, _get_indices): the padded
    vocabulary split evenly, each shard's real rows clamped to the vocabulary."""
    if -(-vocab // pad_to) * pad_to % ranks:
        pad_to *= ranks
    per_rank = -(-vocab // pad_to) * pad_to // ranks
    out = []
    for r in range(ranks):
        start = min(r * per_rank, vocab)
        out.append(VocabShard(start=start, rows=min((r + 1) * per_rank, vocab) - start, padded_rows=per_rank,
                              vocab_size=vocab))
    return out


def shard_logits(logits: torch.Tensor, shard: VocabShard) -> torch.Tensor:
    """The rank's scores: its real rows, then poisoned padding up to padded_rows."""
    out = torch.full((logits.shape[0], shard.padded_rows), POISON, dtype=logits.dtype)
    out[:, : shard.rows] = logits[:, shard.start: shard.start + shard.rows]
    return out


def tied_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """float32 logits on a grid of 1/4 over [-3, 3): ties in every row; some exact zeros made -0.0."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(-12, 12, (rows, vocab), generator=gen).float() / 4
    negative_zero = (logits == 0) & (torch.rand(rows, vocab, generator=gen) < 0.5)
    return torch.where(negative_zero, torch.tensor(-0.0), logits)


def reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 log-probs and ids of the top k: log-prob descending, then id ascending."""
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    order = torch.sort(-logprobs, dim=-1, stable=True).indices[:, : min(k, logits.shape[1])]
    return logprobs.gather(-1, order), order


def one_rank(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    vocab = logits.shape[1]
    return gathered_topk_logprobs(logits, VocabShard(start=0, rows=vocab, padded_rows=vocab, vocab_size=vocab), k)


def assert_matches_reference(got, logits, k):
    logprobs, ids = got
    want_logprobs, want_ids = reference(logits, k)
    assert ids.dtype == torch.int64 and logprobs.dtype == torch.float32
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(logprobs.double(), want_logprobs, atol=2e-6, rtol=0)


# ---- a. two ranks over gloo ----------------------------------------------------------------------------------

class _GlooGroup:
    """SGLang's GroupCoordinator.all_gather over a torch.distributed group: every rank's tensor concatenated
    along `dim` in rank order."""

    def __init__(self):
        self.world_size = dist.get_world_size()

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=dim)


GLOO_CASES = [(320, 8), (300, 8), (65, 8), (65, 40), (1000, 16)]  # (vocab, k); 65: rank 1 holds one real row


def _gloo_rank(rank: int, world: int, init_file: str, out_prefix: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = []
        for case, (vocab, k) in enumerate(GLOO_CASES):
            logits = tied_logits(24, vocab, seed=case)  # every rank draws the same logits and scores its shard
            shard = shards(vocab, world)[rank]
            shard = VocabShard(shard.start, shard.rows, shard.padded_rows, shard.vocab_size, group=_GlooGroup())
            results.append(gathered_topk_logprobs(shard_logits(logits, shard), shard, k))
        torch.save(results, f"{out_prefix}{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_agree_with_each_other_one_rank_and_the_reference(tmp_path):
    world = 2
    mp.start_processes(_gloo_rank, args=(world, str(tmp_path / "init"), str(tmp_path / "rank")), nprocs=world,
                       start_method="spawn", join=True)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
    for case, (vocab, k) in enumerate(GLOO_CASES):
        logits = tied_logits(24, vocab, seed=case)
        (logprobs, ids), (other_logprobs, other_ids) = per_rank[0][case], per_rank[1][case]
        assert torch.equal(ids, other_ids) and torch.equal(logprobs, other_logprobs), (vocab, k)
        assert torch.equal(ids, one_rank(logits, k)[1]), (vocab, k)
        assert_matches_reference((logprobs, ids), logits, k)


def test_the_logits_have_ties_at_the_cut():
    """The gloo cases test tie-breaking: in most rows the k-th and (k+1)-th log-probs are equal."""
    for case, (vocab, k) in enumerate(GLOO_CASES):
        ranked = torch.sort(tied_logits(24, vocab, seed=case), dim=-1, descending=True).values
        assert (ranked[:, k - 1] == ranked[:, k]).float().mean() > 0.5, (vocab, k)


# ---- b. more ranks, simulated --------------------------------------------------------------------------------

def simulated(logits: torch.Tensor, ranks: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's candidates concatenated in rank order (what the group's all-gather returns), then merged."""
    vocab = logits.shape[1]
    gathered = torch.cat([local_candidates(shard_logits(logits, s), s, k) for s in shards(vocab, ranks)], dim=-1)
    return merge_candidates(gathered, ranks, k, vocab)


@pytest.mark.parametrize("vocab, ranks, k", [
    (300, 1, 8),     # one rank: 20 padding rows at the end
    (320, 4, 8),
    (65, 4, 8),      # ranks 2 and 3 hold padding only (no real rows)
    (65, 4, 40),     # k above a shard's rows: every rank sends all its rows
    (1000, 8, 16),
    (5, 2, 8),       # k above the vocabulary: k' = 5
])
def test_any_rank_count_gives_the_whole_vocabulary_s_topk(vocab, ranks, k):
    logits = tied_logits(12, vocab, seed=vocab * 31 + ranks * 7 + k)
    got = simulated(logits, ranks, k)
    assert_matches_reference(got, logits, k)
    assert torch.equal(got[1], one_rank(logits, k)[1])


def test_distinct_random_logits():
    """Without ties (float32 normal logits): the same ids as the reference at 1, 2 and 8 ranks."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(16, 500, generator=gen) * 3
    for ranks in (1, 2, 8):
        assert_matches_reference(simulated(logits, ranks, 8), logits, 8)


# ---- c. the drafter's call -----------------------------------------------------------------------------------

class _RecordingGroup:
    """A one-rank stand-in for SGLang's GroupCoordinator that records what the drafter gathers."""

    world_size = 1

    def __init__(self):
        self.calls = []

    def all_gather(self, tensor, dim=-1):
        self.calls.append((tuple(tensor.shape), tensor.dtype, dim))
        return tensor


def test_one_collective_per_call_with_the_drafter_s_shapes():
    """[B, K, H] hidden -> [B, K, k]; one all-gather of [B*K, 2k+1] float64 rows through the group's API; the
    head's rows past the shard's real rows (padding) are not read."""
    gen = torch.Generator().manual_seed(3)
    group = _RecordingGroup()
    shard = VocabShard(start=0, rows=320, padded_rows=384, vocab_size=320, group=group)
    hidden = torch.randn(3, 7, 64, generator=gen)
    weight = torch.cat([torch.randn(320, 64, generator=gen), torch.full((64, 64), POISON)])
    logprobs, ids = global_topk_logprobs(hidden, weight, shard, 8)
    assert logprobs.shape == ids.shape == (3, 7, 8)
    assert group.calls == [((21, 17), torch.float64, -1)]
    logits = hidden.reshape(21, 64) @ weight[:320].T
    assert_matches_reference((logprobs.view(21, 8), ids.view(21, 8)), logits, 8)
