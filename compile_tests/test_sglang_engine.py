"""A real sglang.Engine on the CPU with `attention_backend="kdtree"`: generation, NGRAM and EAGLE speculation, MLA.

Each configuration runs in an engine of its own, started once (module-scoped fixtures) in the driver process of
sglang_cpu/engine_driver.py (SGLANG_USE_CPU_ENGINE=1, the test-only `sgl_kernel` stand-in first on PYTHONPATH),
over tiny float32 checkpoints the suite builds (sglang_cpu/tiny_models.py), greedy, `ignore_eos`. Shown:

a. plain generation through kdtree equals the base backend alone (torch_native: SGLang's own choice on this
   CPU, its AMX kernels being absent), token for token;
b. NGRAM speculation (8 draft tokens, trees from the n-gram corpus) equals the non-speculative output for four
   requests of different lengths, radix cache on (two rounds: the second reuses cached prefixes) and off, with
   drafts accepted;
c. EAGLE with topk 2 (3 steps, 6 draft tokens; the draft a copy of the target's first layer, so trees are
   accepted) equals it too. The draft runs on SGLang's intel_amx backend (the only CPU choice its draft factory
   has) with the stand-in's torch kernels. EAGLE3's CPU path runs too (tried 2026-12-02: a random one-layer
   EAGLE3 draft, topk 2, output equal), but a random draft gets no tree node accepted, which leaves the tree
   rows untested; EAGLE's copy draft does not, so the suite runs EAGLE;
d. the op ran on every verify layer of every verify step (counted by the backend in the scheduler process, read
   through SGLang's server info: the plugin's get_internal_state hook), and validate mode (base intel_amx, with
   a TARGET_VERIFY path) stays within float32 tolerance of the base's verify;
e. an MLA target (DeepSeek-V3 style) under NGRAM equals the same engine without speculation. Its base is
   intel_amx: SGLang's torch_native cannot run DeepSeek's MHA prefill on the CPU (it reads the 48-wide latent
   cache as keys for 32-wide queries: "Expected size ... [4, 32] but got: [4, 48]" in torch_native_backend.py's
   SDPA), and SGLang itself turns `--attention-backend intel_amx` into torch_native on a CPU without its AMX
   kernels, so "the base alone" is kdtree without speculation, where every call is the base's.
Token equality does not hinge on near-ties: every compared token's greedy margin in the reference runs is at
least MIN_MARGIN (float32 kernels differ by ~1e-6 here).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

sys.path.insert(0, str(Path(__file__).parent))
from sglang_cpu import tiny_models  # noqa: E402
from sglang_cpu.engine_fixtures import host  # noqa: E402,F401 (a fixture)
from sglang_cpu.engine_host import EngineHost  # noqa: E402

NEW_TOKENS = 32
MIN_MARGIN = 1e-4  # log-prob gap between the greedy token and the runner-up, in every reference token
NGRAM = dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=8)
EAGLE = dict(speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=2,
             speculative_num_draft_tokens=6, speculative_draft_attention_backend="intel_amx")
AMX_BASE = {"KDTREE_BASE_BACKEND": "intel_amx"}


def _prompts() -> list:
    """Four requests of different lengths; the last repeats a phrase, which the n-gram corpus can draft from."""
    rng = random.Random(0)
    prompts = [[rng.randrange(3, tiny_models.VOCAB) for _ in range(n)] for n in (5, 17, 40)]
    phrase = [rng.randrange(3, tiny_models.VOCAB) for _ in range(6)]
    return prompts + [(phrase * 9)[:50]]


PROMPTS = _prompts()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_models")
    llama = tiny_models.llama(root / "llama")
    return {"llama": str(llama), "eagle": str(tiny_models.eagle_draft(root / "eagle", llama)),
            "mla": str(tiny_models.deepseek_mla(root / "mla"))}


def _run(host: EngineHost, model: str, rounds: int = 1, margins: bool = False, env=None, **engine) -> dict:
    """Starts one engine, generates PROMPTS `rounds` times, reads the kdtree status, stops it."""
    host.start(model, env=env, **engine)
    try:
        results = [host.generate(PROMPTS, NEW_TOKENS, top_logprobs_num=2 if margins else 0) for _ in range(rounds)]
        status = host.kdtree_status()
    finally:
        host.stop()
    return {"rounds": results, "ids": [o["output_ids"] for o in results[0]], "status": status,
            "log": host.new_log()}


@pytest.fixture(scope="module")
def reference(host, models):
    return _run(host, models["llama"], margins=True, attention_backend="torch_native")


@pytest.fixture(scope="module")
def kdtree_plain(host, models):
    return _run(host, models["llama"], attention_backend="kdtree")


@pytest.fixture(scope="module")
def ngram_radix(host, models):
    return _run(host, models["llama"], rounds=2, attention_backend="kdtree", **NGRAM)


@pytest.fixture(scope="module")
def ngram_no_radix(host, models):
    return _run(host, models["llama"], attention_backend="kdtree", disable_radix_cache=True, **NGRAM)


@pytest.fixture(scope="module")
def validate_amx(host, models):
    return _run(host, models["llama"], env={**AMX_BASE, "KDTREE_VERIFY": "validate"}, attention_backend="kdtree",
                **NGRAM)


@pytest.fixture(scope="module")
def eagle(host, models):
    return _run(host, models["llama"], attention_backend="kdtree", speculative_draft_model_path=models["eagle"],
                **EAGLE)


@pytest.fixture(scope="module")
def mla_reference(host, models):
    return _run(host, models["mla"], margins=True, env=AMX_BASE, attention_backend="kdtree")


@pytest.fixture(scope="module")
def mla_ngram(host, models):
    return _run(host, models["mla"], env=AMX_BASE, attention_backend="kdtree", **NGRAM)


def min_margin(run: dict) -> float:
    return min(top[0][0] - top[1][0] for o in run["rounds"][0] for top in o["meta_info"]["output_top_logprobs"])


def accepted_drafts(run: dict) -> int:
    """Draft tokens the target accepted over every request (accept length counts the bonus token)."""
    return sum(round((o["meta_info"]["spec_accept_length"] - 1) * o["meta_info"]["spec_verify_ct"])
               for o in run["rounds"][0])


def the_status(run: dict) -> dict:
    (status,) = [s for s in run["status"] if s["verify_steps"]] or run["status"]
    return status


def assert_op_served_every_verify_layer(run: dict, layers: int) -> None:
    status = the_status(run)
    steps = status["verify_steps"]
    assert steps > 0, status
    assert status["op_calls"] == {str(i): steps for i in range(layers)}, status
    assert status["base_calls"] == {} and status["fallbacks"] == {}, status


# ---- a. plain generation -------------------------------------------------------------------------------------


def test_reference_tokens_have_a_greedy_margin(reference):
    assert [len(ids) for ids in reference["ids"]] == [NEW_TOKENS] * len(PROMPTS)
    assert min_margin(reference) >= MIN_MARGIN


def test_plain_generation_equals_the_base_alone(reference, kdtree_plain):
    assert kdtree_plain["ids"] == reference["ids"]
    (status,) = kdtree_plain["status"]
    assert status["base"] == "torch_native" and status["base_source"] == "SGLang's default"
    assert status["verify_steps"] == 0 and status["op_calls"] == {}
    assert "everything else by torch_native (SGLang's default)" in kdtree_plain["log"]  # the status line


# ---- b. NGRAM -----------------------------------------------------------------------------------------------------


def test_ngram_with_radix_cache_equals_non_speculative(reference, ngram_radix):
    first, second = ngram_radix["rounds"]
    assert ngram_radix["ids"] == reference["ids"]
    assert [o["output_ids"] for o in second] == reference["ids"]  # served again from cached prefixes
    assert sum(o["meta_info"]["cached_tokens"] for o in second) > 0
    assert accepted_drafts(ngram_radix) > 0


def test_ngram_without_radix_cache_equals_non_speculative(reference, ngram_no_radix):
    assert ngram_no_radix["ids"] == reference["ids"]
    assert accepted_drafts(ngram_no_radix) > 0


# ---- c. EAGLE, topk > 1 --------------------------------------------------------------------------------------------


def test_eagle_tree_equals_non_speculative(reference, eagle):
    assert eagle["ids"] == reference["ids"]
    assert accepted_drafts(eagle) > len(PROMPTS) * 4, "the copy draft should get trees accepted"
    assert_op_served_every_verify_layer(eagle, layers=2)


# ---- d. the op ran, and validate mode agrees ---------------------------------------------------------------------


def test_op_served_every_verify_layer(ngram_radix, ngram_no_radix):
    assert_op_served_every_verify_layer(ngram_radix, layers=2)
    assert_op_served_every_verify_layer(ngram_no_radix, layers=2)


def test_validate_mode_stays_within_tolerance(reference, validate_amx):
    status = the_status(validate_amx)
    assert status["base"] == "intel_amx" and status["base_source"] == "KDTREE_BASE_BACKEND"
    stats = status["validate"]
    assert stats["calls"] == 2 * status["verify_steps"] > 0, status
    assert stats["non_finite"] == 0 and stats["max_abs_err"] < 1e-4, stats
    assert validate_amx["ids"] == reference["ids"]  # the base's verify output, returned in validate mode


# ---- e. MLA ---------------------------------------------------------------------------------------------------------


def test_mla_ngram_equals_non_speculative(mla_reference, mla_ngram):
    assert min_margin(mla_reference) >= MIN_MARGIN
    assert mla_ngram["ids"] == mla_reference["ids"]
    assert accepted_drafts(mla_ngram) > 0
    assert_op_served_every_verify_layer(mla_ngram, layers=2)


# ---- the user's example --------------------------------------------------------------------------------------------


def test_example_engine_cpu_runs_as_written():
    """examples/sglang/engine_cpu.py (README, examples/sglang/README.md), with fewer tokens to stay quick."""
    import subprocess

    example = Path(__file__).parents[1] / "examples" / "sglang" / "engine_cpu.py"
    run = subprocess.run([sys.executable, str(example), "--tokens", "8"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "NGRAM through kdtree equals generation without speculation" in run.stdout
    assert "TARGET_VERIFY by the kdtree op (KDTREE_VERIFY=on), everything else by" in run.stdout
    assert run.stdout.count("verify steps, accept length") == 2
