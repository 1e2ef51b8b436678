"""The DDTREE worker's host-to-device traffic and host lengths, on the CPU.

A pageable host tensor copied with `non_blocking=True` synchronizes the stream (CUDA stages it through a bounce
buffer), so every host value the round sends to the device goes through SGLang's `async_h2d` (pinned staging where
the platform has it, an asynchronous copy): the requests' seeds (when SGLang keeps none) and the prefill's extend
lengths, from which the prefill positions are built on the device. Checked: the values (positions against the host
rule, seeded draws against the op on the same seeds) and that the transfers took that path (a recorder in its
place). A round's prefix gathers are sized by a host bound on the lengths that needs no copy of them.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from sglang.srt.utils.common import async_h2d  # noqa: E402

from kdtree_ops import ddtree  # noqa: E402
from kdtree_ops.sglang import ddtree_worker  # noqa: E402
from kdtree_ops.sglang.ddtree_worker import DDTreeWorker, bound_committed_lengths  # noqa: E402
from kdtree_ops.sglang.verify_metadata import host_length_bound  # noqa: E402


@pytest.fixture
def transfers(monkeypatch):
    """The host lists the worker sends with async_h2d (it still copies them)."""
    sent = []

    def recorder(args, *, dtype, device):
        sent.append(list(args))
        return async_h2d(args, dtype=dtype, device=device)

    monkeypatch.setattr(ddtree_worker, "async_h2d", recorder, raising=False)
    return sent


@pytest.mark.parametrize("seed", range(4))
def test_extend_positions_are_each_request_s_new_positions(seed):
    from kdtree_ops.sglang.ddtree_worker import extend_positions

    rng = random.Random(seed)
    prefix = [rng.randrange(0, 50) for _ in range(rng.randrange(1, 6))]
    extend = [rng.randrange(0, 20) for _ in prefix]
    want = [p + i for p, n in zip(prefix, extend) for i in range(n)]
    seq_lens = torch.tensor([p + n for p, n in zip(prefix, extend)])
    got = extend_positions(seq_lens, torch.tensor(extend), sum(extend))
    assert got.dtype == torch.int64 and got.tolist() == want


def test_extend_positions_read_no_tensor_value():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kdtree_ops.sglang.ddtree_worker import extend_positions

    with FakeTensorMode() as mode:
        out = extend_positions(mode.from_tensor(torch.tensor([7, 9])), mode.from_tensor(torch.tensor([3, 4])), 7)
    assert out.shape == (7,)


class _Drafter:
    def __init__(self):
        self.calls = []

    def materialize(self, hidden, positions, slots):
        self.calls.append((hidden, positions, slots))


def test_prefill_positions_are_built_on_the_device_from_the_extend_lengths(transfers):
    prefix, extend = [0, 12, 5], [4, 3, 6]
    tokens = sum(extend)
    out = SimpleNamespace(logits_output=SimpleNamespace(hidden_states=torch.randn(tokens, 8)),
                          next_token_ids=torch.tensor([5, 6, 7]))
    worker = SimpleNamespace(device=torch.device("cpu"), drafter=_Drafter(), num_tree_tokens=16,
                             clock=ddtree_worker.PhaseClock("cpu"),
                             _target_worker=SimpleNamespace(forward_batch_generation=lambda batch, **kw: out))
    batch = SimpleNamespace(prefix_lens=prefix, extend_lens=extend, seq_lens=torch.tensor([4, 15, 11]),
                            out_cache_loc=torch.arange(100, 100 + tokens))
    DDTreeWorker._prefill(worker, batch, None)
    ((_, positions, slots),) = worker.drafter.calls
    assert positions.tolist() == [0, 1, 2, 3, 12, 13, 14, 5, 6, 7, 8, 9, 10]
    assert slots.tolist() == list(range(100, 100 + tokens))
    assert transfers == [extend], "the prefill sent its positions by a pageable copy, not async_h2d"


def test_sampling_seeds_go_to_the_device_by_async_h2d(transfers, monkeypatch):
    from sglang.srt.speculative import dflash_utils

    monkeypatch.setattr(dflash_utils, "apply_dflash_verify_logits_adjustments", lambda **_: None)
    bs, nodes, vocab = 2, 5, 40
    info = SimpleNamespace(is_all_greedy=False, sampling_seed=None, temperatures=torch.full((bs, 1), 0.8),
                           top_ks=torch.full((bs,), vocab, dtype=torch.int32), top_ps=torch.ones(bs),
                           min_ps=torch.zeros(bs))
    reqs = [SimpleNamespace(rid="a", sampling_params=SimpleNamespace(sampling_seed=1234)),
            SimpleNamespace(rid="b", sampling_params=SimpleNamespace(sampling_seed=None))]
    logits = torch.randn(bs * nodes, vocab, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(bs * nodes).view(bs, nodes) + 30
    worker = SimpleNamespace(device=torch.device("cpu"))
    got = DDTreeWorker._target_tokens(worker, SimpleNamespace(sampling_info=info, reqs=reqs), logits, positions)
    seeds = [1234, ddtree_worker.request_seed(reqs[1])]
    assert transfers == [seeds], "the seeds went to the device by a pageable non_blocking copy, not async_h2d"
    want = ddtree.sample_targets(logits, positions, info.temperatures, info.top_ks, info.top_ps, info.min_ps,
                                 torch.tensor(seeds))
    assert torch.equal(got, want)


def test_a_round_s_length_bound_needs_no_host_lengths():
    """With host lengths the bound is their max; without them (the overlap scheduler when no backend needs them) it
    is the largest KV length SGLang allocated to a request, set as the batch's max_seq_len_host, where the verify
    forward's metadata reads it (host_length_bound)."""
    reqs = [SimpleNamespace(kv=SimpleNamespace(kv_allocated_len=n)) for n in (40, 72, 9)]
    batch = SimpleNamespace(reqs=reqs, seq_lens_cpu=torch.tensor([33, 61, 5]))
    assert bound_committed_lengths(batch) == 61 and not hasattr(batch, "max_seq_len_host")
    batch.seq_lens_cpu = None
    assert bound_committed_lengths(batch) == 72 == batch.max_seq_len_host == host_length_bound(batch, 3)
