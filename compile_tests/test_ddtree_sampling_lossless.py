"""Sampled DDTree is lossless: the tokens a DDTree round emits — ddtree_sample_targets' draw after every node, then
accept_greedy's walk — are distributed exactly as sampling the target token by token, and the test that says so
rejects acceptances that are not.

The target is a Markov chain over V = 6 tokens (its logits after a token x are W[x]), so the exact probability of
every continuation is known: P(x1, x2, x3 | x0) = q(x1 | x0) q(x2 | x1) q(x3 | x2), q the request's filtered,
renormalised distribution (SGLang's temperature, top-k, top-p, min-p; sampling_reference.kept_mask). A block drafter
proposes the chain's marginals per depth with noise (top-2 per position), ddtree_build_tree makes a best-first tree
of 8 nodes, and three rounds emit at least three tokens. 12,000 seeds per parameter group give the joint counts of
(x1, x2, x3); a chi-square test against the exact probabilities (cells expected below 5 pooled, and any token outside
the filtered support fails outright: an exact-count bound) must accept the op and reject each biased variant:
  - ignores_top_p: samples without the top-p filter;
  - top_p_before_temperature: filters softmax(logits) and samples softmax(logits / T) (the order matters);
  - noise_reused_across_positions: every draw keyed by one position, so consecutive tokens share noise;
  - node_noise_reused_across_rounds: noise per tree node index, not per position, so every round reuses it.
A lossless variant that is not position-reproducible — fresh noise per (position, node) — must be accepted too: the
test measures the distribution, not the bits. Last, the mean accepted length equals its exact expectation,
sum over tree nodes of the probability that the target's own sampling walks through them: the most any lossless
verification of a fixed tree can accept (the emitted token is distributed as q, so it is a child with probability
exactly q(children)).
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from kdtree_ops.ddtree import SamplingParams, accept_greedy, build_tree, emitted_tokens, sample_targets
from kdtree_ops.ddtree.loop import append_tokens
from kdtree_ops.ddtree.sampling_reference import kept_mask, scaled_logits

VOCAB, POSITIONS, DRAFT_TOP_K, BUDGET, TOKENS, ROUNDS = 6, 3, 2, 8, 3, 3
SEEDS_PER_GROUP = 12_000
ROOT, FIRST_POSITION = 0, 5
GROUPS = [dict(temperature=0.7, top_p=0.8), dict(temperature=1.5, top_k=3, min_p=0.1),
          dict(temperature=1.0, top_k=4, top_p=0.9, min_p=0.05)]
ALPHA = 1e-4          # the op and the lossless variant must not be rejected at this level in any group
REJECT = 1e-12        # each biased variant must be rejected at this level in some group

_gen = torch.Generator().manual_seed(2026)
TARGET_LOGITS = torch.randn(VOCAB, VOCAB, generator=_gen) * 1.5      # W[x]: logits after token x
DRAFT_NOISE = torch.randn(VOCAB, POSITIONS, VOCAB, generator=_gen)   # the drafter's error per (root, depth)


def drafter(roots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-2 per depth of the chain's unfiltered marginals from the root, plus fixed noise: [B, K, 2] each."""
    step = torch.softmax(TARGET_LOGITS, -1)
    marginal, rows = torch.eye(VOCAB), []
    for _ in range(POSITIONS):
        marginal = marginal @ step
        rows.append(marginal)
    logits = torch.stack(rows, 1).log() + 0.7 * DRAFT_NOISE                     # [V, K, V]
    top = torch.log_softmax(logits, -1).topk(DRAFT_TOP_K, -1)
    return top.values[roots], top.indices[roots]


def requests() -> SamplingParams:
    return SamplingParams.of([dict(g, seed=1000 * i + s) for i, g in enumerate(GROUPS) for s in range(SEEDS_PER_GROUP)])


# ---- the draws: the op, and variants written as the op on altered inputs (fast, and each changes one thing) ------
def op(logits, positions, params, node_index):
    return sample_targets(logits, positions, *params.astuple())


def op_with(*, key=None, top_p_off=False, filter_unscaled=False):
    """The op with its noise keyed by key(positions, node_index), or without top-p, or with the kept set of
    softmax(logits) (before temperature: its complement masked to -inf, the op then samples softmax(logits / T))."""
    def variant(logits, positions, params, node_index):
        temperatures, top_ks, top_ps, min_ps, seeds = params.astuple()
        if filter_unscaled:
            per_row = lambda t: t.repeat_interleave(positions.shape[1])  # noqa: E731
            keep = kept_mask(logits, per_row(top_ks).long(), per_row(top_ps), per_row(min_ps))
            logits = logits.masked_fill(~keep, float("-inf"))
            top_ks, top_ps, min_ps = torch.full_like(top_ks, -1), torch.ones_like(top_ps), torch.zeros_like(min_ps)
        if top_p_off:
            top_ps = torch.ones_like(top_ps)
        keyed = positions if key is None else key(positions, node_index)
        return sample_targets(logits, keyed, temperatures, top_ks, top_ps, min_ps, seeds)
    return variant


DRAWS = {  # name: (draw, lossless)
    "op": (op, True),
    "fresh_noise_per_position_and_node": (op_with(key=lambda pos, node: pos * 4096 + node), True),
    "ignores_top_p": (op_with(top_p_off=True), False),
    "top_p_before_temperature": (op_with(filter_unscaled=True), False),
    "noise_reused_across_positions": (op_with(key=lambda pos, node: torch.zeros_like(pos)), False),
    "node_noise_reused_across_rounds": (op_with(key=lambda pos, node: node.contiguous()), False),
}


def generate(draw_targets, params: SamplingParams):
    """ROUNDS DDTree rounds from ROOT at FIRST_POSITION for every request: (first TOKENS emitted tokens [B, TOKENS],
    round 1's accepted lengths [B], round 1's tree tokens and parents of request 0 of each group)."""
    batch = params.seeds.shape[0]
    roots = torch.full((batch,), ROOT, dtype=torch.int64)
    positions0 = torch.full((batch,), FIRST_POSITION, dtype=torch.int64)
    out = torch.zeros(batch, ROUNDS * (POSITIONS + 1) + 1, dtype=torch.int64)
    count = torch.zeros(batch, dtype=torch.int64)
    first_round = None
    for r in range(ROUNDS):
        logprobs, candidates = drafter(roots)
        tree_tokens, parents, depths, _ = build_tree(logprobs, candidates, roots, BUDGET)
        nodes = tree_tokens.shape[1]
        logits = TARGET_LOGITS[tree_tokens.reshape(-1)]                         # [B*T, V]
        positions = positions0[:, None] + depths.long()
        node_index = torch.arange(nodes).expand(batch, nodes)
        targets = draw_targets(logits, positions, params, node_index)
        accepted, accept_len, bonus = accept_greedy(tree_tokens, parents, targets, POSITIONS)
        append_tokens(out, count, emitted_tokens(tree_tokens, accepted, accept_len, bonus), accept_len + 1)
        roots, positions0 = bonus, positions0 + accept_len + 1
        if r == 0:
            first_round = (accept_len, tree_tokens, parents)
    assert (count >= TOKENS).all()
    return out[:, :TOKENS], first_round


def filtered_q(group: dict) -> torch.Tensor:
    """[V, V] float64: q(y | x), the group's filtered, renormalised next-token distribution after x."""
    p = SamplingParams.of([group] * VOCAB)
    z = scaled_logits(TARGET_LOGITS, p.temperatures)
    keep = kept_mask(z, p.top_ks.long(), p.top_ps, p.min_ps)
    q = torch.softmax(z.double(), -1) * keep
    return q / q.sum(-1, keepdim=True)


def chi_square(tokens: torch.Tensor, q: torch.Tensor) -> tuple[float, float, int]:
    """(statistic, p-value, impossible) of the joint counts of tokens [N, 3] against the exact chain from ROOT;
    impossible counts samples of probability 0 (then p = 0)."""
    v = VOCAB
    expected = (q[ROOT][:, None, None] * q[:, :, None] * q[None, :, :]).flatten() * tokens.shape[0]
    observed = torch.bincount(tokens[:, 0] * v * v + tokens[:, 1] * v + tokens[:, 2], minlength=v ** 3).double()
    impossible = int(observed[expected == 0].sum())
    if impossible:
        return float("inf"), 0.0, impossible
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = (((obs - exp) ** 2) / exp)[keep].sum().item()
    return stat, float(chi2.sf(stat, int(keep.sum()) - 1)), 0


def expected_accept_len(tree_tokens: torch.Tensor, parents: torch.Tensor, q: torch.Tensor) -> float:
    """Exact E[accepted drafts] of one tree: the sum over its nodes of the probability that the target's own
    sampling passes through them (siblings carry distinct tokens: the drafter's top-k at one position)."""
    tok, par = tree_tokens.tolist(), parents.tolist()
    reach = [1.0] + [0.0] * (len(tok) - 1)
    for n in range(1, len(tok)):  # parents precede children
        reach[n] = reach[par[n]] * q[tok[par[n]], tok[n]].item()
    return sum(reach[1:])


@pytest.fixture(scope="module")
def results():
    params, out = requests(), {}
    for name, (draw_targets, _) in DRAWS.items():
        tokens, (accept_len, tree_tokens, parents) = generate(draw_targets, params)
        rows = []
        for i, group in enumerate(GROUPS):
            span = slice(i * SEEDS_PER_GROUP, (i + 1) * SEEDS_PER_GROUP)
            q = filtered_q(group)
            stat, p, impossible = chi_square(tokens[span], q)
            first = i * SEEDS_PER_GROUP
            exact = expected_accept_len(tree_tokens[first], parents[first], q)
            rows.append(dict(stat=stat, p=p, impossible=impossible, exact_accept=exact,
                             accept=accept_len[span].double().mean().item(),
                             accept_std=accept_len[span].double().std().item()))
        out[name] = rows
        print(f"\n{name}: " + "; ".join(f"chi2 {r['stat']:.1f} p {r['p']:.3g} (impossible {r['impossible']}), "
                                      f"accept {r['accept']:.4f} vs exact {r['exact_accept']:.4f}" for r in rows))
    return out


@pytest.mark.parametrize("name", list(DRAWS))
def test_distribution(results, name):
    lossless = DRAWS[name][1]
    p_values = [r["p"] for r in results[name]]
    if lossless:
        assert min(p_values) > ALPHA, f"{name} rejected: {results[name]}"
    else:
        assert min(p_values) < REJECT, f"{name} not rejected: {results[name]}"


@pytest.mark.parametrize("name", ["op", "fresh_noise_per_position_and_node"])
def test_acceptance_is_the_lossless_optimum(results, name):
    """Round 1 of every request in a group walks one tree: its mean accepted length is the exact expectation
    (within 4 standard errors), and no lossless verification of that tree can have a larger one."""
    for r in results[name]:
        assert abs(r["accept"] - r["exact_accept"]) < 4 * r["accept_std"] / SEEDS_PER_GROUP ** 0.5, r
        assert r["exact_accept"] > 0.5  # the trees are worth accepting: the walk is exercised
