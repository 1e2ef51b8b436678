"""DDTREE's draft cache inside SGLang's KV budget, through SGLang's own pool sizing, on the CPU.

SGLang (0.5.23) turns the bytes that --mem-fraction-static leaves for the KV cache into a token count with a pool
configurator (`create_memory_pool_configurator`, model_executor/pool_configurator.py); for DFLASH the bytes per token
are the target's plus the draft pool's. DDTREE's draft cache (one row per target slot, plus page_size + 1) was
allocated after that sizing, outside the budget: the target's pool took the whole budget and the cache came out of
the activations' headroom. The plugin's AFTER hook on `create_memory_pool_configurator` (kdtree_ops/sglang/
ddtree_memory.py) now wraps a DDTREE target's configurator so that both fit. Checked here with SGLang's
DefaultPoolConfigurator (its `__init__` bypassed: the bytes per token of the engine tests' markov target set by
hand) wrapped by the hooks the plugin registered, as HookRegistry.apply_hooks wraps the function:

- the target's pool and the draft cache (bytes per slot of the DFlash drafter the engine tests load) fit the budget,
  and one page more would not; the token count is DFLASH's (SGLang's `scale_kv_cell_size_per_token_for_dflash`:
  target + draft bytes per token) for the budget less the cache's page_size + 1 extra rows;
- runners that are not a DDTREE target (draft workers, other algorithms) keep SGLang's configurator;
- a budget too small for any pool is SGLang's own "Not enough memory" error.
Before the hook, the first check failed: the pool took budget // target bytes per token, and the cache came on top.
The engine test (test_sglang_ddtree_engine.py) shows the hook runs in a real launch and the drafter's cache matches
what was charged.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator  # noqa: E402
from sglang.srt.speculative.dflash_utils import scale_kv_cell_size_per_token_for_dflash  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from test_sglang_ddtree_graphs import plugin_hooked  # noqa: E402

from kdtree_ops.sglang import ddtree_memory  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from sglang_cpu import ddtree_models  # noqa: E402

TARGET = "sglang.srt.model_executor.pool_configurator.create_memory_pool_configurator"
TARGET_LAYERS, TARGET_KV_HEADS, TARGET_HEAD_DIM = 2, 2, 96  # ddtree_models.markov_llama
TARGET_CELL = 2 * TARGET_LAYERS * TARGET_KV_HEADS * TARGET_HEAD_DIM * 4  # K and V, float32: 3072 bytes per token
DRAFT_LAYERS, DRAFT_HEAD_DIM = 1, 128  # ddtree_models.dflash_draft_weights
DRAFT_CELL = 2 * DRAFT_LAYERS * ddtree_models.TOY.draft_heads * DRAFT_HEAD_DIM * 4  # 4096 bytes per slot


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory):
    return str(ddtree_models.dflash_draft(tmp_path_factory.mktemp("ddtree_memory") / "draft"))


@pytest.fixture
def launch(monkeypatch, draft_path):
    """The runtime context the hook reads: the DDTREE launch's draft checkpoint, one TP rank."""
    import sglang.srt.runtime_context as runtime_context

    monkeypatch.setattr(runtime_context, "get_spec", lambda: SimpleNamespace(speculative_draft_model_path=draft_path))
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(tp_size=1))
    monkeypatch.setattr(ddtree_memory, "_budgeted_bytes_per_slot", None)


def sglang_configurator(cell_size: int) -> DefaultPoolConfigurator:
    """SGLang's configurator for an MHA target of `cell_size` bytes per token (what its __init__ computes)."""
    configurator = DefaultPoolConfigurator.__new__(DefaultPoolConfigurator)
    configurator.kv_cache_dtype_str = "auto"
    configurator._cell_size = cell_size
    configurator._fixed_overhead_bytes = 0
    configurator._zero_kv_max_tokens = 0
    return configurator


def kv_cache_configurator(algorithm: str = "DDTREE", page_size: int = 1, is_draft_worker: bool = False):
    """The fields of SGLang's KVCacheConfigurator the hook reads."""
    return SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.from_string(algorithm), is_draft_worker=is_draft_worker,
                           model_dtype=torch.float32, page_size=page_size)


def configurator_for(kvc):
    """create_memory_pool_configurator(kvc) with the plugin's hooks, its original answering SGLang's configurator."""
    return plugin_hooked(lambda kvc: sglang_configurator(TARGET_CELL), TARGET)(kvc)


def budgets() -> list:
    """Random KV budgets from 1 MiB to 16 GiB, 10 GiB, and None: three pages and a byte of both (the tightest)."""
    rng = random.Random(0)
    return [rng.randrange(2**20, 2**34) for _ in range(6)] + [10 * 2**30, None]


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("budget", budgets())
def test_the_target_pool_and_the_draft_cache_fit_the_budget(launch, budget, page_size):
    extra = page_size + 1  # the cache's rows past the pool's: the pool's own page_size rows, then a scratch row
    if budget is None:
        budget = 3 * page_size * (TARGET_CELL + DRAFT_CELL) + extra * DRAFT_CELL + 1
    config = configurator_for(kv_cache_configurator(page_size=page_size)).calculate_pool_sizes(budget, page_size)
    tokens = config.max_total_num_tokens

    def total(t: int) -> int:
        return t * TARGET_CELL + (t + extra) * DRAFT_CELL

    assert tokens % page_size == 0
    assert total(tokens) <= budget, (
        f"target pool {tokens * TARGET_CELL} + draft cache {(tokens + extra) * DRAFT_CELL} bytes exceed the KV budget "
        f"{budget} by {total(tokens) - budget}")
    assert total(tokens + page_size) > budget, "a page more would have fit: the budget is not used"
    dflash = sglang_configurator(scale_kv_cell_size_per_token_for_dflash(
        target_cell_size_per_token=TARGET_CELL, target_num_layers=TARGET_LAYERS, draft_num_layers=DRAFT_LAYERS,
        draft_cell_size_per_token=DRAFT_CELL))
    assert tokens == dflash.calculate_pool_sizes(budget - extra * DRAFT_CELL, page_size).max_total_num_tokens
    assert ddtree_memory.budgeted_bytes_per_slot() == DRAFT_CELL


@pytest.mark.parametrize("algorithm, is_draft_worker", [("DDTREE", True), ("EAGLE", False), (None, False),
                                                         ("NGRAM", False)])
def test_other_runners_keep_sglang_s_configurator(launch, algorithm, is_draft_worker):
    kvc = kv_cache_configurator(algorithm or "NONE", is_draft_worker=is_draft_worker)
    configurator = configurator_for(kvc)
    assert type(configurator) is DefaultPoolConfigurator
    assert configurator.calculate_pool_sizes(10 * 2**30, 1).max_total_num_tokens == 10 * 2**30 // TARGET_CELL
    assert ddtree_memory.budgeted_bytes_per_slot() is None


def test_a_budget_too_small_for_both_is_sglang_s_not_enough_memory(launch):
    configurator = configurator_for(kv_cache_configurator(page_size=16))
    with pytest.raises(RuntimeError, match="Not enough memory. Please try to increase --mem-fraction-static"):
        configurator.calculate_pool_sizes(16 * (TARGET_CELL + DRAFT_CELL), 16)  # the 17 extra rows leave no page


def test_a_user_token_cap_and_the_finish_stay_sglang_s(launch):
    configurator = configurator_for(kv_cache_configurator(page_size=16))
    assert configurator.calculate_pool_sizes_from_max_tokens(1000, 16).max_total_num_tokens == 992
    config = configurator.calculate_pool_sizes(2**30, 16)
    assert configurator.finalize_with_max_running_requests(config) is config
    assert configurator.kv_cache_dtype_str == "auto"  # other attributes are the wrapped configurator's


@pytest.mark.parametrize("positions", range(0, 4))
def test_target_budget_is_the_largest_that_fits(positions):
    """target_budget against a scan, for a configurator with a fixed overhead and pages of 4 tokens."""
    cell, fixed, page, per_slot, extra = 40, 100, 4, 24 + 8 * positions, 5

    def tokens(b: int) -> int:
        return max(b - fixed, 0) // cell // page * page

    for available in range(0, 1200, 7):
        want = max((b for b in range(available + 1) if b + (tokens(b) + extra) * per_slot <= available), default=0)
        assert ddtree_memory.target_budget(available, tokens, per_slot, extra) == want
