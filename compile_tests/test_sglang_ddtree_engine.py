"""`--speculative-algorithm DDTREE` in a real sglang.Engine on the CPU: lossless, accepting trees, refusing clearly.

The engine runs in the driver process of sglang_cpu/engine_driver.py (SGLANG_USE_CPU_ENGINE=1, the test-only
sgl_kernel stand-in), `attention_backend="kdtree"` over SGLang's default base (torch_native here), with the target
and DFlash drafter of sglang_cpu/ddtree_models.py (built to agree most of the time: f(bonus), f^2(bonus), ... are
the drafter's top candidates at every position, and the target follows f except where its attention decides
otherwise). The algorithm comes from the plugin alone (the `sglang.srt.plugins` entry point), nothing patched.
Shown, over four requests of different lengths, greedy, `ignore_eos`:

a. DDTREE's output equals the engine's without speculation, token for token, radix cache on (a second round
   reuses cached prefixes, whose draft K/V the draft cache kept) and off with chunked prefill (16-token chunks);
   drafts are accepted but not all of them (0 < accepted drafts per verify < 7); every verify layer of every
   round ran the op (counted in Python and, KDTREE_VERIFY_COUNT=1, on the device); the draft cache is sized inside
   SGLang's KV budget (and the drafter's weights load before SGLang measures the memory left);
b. the tree beats the chain: the same drafter as a chain of top-1 picks (KDTREE_DDTREE_TOPK=1, DFLASH's block)
   accepts fewer drafts per verify;
b'. KDTREE_DDTREE_BUDGETS: as requests finish and the batch shrinks, rounds change width (plain decode, 4, 16
   tokens) and stay lossless; the server log says each width;
c. log-probs come back for the accepted tokens, equal to the non-speculative run's;
d. sampling: temperature 0.7 with a seed, a greedy request in the same batch: the greedy one stays lossless, and
   every token the sampled ones drew is the token SGLang's seeded torch sampler (`sampling_from_probs_torch` with
   the seed: `multinomial_with_seed`, SGLang's hash run by Triton's interpreter) draws from the target's
   distribution at that position, read from a non-speculative engine given the same prefix — an independent
   sampler on the target's own logits. (SGLang's seeded engine itself cannot run here: its deterministic-inference
   mode, the only one that passes per-request seeds to the sampler, needs CUDA or XPU, "No supported accelerator".)
   A best-first tree, a top-1 chain and plain decode rounds (KDTREE_DDTREE_BUDGETS) emit the same tokens;
e. refusals: a grammar-constrained request is aborted with SGLang's message and the server goes on; a bad
   KDTREE_DDTREE_TOPK, a missing draft path or a node budget the drafter cannot fill (KDTREE_DDTREE_TOPK=1, 16
   tokens, block 8: it launched, then died in its first round) fail at launch, naming the fix; so does a verify
   that would not run the op (KDTREE_VERIFY=off over the intel_amx base, --attention-backend intel_amx), which gave
   wrong tokens.
Token equality does not hinge on near-ties: every compared greedy token's margin in the reference is at least
MIN_MARGIN.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

sys.path.insert(0, str(Path(__file__).parent))
from sglang_cpu import ddtree_models, tiny_models  # noqa: E402
from sglang_cpu.engine_fixtures import ddtree_checkpoints, host  # noqa: E402,F401 (host: a fixture)
from sglang_cpu.engine_host import EngineError  # noqa: E402

NEW_TOKENS = 32
MIN_MARGIN = 1e-4
DRAFTED = ddtree_models.BLOCK_SIZE - 1  # positions the drafter proposes per round
SAMPLED = {"temperature": 0.7, "sampling_seed": 1234}


def _prompts() -> list:
    rng = random.Random(0)
    return [[rng.randrange(3, tiny_models.VOCAB) for _ in range(n)] for n in (5, 17, 40, 23)]


PROMPTS = _prompts()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return ddtree_checkpoints(tmp_path_factory.mktemp("ddtree_models"))


def ddtree(models, tokens: int = 16) -> dict:
    return dict(attention_backend="kdtree", speculative_algorithm="DDTREE",
                speculative_draft_model_path=models["draft"], speculative_num_draft_tokens=tokens)


def _run(host, model: str, rounds: int = 1, logprobs: bool = False, params: list | None = None, env=None,
         **engine) -> dict:
    host.start(model, env=env, **engine)
    try:
        if params is None:
            results = [host.generate(PROMPTS, NEW_TOKENS, top_logprobs_num=2 if logprobs else 0)
                       for _ in range(rounds)]
        else:
            results = [host.request("generate", input_ids=PROMPTS, sampling_params=params)["outputs"]]
        status = host.kdtree_status()
    finally:
        host.stop()
    return {"rounds": results, "ids": [o["output_ids"] for o in results[0]], "status": status,
            "log": host.new_log()}


def sampled_params(greedy_first: bool = False) -> list:
    """Every request sampled (temperature 0.7, one seed), or the first greedy and the rest sampled."""
    params = [dict(SAMPLED, max_new_tokens=NEW_TOKENS, ignore_eos=True) for _ in PROMPTS]
    if greedy_first:
        params[0] = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
    return params


@pytest.fixture(scope="module")
def reference(host, models):
    return _run(host, models["target"], logprobs=True, attention_backend="torch_native")


@pytest.fixture(scope="module")
def radix(host, models):
    return _run(host, models["target"], rounds=2, env={"KDTREE_VERIFY_COUNT": "1"}, **ddtree(models))


@pytest.fixture(scope="module")
def chunked(host, models):
    return _run(host, models["target"], disable_radix_cache=True, chunked_prefill_size=16, **ddtree(models, 64))


@pytest.fixture(scope="module")
def chain(host, models):
    return _run(host, models["target"], env={"KDTREE_DDTREE_TOPK": "1"}, **ddtree(models, DRAFTED + 1))


@pytest.fixture(scope="module")
def with_logprobs(host, models):
    return _run(host, models["target"], logprobs=True, **ddtree(models))


@pytest.fixture(scope="module")
def sampled(host, models):
    return _run(host, models["target"], params=sampled_params(True), **ddtree(models))


@pytest.fixture(scope="module")
def sampled_chain(host, models):
    return _run(host, models["target"], params=sampled_params(True), env={"KDTREE_DDTREE_TOPK": "1"},
                **ddtree(models, DRAFTED + 1))


def min_margin(run: dict) -> float:
    return min(top[0][0] - top[1][0] for o in run["rounds"][0] for top in o["meta_info"]["output_top_logprobs"])


def drafts_per_verify(run: dict) -> float:
    """Accepted draft tokens per verify round, over every request (accept length counts the bonus token)."""
    metas = [o["meta_info"] for o in run["rounds"][0]]
    verifies = sum(m["spec_verify_ct"] for m in metas)
    return sum((m["spec_accept_length"] - 1) * m["spec_verify_ct"] for m in metas) / verifies


# ---- a. lossless, accepting -------------------------------------------------------------------------------------


def test_reference_tokens_have_a_greedy_margin(reference):
    assert [len(ids) for ids in reference["ids"]] == [NEW_TOKENS] * len(PROMPTS)
    assert min_margin(reference) >= MIN_MARGIN


def test_ddtree_with_radix_cache_equals_non_speculative(reference, radix):
    first, second = radix["rounds"]
    assert radix["ids"] == reference["ids"]
    assert [o["output_ids"] for o in second] == reference["ids"]  # from cached prefixes: their draft K/V kept
    assert sum(o["meta_info"]["cached_tokens"] for o in second) > 0
    assert 0 < drafts_per_verify(radix) < DRAFTED, drafts_per_verify(radix)


def test_ddtree_without_radix_cache_chunked_prefill_equals_non_speculative(reference, chunked):
    assert chunked["ids"] == reference["ids"]
    assert 0 < drafts_per_verify(chunked) < DRAFTED


def test_the_op_served_every_verify_layer(radix):
    (status,) = [s for s in radix["status"] if s["verify_steps"]]
    steps = status["verify_steps"]
    assert status["op_calls"] == {"0": steps, "1": steps} and status["base_calls"] == {}, status
    # KDTREE_VERIFY_COUNT=1: the op's calls counted on the device agree (eager here; on a GPU, replays too).
    assert status["device_op_calls"] == status["op_calls"] and status["device_non_finite"] == 0, status
    assert "DDTREE worker: trees of 16 tokens (budget 15), top-8 of 7 drafted positions" in radix["log"]


def test_the_draft_cache_is_sized_inside_sglang_s_kv_budget(radix):
    """The drafter's weights load before SGLang measures the memory left for the KV pools, SGLang's pool sizing
    charged the draft cache (the plugin's hook on create_memory_pool_configurator: test_sglang_ddtree_memory.py), and
    the cache the drafter allocated is what was charged: its bytes per slot, one row per target slot plus page_size
    (1 here) and a scratch row. (The CPU runs cap the pool at max_total_tokens=4096, so the budget line shows the
    profiled split and the pool the cap.)"""
    log = radix["log"]
    pool = re.search(r"KV Cache is allocated\. dtype: \S+, #tokens: (\d+)", log)
    cache = re.search(r"DDTREE draft cache: (\d+) slots \+ 1 scratch, (\d+) bytes per slot \(budgeted (\d+)\)", log)
    assert pool and cache, "no target pool or draft cache line in the log"
    slots, per_slot, budgeted = map(int, cache.groups())
    assert per_slot == budgeted == 2 * 1 * ddtree_models.TOY.draft_heads * 128 * 4  # K, V x 1 layer, float32
    assert slots == int(pool.group(1)) + 1
    assert "DDTREE KV budget: " in log
    assert log.index("DDTREE DFlash drafter: ") < log.index("KV Cache is allocated"), "draft weights loaded after"


# ---- b. tree against chain ------------------------------------------------------------------------------------


def test_the_tree_accepts_more_than_the_chain(reference, radix, chain):
    assert chain["ids"] == reference["ids"]
    assert drafts_per_verify(radix) > drafts_per_verify(chain) > 0, (drafts_per_verify(radix),
                                                                      drafts_per_verify(chain))


# ---- b'. the tree size per batch size ----------------------------------------------------------------------------

BUDGET_LENGTHS = (8, 16, 24, 32)  # the batch shrinks from 4 requests to 1 as they finish
BUDGETS = "1:16,2:4,3:1"  # one request: the launch width; two: 4 tokens; three or more: plain decode


@pytest.fixture(scope="module")
def budgets(host, models):
    params = [{"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for n in BUDGET_LENGTHS]
    return _run(host, models["target"], params=params, env={"KDTREE_DDTREE_BUDGETS": BUDGETS}, **ddtree(models))


def test_widths_per_batch_size_down_to_plain_decode_equal_non_speculative(reference, budgets):
    assert budgets["ids"] == [ids[:n] for ids, n in zip(reference["ids"], BUDGET_LENGTHS)]
    log = budgets["log"]
    assert ("DDTREE: tree tokens per batch size (KDTREE_DDTREE_BUDGETS): 1: 16; 2: 4; 3+: 1 (plain decode, no draft)"
            in log)
    changes = re.findall(r"DDTREE: batch of (\d+) requests: trees of (\d+) tokens", log)
    assert changes == [("4", "1"), ("2", "4"), ("1", "16")], changes
    # the request that finishes first saw plain rounds only (one token a verify); the last one, after the plain
    # rounds, accepts drafts from a drafter whose context the plain rounds kept whole
    first, *_, last = (o["meta_info"] for o in budgets["rounds"][0])
    # (the prefill emits each request's first token; every verify after it at least one)
    assert first["spec_verify_ct"] == first["completion_tokens"] - 1 == BUDGET_LENGTHS[0] - 1, first
    assert last["spec_verify_ct"] < last["completion_tokens"] - 1, last


# ---- c. log-probs -----------------------------------------------------------------------------------------------


def test_logprobs_equal_the_non_speculative_run(reference, with_logprobs):
    assert with_logprobs["ids"] == reference["ids"]
    for ours, theirs in zip(with_logprobs["rounds"][0], reference["rounds"][0]):
        got = [lp for lp, _tok, _ in ours["meta_info"]["output_token_logprobs"]]
        want = [lp for lp, _tok, _ in theirs["meta_info"]["output_token_logprobs"]]
        assert got == pytest.approx(want, abs=1e-4)


# ---- d. sampling ------------------------------------------------------------------------------------------------


def sglang_murmur_hash32(seed, positions, col_indices):
    """SGLang's own murmur_hash32 kernel (kernels/ops/sampling/murmur_hash.py), run by Triton's interpreter on the
    CPU: on a CPU device SGLang calls sgl_kernel's murmur_hash32_cpu, which no published wheel has."""
    import importlib.util
    import os

    import sglang

    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # read when the module's @triton.jit runs
    try:
        spec = importlib.util.spec_from_file_location("sglang_murmur_interpreted",
                                                      sglang.__path__[0] + "/kernels/ops/sampling/murmur_hash.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = saved
    out = torch.empty((seed.shape[0], col_indices.shape[0]), dtype=torch.uint32)
    module.murmur_hash32_kernel[(seed.shape[0], 1)](seed, positions, col_indices, out, seed.shape[0],
                                                    col_indices.shape[0], BLOCK_SIZE=1024)
    return out


def sglang_seeded_draws(logprobs, temperature: float, seed: int, positions):
    """SGLang's torch sampler on the target's distributions [n, V] (log-probs: logits up to a constant) for a
    temperature-only request: logits / T, softmax, then `sampling_from_probs_torch` with the request's seed and each
    draw's position (its input token's), i.e. `multinomial_with_seed`: argmax of log p + Gumbel(hash(seed, position,
    vocab id)) in float64. Returns (tokens [n], each draw's margin between its two best scores)."""
    from unittest import mock

    from sglang.srt.layers import sampler

    probs = torch.softmax(logprobs / temperature, dim=-1)
    seeds = torch.full((probs.shape[0],), seed, dtype=torch.int64)
    # SGLang compiles multinomial_with_seed with torch.compile; dynamo cannot trace Triton's interpreter, so the
    # sampler runs eagerly (the same Python, the same arithmetic)
    with mock.patch.object(sampler, "murmur_hash32", sglang_murmur_hash32), torch.compiler.set_stance("force_eager"):
        tokens = sampler.sampling_from_probs_torch(probs, sampling_seed=seeds, positions=positions)
        hashed = sglang_murmur_hash32(seeds.to(torch.uint64), positions, torch.arange(probs.shape[1]))
    u = hashed.to(torch.float64) / torch.iinfo(torch.uint32).max  # multinomial_with_seed's Gumbel, for the margin
    gumbel = -torch.log(-torch.log(u).clamp(min=torch.finfo(torch.float64).min, max=-(2.0 ** -32)))
    top2 = (torch.log(probs).double() + gumbel).topk(2, dim=-1).values
    return tokens.long(), top2[:, 0] - top2[:, 1]


@pytest.fixture(scope="module")
def target_distributions(host, models, sampled):
    """The target's log-probs over the whole vocabulary [len(output), V] at every position of each DDTREE output:
    the non-speculative engine reads prompt + output as its input (input log-probs of every token)."""
    host.start(models["target"], attention_backend="torch_native")
    try:
        outs = host.request("generate", input_ids=[p + ids for p, ids in zip(PROMPTS, sampled["ids"])],
                            sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                            top_logprobs_num=tiny_models.VOCAB, logprob_start_len=0)["outputs"]
    finally:
        host.stop()
    host.new_log()
    result = []
    for prompt, out in zip(PROMPTS, outs):
        rows = out["meta_info"]["input_top_logprobs"][len(prompt):]  # row i: the distribution of output token i
        dist = torch.full((len(rows), tiny_models.VOCAB), -torch.inf)
        for i, row in enumerate(rows):
            for logprob, token, _text in row:
                dist[i, token] = logprob
        result.append(dist)
    return result


def test_sampled_ddtree_draws_sglang_s_seeded_torch_sampler_tokens(sampled, target_distributions):
    """Every token DDTREE drew (all but the first, which the prefill draws with SGLang's own unseeded sampler) is the
    token SGLang's seeded torch sampler draws from the target's distribution at that position, given the tokens
    before it: an independent sampler (SGLang's code and hash, not the op's) on the target's logits from a
    non-speculative engine. Equality does not hinge on near-ties: every compared draw's margin is >= MIN_MARGIN."""
    compared = 0
    for prompt, ids, dist, params in zip(PROMPTS, sampled["ids"], target_distributions, sampled_params(True)):
        if params["temperature"] == 0:
            continue
        assert dist.shape == (len(ids), tiny_models.VOCAB) and torch.isfinite(dist).all()
        positions = torch.arange(1, len(ids)) + len(prompt) - 1  # draw j's input token sits at prompt + j - 1
        want, margin = sglang_seeded_draws(dist[1:], params["temperature"], params["sampling_seed"], positions)
        assert margin.min() >= MIN_MARGIN, margin.min()
        assert ids[1:] == want.tolist()
        compared += len(ids) - 1
    assert compared == 3 * (NEW_TOKENS - 1)


@pytest.fixture(scope="module")
def sampled_plain(host, models):  # four requests of one length: every round of the batch is plain decode
    return _run(host, models["target"], params=sampled_params(True), env={"KDTREE_DDTREE_BUDGETS": "4:1"},
                **ddtree(models))


def test_sampled_plain_decode_rounds_draw_the_tree_s_tokens(sampled, sampled_plain):
    assert sampled_plain["ids"] == sampled["ids"]
    metas = [o["meta_info"] for o in sampled_plain["rounds"][0]]  # one token a verify (the prefill gave the first)
    assert all(m["spec_verify_ct"] == m["completion_tokens"] - 1 for m in metas), metas


def test_sampled_ddtree_is_the_target_s_seeded_sampling_whatever_the_tree(reference, sampled, sampled_chain):
    # Each position's token is the target's draw with that position's noise, so two different trees (best-first
    # with top-8, a top-1 chain) must emit the same tokens; they accept different drafts on the way.
    assert sampled["ids"] == sampled_chain["ids"]
    assert drafts_per_verify(sampled) != drafts_per_verify(sampled_chain)
    assert drafts_per_verify(sampled) > 0
    assert sampled["ids"][0] == reference["ids"][0]   # the greedy request of the mixed batch: lossless
    assert all(a != b for a, b in zip(sampled["ids"][1:], reference["ids"][1:]))  # the others did sample


# ---- e. refusals --------------------------------------------------------------------------------------------------


def test_a_grammar_request_is_refused_and_the_server_goes_on(host, models, reference):
    host.start(models["target"], **ddtree(models))
    try:
        with pytest.raises(EngineError, match="grammar-backend none"):
            host.request("generate", input_ids=PROMPTS[:1], sampling_params={
                "max_new_tokens": 4, "json_schema": json.dumps({"type": "object"})})
        assert host.generate(PROMPTS[:1], NEW_TOKENS)[0]["output_ids"] == reference["ids"][0]
    finally:
        host.stop()
    assert "grammar-constrained requests are not verified by DDTREE" in host.new_log()


@pytest.mark.parametrize("engine, env, message", [
    ({}, {"KDTREE_DDTREE_TOPK": "0"}, "KDTREE_DDTREE_TOPK must be a positive integer"),
    ({"speculative_draft_model_path": None}, {}, "needs --speculative-draft-model-path"),
    ({"speculative_num_draft_tokens": 1025}, {}, r"must be in \[2, 1024\]"),
    ({"speculative_num_draft_tokens": 16}, {"KDTREE_DDTREE_TOPK": "1"},
     r"--speculative-num-draft-tokens 16 asks for 15 draft nodes.* KDTREE_DDTREE_TOPK=1 .* 7 drafted positions "
     r"\(block_size 8\).* only 7 paths.*fix: --speculative-num-draft-tokens <= 8, or KDTREE_DDTREE_TOPK >= 2"),
], ids=["topk", "draft-path", "width", "unfillable-budget"])
def test_bad_launch_arguments_fail_naming_the_fix(host, models, engine, env, message):
    with pytest.raises(EngineError, match=message):
        host.start(models["target"], env=env, **{**ddtree(models), **engine})
    host.new_log()


@pytest.mark.parametrize("engine, env, fix", [
    ({}, {"KDTREE_BASE_BACKEND": "intel_amx", "KDTREE_VERIFY": "off"}, "KDTREE_VERIFY=off"),
    ({"attention_backend": "intel_amx"}, {}, "--attention-backend kdtree"),
], ids=["verify-off-over-intel_amx", "intel_amx-backend"])
def test_a_verify_that_would_not_run_the_op_is_refused_at_launch(host, models, engine, env, fix):
    """DDTREE's verify input carries its tree only as the op's packed mask: another kernel would attend causally over
    the flattened tree (seen before this refusal, over intel_amx with KDTREE_VERIFY=off: tokens [234, 171, 259, 146,
    108, ...] where generation without speculation gives [234, 171, 259, 167, 70, ...])."""
    with pytest.raises(EngineError, match="DDTREE verifies its trees only through the kdtree op") as info:
        host.start(models["target"], env=env, **{**ddtree(models), **engine})
    assert fix in str(info.value)
    host.new_log()


def test_example_ddtree_cpu_runs_as_written():
    """examples/sglang/ddtree_cpu.py (README), with fewer tokens to stay quick."""
    import subprocess

    example = Path(__file__).parents[1] / "examples" / "sglang" / "ddtree_cpu.py"
    run = subprocess.run([sys.executable, str(example), "--tokens", "8", "--chain"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "DDTREE through kdtree equals generation without speculation" in run.stdout
    assert "| tree, top-8 | 16 |" in run.stdout and "| chain, top-1 (DFLASH's shape) | 8 |" in run.stdout
