"""`--speculative-algorithm DDTREE` on SGLang's overlap scheduler (KDTREE_DDTREE_OVERLAP=1) in a real sglang.Engine
on the CPU: lossless, relayed through SGLang's FutureMap.

The engine, models and prompts are test_sglang_ddtree_engine.py's (sglang_cpu/engine_driver.py, SGLANG_USE_CPU_ENGINE=1,
`attention_backend="kdtree"`). On the CPU SGLang's overlap loop runs with its stream and event stand-ins (every
kernel has run when it returns), so this shows the loop's bookkeeping, not the overlap in time: the bonus tokens
relayed through the FutureMap's rows, the lengths through `on_publish`, the carries filtered as requests finish in
different rounds and merged as chunked prompts join the running batch. Shown, greedy, `ignore_eos`:

a. with the radix cache (a second round over cached prefixes) and without it under 16-token chunked prefill, DDTREE
   on the overlap scheduler equals the engine without speculation token for token, accepting drafts;
b. every decode round ran on the overlap loop (the worker counts the rounds SGLang handed `on_publish`, which only
   the overlap loop does), and none did without KDTREE_DDTREE_OVERLAP (the synchronous default); plain-decode
   rounds publish before their verify (their lengths grow by one), so the host prepares the next round meanwhile;
c. a bad KDTREE_DDTREE_OVERLAP or KDTREE_DDTREE_DRAFT_GRAPHS fails at launch, naming the values;
   KDTREE_DDTREE_BUDGETS changes the rounds' widths
   on the overlap loop as on the synchronous one, lossless;
d. (no engine) the carry passes SGLang's relay (RelayPayload.from_draft_input) and filters and merges by the
   scheduler's future_indices.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

sys.path.insert(0, str(Path(__file__).parent))
from sglang_cpu import ddtree_models  # noqa: E402
from sglang_cpu.engine_fixtures import ddtree_checkpoints, host  # noqa: E402,F401 (host: a fixture)
from sglang_cpu.engine_host import EngineError  # noqa: E402
from test_sglang_ddtree_engine import (BUDGET_LENGTHS, BUDGETS, NEW_TOKENS, PROMPTS, ddtree,  # noqa: E402
                                       drafts_per_verify)

DRAFTED = ddtree_models.BLOCK_SIZE - 1
OVERLAP = {"KDTREE_DDTREE_OVERLAP": "1"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return ddtree_checkpoints(tmp_path_factory.mktemp("ddtree_overlap_models"))


def _run(host, model: str, rounds: int = 1, env=None, **engine) -> dict:
    host.start(model, env=env, **engine)
    try:
        results = [host.generate(PROMPTS, NEW_TOKENS) for _ in range(rounds)]
        (worker,) = host.request("server_info")["internal_states"][0]["ddtree"] if "speculative_algorithm" in engine \
            else (None,)
    finally:
        host.stop()
    return {"rounds": results, "ids": [o["output_ids"] for o in results[0]], "worker": worker,
            "log": host.new_log()}


@pytest.fixture(scope="module")
def reference(host, models):
    return _run(host, models["target"], attention_backend="torch_native")


@pytest.fixture(scope="module")
def overlap_radix(host, models):
    return _run(host, models["target"], rounds=2, env=OVERLAP, **ddtree(models))


@pytest.fixture(scope="module")
def overlap_chunked(host, models):
    return _run(host, models["target"], env=OVERLAP, disable_radix_cache=True, chunked_prefill_size=16,
                **ddtree(models, 64))


@pytest.fixture(scope="module")
def synchronous(host, models):
    return _run(host, models["target"], **ddtree(models))


def test_overlapped_ddtree_with_radix_cache_equals_non_speculative(reference, overlap_radix):
    first, second = overlap_radix["rounds"]
    assert overlap_radix["ids"] == reference["ids"]
    assert [o["output_ids"] for o in second] == reference["ids"]
    assert sum(o["meta_info"]["cached_tokens"] for o in second) > 0
    assert 0 < drafts_per_verify(overlap_radix) < DRAFTED, drafts_per_verify(overlap_radix)


def test_overlapped_ddtree_chunked_prefill_equals_non_speculative(reference, overlap_chunked):
    assert overlap_chunked["ids"] == reference["ids"]
    assert 0 < drafts_per_verify(overlap_chunked) < DRAFTED


def test_every_round_ran_on_the_overlap_loop_and_none_by_default(overlap_radix, overlap_chunked, synchronous):
    for run in (overlap_radix, overlap_chunked):
        worker = run["worker"]
        assert worker["rounds"] > 0 and worker["published"] == worker["rounds"], worker
        assert worker["published_early"] == 0, worker  # trees publish after accepting
        # the CPU's base (torch_native or intel_amx) reads host lengths, so kdtree asks for them and SGLang copies
        # them every round (over triton, on the GPU, it copies none: examples/sglang/OVERLAP.md)
        assert worker["without_host_lengths"] == 0, worker
        assert "KDTREE_DDTREE_OVERLAP=1, overlap scheduling on" in run["log"]
    assert synchronous["worker"]["rounds"] > 0 and synchronous["worker"]["published"] == 0, synchronous["worker"]
    assert "overlap scheduling turned off" in synchronous["log"]


def test_overlapped_rounds_change_width_as_the_batch_shrinks(host, models, reference):
    """KDTREE_DDTREE_BUDGETS on the overlap loop: plain decode, then 4, then 16 tokens as requests finish (the
    scheduler reserves the launch width's slots whatever a round uses), equal to no speculation."""
    params = [{"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for n in BUDGET_LENGTHS]
    host.start(models["target"], env={**OVERLAP, "KDTREE_DDTREE_BUDGETS": BUDGETS}, **ddtree(models))
    try:
        outputs = host.request("generate", input_ids=PROMPTS, sampling_params=params)["outputs"]
        (worker,) = host.request("server_info")["internal_states"][0]["ddtree"]
    finally:
        host.stop()
    assert [o["output_ids"] for o in outputs] == [ids[:n] for ids, n in zip(reference["ids"], BUDGET_LENGTHS)]
    assert worker["rounds"] > 0 and worker["published"] == worker["rounds"], worker
    # the plain-decode rounds (and only they: the others must accept first) published before their verify
    assert 0 < worker["published_early"] < worker["rounds"], worker
    log = host.new_log()
    for change in ("batch of 4 requests: trees of 1 tokens", "batch of 2 requests: trees of 4 tokens",
                   "batch of 1 requests: trees of 16 tokens"):
        assert change in log, change


@pytest.mark.parametrize("switch", ["KDTREE_DDTREE_OVERLAP", "KDTREE_DDTREE_DRAFT_GRAPHS"])
def test_a_bad_switch_fails_at_launch(host, models, switch):
    with pytest.raises(EngineError, match=f"{switch} must be 1 .* or 0 .*, got 'yes'"):
        host.start(models["target"], env={switch: "yes"}, **ddtree(models))
    host.new_log()


def test_the_carry_is_relayed_filtered_and_merged_as_sglang_s_overlap_loop_does():
    """The scheduler's relay reads EAGLE's fields of the carry (RelayPayload.from_draft_input: an AttributeError on
    `topk_p` before DDTreeCarry declared them); once the scheduler set `future_indices`, filtering and merging work on
    them (the carry's own tensors belong to the forward stream), as DFlashDraftInputV2's do."""
    import torch
    from sglang.srt.managers.overlap_utils import RelayPayload

    from kdtree_ops.sglang.ddtree_spec_info import DDTreeCarry

    carry = DDTreeCarry(torch.tensor([5, 6, 7]), torch.tensor([10, 11, 12]), 16)
    payload = RelayPayload.from_draft_input(carry)
    assert payload.bonus_tokens.tolist() == [5, 6, 7]
    assert payload.topk_p is payload.topk_index is payload.hidden_states is payload.dsa_topk_indices is None
    carry.future_indices = torch.tensor([3, 4, 9])
    carry.filter_batch(torch.tensor([0, 2]))
    assert carry.future_indices.tolist() == [3, 9]
    joining = DDTreeCarry(torch.tensor([8]), torch.tensor([20]), 16)
    with pytest.raises(RuntimeError, match="no future_indices"):
        carry.merge_batch(joining)
    joining.future_indices = torch.tensor([1])
    carry.merge_batch(joining)
    assert carry.future_indices.tolist() == [3, 9, 1]
    # the synchronous loop (no future_indices) filters and merges the carried tensors themselves
    sync = DDTreeCarry(torch.tensor([5, 6, 7]), torch.tensor([10, 11, 12]), 16)
    sync.filter_batch(torch.tensor([0, 2]))
    sync.merge_batch(DDTreeCarry(torch.tensor([8]), torch.tensor([20]), 16))
    assert (sync.bonus_tokens.tolist(), sync.new_seq_lens.tolist()) == ([5, 7, 8], [10, 12, 20])
