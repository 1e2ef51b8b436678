"""The toy decoder (kdtree_ops.testing.toy_model) compiled end to end — embedding, every layer's QKV projection, RoPE,
cache write, tree_verify_attention, output projection and MLP, the LM head — with fullgraph=True and Inductor
on the CPU: no graph break, one compile for verify steps of different N and B, one extern call per layer, and
logits that match eager and the float64 reference path (same weights, attention through the reference).
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from kdtree_ops.testing.toy_model import GQA_CONFIG, MLA_CONFIG, PagedKVCache, ToyDecoder, build_verify_batch
from kdtree_ops.testing.trees import random_tree

NUM_SLOTS = 256
# Verify steps of different shapes: (tree sizes T_b, prefix lengths L_b).
STEPS = [([6, 11], [9, 4]), ([3, 17, 8], [20, 2, 13]), ([40, 5], [7, 30])]


def random_step(config, sizes, prefixes, seed, draft_in_cache, index_dtype=torch.int32):
    """A verify batch over fragmented slots (a random permutation of the pool; slot 0 stays free)."""
    gen = torch.Generator().manual_seed(seed)
    slots = (torch.randperm(NUM_SLOTS - 1, generator=gen) + 1).tolist()
    prefix_slots, draft_slots, tokens, parents = [], [], [], []
    for t, lp in zip(sizes, prefixes):
        prefix_slots.append([slots.pop() for _ in range(lp)])
        draft_slots.append([slots.pop() for _ in range(t)])
        tokens.append(torch.randint(config.vocab_size, (t,), generator=gen).tolist())
        parents.append(random_tree(t, max_depth=6, generator=gen))
    return build_verify_batch(tokens, parents, prefix_slots, draft_slots, draft_in_cache=draft_in_cache,
                              mask_words=2, index_dtype=index_dtype)


def random_cache(config, seed):
    """Pools holding random committed K/V (what earlier steps would have written)."""
    cache = PagedKVCache.empty(config, NUM_SLOTS)
    gen = torch.Generator().manual_seed(seed)
    for k in cache.k:
        k.copy_(torch.randn(k.shape, generator=gen))
    if not cache.values_view_keys:
        for v in cache.v:
            v.copy_(torch.randn(v.shape, generator=gen))
    return cache


def extern_calls(code: str, op: str) -> int:
    return len(re.findall(rf"^\s*(?:\w+ = )?torch\.ops\.kdtree\.{op}\.default\(", code, flags=re.M))


@pytest.mark.parametrize(
    "config, draft_in_cache, index_dtype",
    [(GQA_CONFIG, True, torch.int32), (MLA_CONFIG, False, torch.int64)],
    ids=["gqa_draft_in_cache", "mla_separate_draft"],
)
def test_toy_decoder_compiled_matches_eager_and_reference(config, draft_in_cache, index_dtype):
    torch._dynamo.reset()
    counters.clear()
    model = ToyDecoder(config, seed=0)
    reference_model = ToyDecoder(config, seed=0).double()
    eager_cache, compiled_cache = random_cache(config, 1), random_cache(config, 1)
    reference_cache = eager_cache.to(torch.float64)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model.verify_step, backend=counter, fullgraph=True)

    for i, (sizes, prefixes) in enumerate(STEPS):
        batch = random_step(config, sizes, prefixes, seed=10 + i, draft_in_cache=draft_in_cache,
                            index_dtype=index_dtype)
        batch.mark_dynamic()
        eager = model.verify_step(batch, eager_cache)
        if i == 0:
            got, codes = run_and_get_code(compiled, batch, compiled_cache)
            code = "\n".join(codes)
            assert extern_calls(code, "tree_verify_attention") == config.num_layers, code
            assert extern_calls(code, "tree_mask_from_parents") == 1, code
        else:
            got = compiled(batch, compiled_cache)
        reference = reference_model.verify_step(batch, reference_cache, attention="reference")

        assert got.shape == (sum(sizes), config.vocab_size)
        torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got.double(), reference, rtol=1e-4, atol=1e-4)
        # The compiled step wrote the draft tokens' K/V into its pools as eager did.
        for kc, ke in zip(compiled_cache.k, eager_cache.k):
            torch.testing.assert_close(kc, ke, rtol=1e-5, atol=1e-5)

    assert counter.frame_count == 1, f"{counter.frame_count} compiles for {len(STEPS)} step shapes"
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_logits_depend_on_the_tree():
    """The comparisons above can fail: the same tokens, slots and positions under a chain (causal) mask
    instead of their tree's give other logits."""
    model = ToyDecoder(GQA_CONFIG, seed=0)
    batch = random_step(GQA_CONFIG, [12, 9], [5, 6], seed=3, draft_in_cache=True)
    chain_parents = torch.tensor(list(range(-1, 11)) + list(range(-1, 8)), dtype=torch.int32)
    chain = dataclasses.replace(batch, parents=chain_parents)
    assert not torch.equal(batch.parents, chain.parents)
    tree_logits = model.verify_step(batch, random_cache(GQA_CONFIG, 1))
    chain_logits = model.verify_step(chain, random_cache(GQA_CONFIG, 1))
    assert (tree_logits - chain_logits).abs().max() > 1e-2
