"""The DDTree loop is lossless: draft -> build_tree -> verify forward -> accept_greedy -> commit, several requests of
different prompt lengths at once, generates exactly the tokens of plain greedy decoding (one token per step)
of the same target — on CPU (eager), and on CUDA eager and with the whole round captured in one CUDA graph and
replayed every step. The target (kdtree_ops.testing.toy_target) keeps a greedy margin wider than any bf16 rounding can
close, which the test measures; the drafter's noise keeps acceptance strictly between 0 and K, so accepted
paths are committed and read back every round. Two negative tests show the comparison catches a wrong tree
mask and a skipped KV commit, and a fake-tensor run shows the round reads no tensor value on the host.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

from kdtree_ops import ops
from kdtree_ops.ddtree import ops as ddtree
from kdtree_ops.ddtree.loop import LAYOUTS, DDTreeRound, DDTreeState, append_tokens, ddtree_generate, greedy_decode
from kdtree_ops.testing.toy_drafter import BlockDrafter
from kdtree_ops.testing.toy_model import PagedKVCache
from kdtree_ops.testing.toy_target import BF16_UNIT_ROUNDOFF, margin_bound, margin_target, top2_gap

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
MODES = [(d, "eager") for d in DEVICES] + ([("cuda", "cuda_graph")] if "cuda" in DEVICES else [])
BUDGETS = [8, 48]
PROMPT_LENGTHS = [3, 26, 11, 7]
BLOCK_SIZE, TOP_K, NOISE, ROUNDS = 6, 3, 0.35, 6


def prompts(seed: int = 7) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(64, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def dtype_for(device: str) -> torch.dtype:
    return torch.bfloat16 if device == "cuda" else torch.float32


def target_and_drafter(device: str, seed: int = 0):
    model, kappa = margin_target(seed)
    drafter = BlockDrafter(kappa, BLOCK_SIZE, TOP_K, NOISE, seed=seed, device=device)
    return model.to(device=device, dtype=dtype_for(device)), drafter


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("device, mode", MODES, ids=[f"{d}-{m}" for d, m in MODES])
def test_ddtree_generates_the_greedy_tokens(device, mode, layout, budget):
    check_lossless(device, dtype_for(device), mode == "cuda_graph", layout, budget)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ddtree_generates_the_greedy_tokens_in_bf16_on_cpu(layout):
    """The CPU kernels in bf16: the margin holds where a GPU run would round the same way."""
    check_lossless("cpu", torch.bfloat16, False, layout, BUDGETS[-1])


def check_lossless(device: str, dtype: torch.dtype, cuda_graph: bool, layout: str, budget: int):
    model, drafter = target_and_drafter(device)
    model = model.to(dtype)
    requests = prompts()
    run = ddtree_generate(DDTreeRound(model, drafter, budget, layout), requests, ROUNDS, dtype, device,
                          cuda_graph=cuda_graph)
    greedy, logits = greedy_decode(model, requests, max(map(len, run.tokens)), dtype, device)

    # The margin: every greedy decision's top-1 beats its top-2 by more than bf16 rounding can move them.
    gaps = top2_gap(logits)
    bound = margin_bound(logits.abs().max().item(), model.config.num_layers, BF16_UNIT_ROUNDOFF)
    assert gaps.min().item() > bound, f"greedy margin {gaps.min().item():.3f} <= bf16 bound {bound:.3f}"

    for b, (got, want) in enumerate(zip(run.tokens, greedy)):
        assert got == want[:len(got)], f"request {b} (prompt {PROMPT_LENGTHS[b]}): {got} != {want[:len(got)]}"
    accepted = [a for step in run.accepted for a in step]
    assert all(len(t) == 1 + sum(step[b] + 1 for step in run.accepted) for b, t in enumerate(run.tokens))
    assert 0 < statistics.mean(accepted) < BLOCK_SIZE, f"mean acceptance {statistics.mean(accepted)}"
    assert max(accepted) >= 2, "no round accepted a path of two drafts: the commit of accepted K/V is untested"


def test_acceptance_follows_the_noise_knob():
    """More drafter noise, fewer accepted drafts; no noise, every round accepts all K."""
    model, kappa = margin_target(0)
    means = []
    for noise in (0.0, 0.35, 1.5):
        drafter = BlockDrafter(kappa, BLOCK_SIZE, TOP_K, noise)
        run = ddtree_generate(DDTreeRound(model, drafter, 8), prompts()[:2], 3, torch.float32, "cpu")
        means.append(statistics.mean(a for step in run.accepted for a in step))
    assert means[0] == BLOCK_SIZE and means[0] > means[1] > means[2], means


def test_a_wrong_tree_mask_breaks_the_comparison(monkeypatch):
    """The lossless check can fail: a causal mask over node order (siblings visible) instead of the ancestor
    mask changes what the verify forward reads, and the tokens."""
    real_build = ddtree.build_tree

    def causal_build(logprobs, tokens, root_tokens, budget):
        tree_tokens, parents, depths, mask = real_build(logprobs, tokens, root_tokens, budget)
        b, t = parents.shape
        chain = (torch.arange(t, dtype=torch.int32) - 1).repeat(b)
        qo = torch.arange(b + 1, dtype=torch.int32) * t
        return tree_tokens, parents, depths, ops.tree_mask_from_parents(chain, qo, mask.shape[1])

    monkeypatch.setattr(ddtree, "build_tree", causal_build)
    assert_differs_from_greedy(budget=48, layout="paged")


def test_a_skipped_commit_breaks_the_comparison(monkeypatch):
    """The lossless check can fail: without commit_kv's copies the contiguous prefix holds no K/V for the
    accepted tokens."""
    monkeypatch.setattr(ddtree, "commit_kv", lambda *args: None)
    assert_differs_from_greedy(budget=8, layout="contiguous")


def assert_differs_from_greedy(budget: int, layout: str):
    model, drafter = target_and_drafter("cpu")
    requests = prompts()
    run = ddtree_generate(DDTreeRound(model, drafter, budget, layout), requests, ROUNDS, torch.float32, "cpu")
    greedy, _ = greedy_decode(model, requests, max(map(len, run.tokens)), torch.float32, "cpu")
    assert any(got != want[:len(got)] for got, want in zip(run.tokens, greedy))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_round_reads_no_tensor_value(layout):
    """Under FakeTensorMode a .item(), a .tolist(), a nonzero or a boolean-mask index raises: the round runs on
    fake tensors end to end, so it has no host sync and every shape comes from shapes (capture-safe)."""
    model, drafter = target_and_drafter("cpu")
    ddtree_round = DDTreeRound(model, drafter, 48, layout)
    state, cache = ddtree_round.start(prompts(), ROUNDS, torch.float32, "cpu")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = DDTreeState(**{name: None if t is None else mode.from_tensor(t) for name, t in vars(state).items()})
        fake_cache = PagedKVCache([mode.from_tensor(k) for k in cache.k], [mode.from_tensor(v) for v in cache.v])
        ddtree_round(fake, fake_cache)
        assert fake.generated.shape == state.generated.shape and fake.tree_slots.shape == state.tree_slots.shape
        with pytest.raises(DataDependentOutputException):
            fake.seq_lens.max().item()  # the check can fail: a value read is refused


@pytest.mark.parametrize("budget", [1024, 5000, -1])
def test_a_round_refuses_trees_the_verify_op_cannot_take(budget):
    """budget + 1 nodes verify as one tree: past 1023 the mask needs 33 words, which the verify op rejects."""
    model, kappa = margin_target()
    with pytest.raises(ValueError, match=r"budget must be in \[0, 1023\]"):
        DDTreeRound(model, BlockDrafter(kappa, BLOCK_SIZE, TOP_K, NOISE), budget)


def test_append_tokens_writes_each_request_s_count_after_its_output():
    """Three tokens after one, one after three, two after four of five columns (the second lands in the sink)."""
    generated = torch.full((3, 6), -1, dtype=torch.int64)
    num_generated = torch.tensor([1, 3, 4])
    tokens = torch.tensor([[22, 24, 50, 50], [60, 9, 9, 60], [41, 70, 8, 70]])
    append_tokens(generated, num_generated, tokens, torch.tensor([3, 1, 2], dtype=torch.int32))
    assert generated[:, :5].tolist() == [[-1, 22, 24, 50, -1], [-1, -1, -1, 60, -1], [-1, -1, -1, -1, 41]]
    assert num_generated.tolist() == [4, 4, 6]
