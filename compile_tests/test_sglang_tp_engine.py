"""Tensor parallelism (tp_size=2) in a real sglang.Engine on the CPU: DDTREE through kdtree, equal to tp_size=1.

Each configuration runs in an engine of its own (module-scoped fixtures) in the driver process of
sglang_cpu/engine_driver.py: two scheduler processes, one per TP rank, their collectives on gloo (the environment
SGLang's CPU engine needs for that: sglang_cpu/engine_host.cpu_tp_env). The target and drafter are the DDTREE
suite's (sglang_cpu/ddtree_models.py); their query and KV heads divide by 2, so every attention layer really is
split (2 query heads and 1 KV head a rank), and each rank's lm_head holds half of the vocabulary (160 of 320 ids).
Greedy, `ignore_eos`, four requests of different lengths, compared token for token with the same model at
tp_size=1, without speculation and with DDTREE:

a. DDTREE (trees of 16 tokens): the drafter's top-k is taken over the whole vocabulary on every rank
   (kdtree_ops/sglang/vocab_topk.py), so both ranks build the same tree and accept the same path: the output
   equals no speculation's and DDTREE's at tp_size=1, drafts are accepted, and both ranks ran as many rounds. When
   each rank drafted from its own half of the vocabulary, the ranks drafted different tokens, accepted different
   lengths, and their schedulers fell out of step: a gloo collective of mismatched sizes killed the engine at the
   first rounds ("Received data size doesn't match expected size");
b. the same drafts are accepted as at tp_size=1, request by request: the candidates are the whole vocabulary's,
   equal scores to the lowest id at any TP size.
NGRAM and EAGLE at tp_size=2 are the GPU engine suite's (sglang_gpu/engine_models.py): three more engines here
would pass this module's CI budget (about two minutes on two cores). The plugin's status comes from each rank
(`kdtree_ranks`, gathered over the TP group): on both, every verify layer of every round ran the op, as many
rounds on each. Token equality does not hinge on near-ties: the reference's greedy margin is checked as in the
TP 1 suites.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

sys.path.insert(0, str(Path(__file__).parent))
from sglang_cpu.engine_fixtures import ddtree_checkpoints, host  # noqa: E402,F401 (host: a fixture)
from test_sglang_ddtree_engine import PROMPTS  # noqa: E402

NEW_TOKENS = 16
MIN_MARGIN = 1e-4
# At tp_size > 1 SGLang's vocabulary-parallel embedding masks ids with a torch.compile'd function
# (vocab_parallel_embedding.py:138, get_masked_input_and_mask); inductor's C++ build of it took ~20 s of this
# module's two minutes on two cores. Eager runs the same integer arithmetic.
TP_ENV = {"TORCH_COMPILE_DISABLE": "1"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return ddtree_checkpoints(tmp_path_factory.mktemp("tp_models"))


def _run(host, model: str, margins: bool = False, **engine) -> dict:
    host.start(model, env=TP_ENV if engine.get("tp_size", 1) > 1 else None, **engine)
    try:
        outputs = host.generate(PROMPTS, NEW_TOKENS, top_logprobs_num=2 if margins else 0)
        ranks = host.kdtree_ranks() if engine.get("attention_backend") == "kdtree" else []
    finally:
        host.stop()
    return {"outputs": outputs, "ids": [o["output_ids"] for o in outputs], "ranks": ranks, "log": host.new_log()}


@pytest.fixture(scope="module")
def markov_reference(host, models):
    return _run(host, models["target"], margins=True, attention_backend="torch_native")


def _ddtree(models, tp_size: int) -> dict:
    return dict(speculative_algorithm="DDTREE", speculative_draft_model_path=models["draft"],
                speculative_num_draft_tokens=16, attention_backend="kdtree", tp_size=tp_size)


@pytest.fixture(scope="module")
def ddtree_tp1(host, models):
    return _run(host, models["target"], **_ddtree(models, 1))


@pytest.fixture(scope="module")
def ddtree_tp2(host, models):
    return _run(host, models["target"], **_ddtree(models, 2))


def min_margin(run: dict) -> float:
    return min(top[0][0] - top[1][0] for o in run["outputs"] for top in o["meta_info"]["output_top_logprobs"])


def accepted_drafts(run: dict) -> int:
    return sum(round((o["meta_info"]["spec_accept_length"] - 1) * o["meta_info"]["spec_verify_ct"])
               for o in run["outputs"])


def assert_every_rank_ran_the_op(run: dict, tp_size: int, layers: int = 2) -> int:
    """Each rank reports one kdtree backend that verified, the op serving every verify layer of every step, and
    the ranks took the same number of verify steps. Returns that number."""
    assert [r["tp_rank"] for r in run["ranks"]] == list(range(tp_size)), run["ranks"]
    steps = set()
    for rank in run["ranks"]:
        (status,) = [s for s in rank["kdtree"] if s["verify_steps"]]
        steps.add(status["verify_steps"])
        assert status["op_calls"] == {str(i): status["verify_steps"] for i in range(layers)}, rank
        assert status["base_calls"] == {} and status["fallbacks"] == {}, rank
    assert len(steps) == 1, run["ranks"]
    return steps.pop()


def test_reference_has_a_greedy_margin(markov_reference):
    assert min_margin(markov_reference) >= MIN_MARGIN


def test_ddtree_at_tp2_equals_tp1_and_no_speculation(markov_reference, ddtree_tp1, ddtree_tp2):
    assert ddtree_tp1["ids"] == markov_reference["ids"]
    assert ddtree_tp2["ids"] == markov_reference["ids"]
    assert "TP1] Init parallel begin" in ddtree_tp2["log"]  # a second rank ran
    assert accepted_drafts(ddtree_tp2) > len(PROMPTS), "the agreeing drafter should get tree nodes accepted"
    verify_steps = assert_every_rank_ran_the_op(ddtree_tp2, 2)
    rounds = [rank["ddtree"][0]["rounds"] for rank in ddtree_tp2["ranks"]]
    assert rounds == [verify_steps] * 2, ddtree_tp2["ranks"]


def test_ddtree_at_tp2_drafts_what_tp1_drafts(ddtree_tp1, ddtree_tp2):
    """The same drafts accepted per request as at tp_size=1: the drafter's candidates are the whole vocabulary's."""
    assert [o["meta_info"]["spec_verify_ct"] for o in ddtree_tp2["outputs"]] == \
        [o["meta_info"]["spec_verify_ct"] for o in ddtree_tp1["outputs"]]
    assert accepted_drafts(ddtree_tp2) == accepted_drafts(ddtree_tp1)
