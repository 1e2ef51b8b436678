"""Sampled DDTree on the toy target is the target's own seeded sampling, token for token: the DDTree loop
(kdtree_ops/ddtree/loop.py) with per-request sampling parameters — greedy (temperature 0, and SGLang's temperature 1
with top_k 1) and sampled requests with every filter, mixed in one batch — generates exactly the tokens that
`sample_decode` draws one token per step with the same (seed, position) noise, with acceptance above zero.

On the CPU in float32 the tree forward and the one-token forward agree to float32 rounding, far below the gap
between each draw's best and second-best noisy score (measured here), so the comparison is exact. On CUDA the model
runs in bf16: a draw whose gap is within bf16 rounding of the logits (toy_target.margin_bound / temperature) may
flip, so each request is compared up to its first such draw; and the captured round's replays must equal the eager
round token for token. A negative test shows that a wrong noise key breaks the comparison, and a fake-tensor run
shows the sampled round reads no tensor value on the host.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kdtree_ops.ddtree import SamplingParams
from kdtree_ops.ddtree import sampling
from kdtree_ops.ddtree.loop import LAYOUTS, DDTreeRound, DDTreeState, ddtree_generate, greedy_decode, sample_decode
from kdtree_ops.ddtree.sampling_reference import gumbel_noise, kept_mask, scaled_logits
from kdtree_ops.testing.toy_drafter import BlockDrafter
from kdtree_ops.testing.toy_model import PagedKVCache
from kdtree_ops.testing.toy_target import margin_bound, margin_target

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
MODES = [(d, "eager") for d in DEVICES] + ([("cuda", "cuda_graph")] if "cuda" in DEVICES else [])
BUDGETS = [8, 48]
BLOCK_SIZE, TOP_K, NOISE, ROUNDS = 6, 3, 0.35, 8
PROMPT_LENGTHS = [3, 26, 11, 7, 15, 5]
# The toy target's logits are 12 (its greedy token), 4 (32 tokens) and -4 (31): temperatures 2-3 spread the draws.
REQUESTS = [dict(),                                                 # greedy
            dict(temperature=2.0, seed=11),                         # plain sampling
            dict(temperature=3.0, top_k=8, top_p=0.9, seed=12),
            dict(temperature=2.5, top_p=0.95, min_p=0.02, seed=-5),
            dict(temperature=1.0, top_k=1, seed=3),                 # SGLang's greedy
            dict(temperature=2.5, min_p=0.03, seed=2**40 + 1)]  # min-p drops the 31 tokens at -4
SAMPLED = [b for b, r in enumerate(REQUESTS) if r.get("temperature", 0) > 0 and r.get("top_k") != 1]
CPU_GAP = 1e-4  # the smallest gap a CPU draw may have: float32 forwards' logits differ by ~1e-5


def prompts(seed: int = 7) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(64, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def setup(device: str):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model, kappa = margin_target(0)
    drafter = BlockDrafter(kappa, BLOCK_SIZE, TOP_K, NOISE, device=device)
    return model.to(device=device, dtype=dtype), drafter, dtype, SamplingParams.of(REQUESTS, device=device)


def draw_gaps(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[steps, B] float32: per decision of sample_decode (logits [steps, B, V]), the best kept noisy score minus
    the second best (greedy rows: top-1 minus top-2 logit); inf where one token is kept."""
    steps, batch, vocab = logits.shape
    lens = torch.tensor(PROMPT_LENGTHS)
    p = params.to("cpu")
    gaps = torch.empty(steps, batch)
    for j in range(steps):
        z = scaled_logits(logits[j].float(), p.temperatures)
        keep = kept_mask(z, p.top_ks.long(), p.top_ps, p.min_ps)
        greedy = ~(p.temperatures > 0)
        noise = torch.where(greedy[:, None], 0.0, gumbel_noise(p.seeds, lens - 1 + j, vocab))
        keep = torch.where(greedy[:, None], True, keep)
        top = torch.where(keep, z + noise, -torch.inf).topk(2, -1).values
        gaps[j] = top[:, 0] - top[:, 1]
    return gaps


def run_both(device: str, mode: str, layout: str, budget: int):
    model, drafter, dtype, params = setup(device)
    requests = prompts()
    run = ddtree_generate(DDTreeRound(model, drafter, budget, layout), requests, ROUNDS, dtype, device,
                          cuda_graph=mode == "cuda_graph", sampling=params)
    reference, logits = sample_decode(model, requests, max(map(len, run.tokens)), dtype, device, params)
    bf16_bound = margin_bound(logits.abs().max().item(), model.config.num_layers)
    return run, reference, draw_gaps(logits, params), params, bf16_bound


def acceptance(run) -> list[float]:
    return [statistics.mean(step[b] for step in run.accepted) for b in range(len(REQUESTS))]


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_sampled_ddtree_is_the_targets_sampling_cpu(layout, budget):
    run, reference, gaps, _, _ = run_both("cpu", "eager", layout, budget)
    assert gaps.min().item() > CPU_GAP, f"a draw's gap {gaps.min().item():.2e} is within float rounding"
    for b, (got, want) in enumerate(zip(run.tokens, reference)):
        assert got == want[:len(got)], f"request {b} {REQUESTS[b]}: {got} != {want[:len(got)]}"
    means = acceptance(run)
    print(f"\nmean accepted drafts per round (budget {budget}, {layout}): "
          + ", ".join(f"{REQUESTS[b] or 'greedy'}: {m:.3f}" for b, m in enumerate(means)))
    assert all(means[b] > 0 for b in SAMPLED), means
    assert max(max(step) for step in run.accepted) >= 2  # accepted paths of two drafts: their K/V is committed
    model, _, dtype, _ = setup("cpu")
    greedy, _ = greedy_decode(model, prompts(), max(map(len, run.tokens)), dtype, "cpu")
    for b in (0, 4):  # temperature 0, and SGLang's greedy (temperature 1, top_k 1): the greedy tokens
        assert run.tokens[b] == greedy[b][:len(run.tokens[b])]


if "cuda" in DEVICES:  # defined only where it can run: the CPU suite never skips

    @pytest.mark.cuda
    @pytest.mark.parametrize("budget", BUDGETS)
    @pytest.mark.parametrize("layout", LAYOUTS)
    def test_sampled_ddtree_is_the_targets_sampling_cuda(layout, budget):
        """bf16: every request equals the reference up to its first draw within bf16 rounding; the greedy ones
        (their margin holds) entirely; the captured round's replays equal the eager round entirely."""
        run, reference, gaps, params, bound = run_both("cuda", "eager", layout, budget)
        graph_run, *_ = run_both("cuda", "cuda_graph", layout, budget)
        assert graph_run.tokens == run.tokens and graph_run.accepted == run.accepted
        temperatures = params.temperatures.cpu().clamp_min(1.0)  # greedy rows: the logits' own gap
        compared = 0
        for b, (got, want) in enumerate(zip(run.tokens, reference)):
            fragile = (gaps[:, b] <= bound / temperatures[b]).nonzero()
            safe = len(got) if len(fragile) == 0 else min(len(got), int(fragile[0]))
            assert got[:safe] == want[:safe], f"request {b} {REQUESTS[b]}: {got[:safe]} != {want[:safe]}"
            if b not in SAMPLED:
                assert safe == len(got), f"greedy request {b}: a draw within the bf16 bound"
            compared += safe
        assert compared > sum(map(len, run.tokens)) // 3
        assert any(acceptance(run)[b] > 0 for b in SAMPLED)


def test_a_wrong_noise_key_breaks_the_comparison(monkeypatch):
    """The comparison can fail: tree rows keyed by their position + 1 (the drawn token's position, an easy
    off-by-one) draw other noise than the target's own decoding, and the sampled requests' tokens differ."""
    real = sampling.sample_targets

    def shifted(logits, positions, *params):
        return real(logits, positions + 1 if positions.shape[1] > 1 else positions, *params)

    monkeypatch.setattr(sampling, "sample_targets", shifted)
    run, reference, *_ = run_both("cpu", "eager", "paged", 8)
    differs = [got != want[:len(got)] for got, want in zip(run.tokens, reference)]
    assert all(differs[b] for b in SAMPLED) and not differs[0], differs


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_sampled_round_reads_no_tensor_value(layout):
    """Under FakeTensorMode a .item(), a .tolist() or a value-dependent shape raises: the sampled round runs on
    fake tensors end to end (sampling parameters included), so it has no host sync and is capture-safe."""
    model, drafter, dtype, params = setup("cpu")
    ddtree_round = DDTreeRound(model, drafter, 48, layout)
    state, cache = ddtree_round.start(prompts(), ROUNDS, dtype, "cpu", sampling=params)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {name: None if t is None else mode.from_tensor(t) for name, t in vars(state).items()
                if name != "sampling"}
        fake_params = SamplingParams(*(mode.from_tensor(t) for t in params.astuple()))
        fake_state = DDTreeState(**fake, sampling=fake_params)
        fake_cache = PagedKVCache([mode.from_tensor(k) for k in cache.k], [mode.from_tensor(v) for v in cache.v])
        ddtree_round(fake_state, fake_cache)
        assert fake_state.generated.shape == state.generated.shape
