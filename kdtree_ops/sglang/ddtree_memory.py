"""DDTREE's draft cache inside SGLang's KV budget (what --mem-fraction-static leaves), as DFLASH's draft pool is.

How SGLang 0.5.23 sizes the KV pools: `KVCacheConfigurator._profile_available_bytes` (mem_cache/kv_cache_configurator.py)
measures the memory free once the weights are loaded and keeps back (1 - mem_fraction_static) of what was free
before loading (the activations' headroom); a pool configurator (`create_memory_pool_configurator`,
model_executor/pool_configurator.py) turns that budget into tokens, budget // bytes per token. For DFLASH the
target's bytes per token include its draft pool's (`_dflash_draft_cell_size`, `scale_kv_cell_size_per_token_for_dflash`:
target + draft), and the draft worker allocates the target's token count, so both pools share the budget; its
draft weights are loaded before the measurement (the draft worker is built first), so they are charged too.

DDTREE's draft cache (dflash_drafter.py) also has a row per target slot (plus page_size + 1), but SGLang grants
that accounting by `is_dflash_family()`, which DDTREE, a plugin algorithm, answers False: answering True would also
switch on DFLASH's draft runner, graph-capture and scheduler paths. So the plugin registers an AFTER hook (SGLang's
HookRegistry, no patch of ours) on `create_memory_pool_configurator`: for a DDTREE target it wraps SGLang's
configurator in `DraftCacheBudget`, which gives the target the largest pool whose bytes plus the draft cache's fit
the budget, T target tokens with bytes(T) + (T + page_size + 1) * draft bytes per slot <= budget: DFLASH's sum of
bytes per token, the cache's extra rows charged as well. The worker loads the drafter's weights in its __init__, before
SGLang measures, as DFLASH's draft worker does.

Left as SGLang has it: a user's --max-total-tokens caps the target's tokens (the cache follows the pool); with
SGLANG_ENABLE_POST_CAPTURE_KV_SIZING (off by default, CUDA only) the pool is re-sized after graph capture from the
memory then free, which already excludes the allocated cache, so the cache is charged twice there (a smaller pool,
never an overcommit).
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from typing import Callable

logger = logging.getLogger(__name__)

TARGET = "sglang.srt.model_executor.pool_configurator.create_memory_pool_configurator"

_budgeted_bytes_per_slot: int | None = None  # what this process's DDTREE pool sizing charged per draft-cache slot


def budgeted_bytes_per_slot() -> int | None:
    """Bytes per draft-cache slot that SGLang's pool sizing charged in this process; None if none ran."""
    return _budgeted_bytes_per_slot


def target_budget(available_bytes: int, target_tokens: Callable[[int], int], bytes_per_slot: int,
                  extra_slots: int) -> int:
    """The largest budget b <= available_bytes for the target's pool such that the pool it buys, target_tokens(b)
    tokens, and a draft cache of target_tokens(b) + extra_slots slots of bytes_per_slot fit together:
    b + (target_tokens(b) + extra_slots) * bytes_per_slot <= available_bytes. 0 if even an empty pool does not fit.

    target_tokens must be non-decreasing (SGLang's configurators are: tokens = budget // bytes per token, page
    aligned); a bisection over b, about 40 calls of it."""
    def total(b: int) -> int:
        return b + (target_tokens(b) + extra_slots) * bytes_per_slot

    return max(bisect_right(range(max(available_bytes, 0) + 1), available_bytes, key=total) - 1, 0)


class DraftCacheBudget:
    """SGLang's pool configurator for a DDTREE target, with the draft cache beside the pool in the same budget.

    The profiled path (`calculate_pool_sizes`) is the one a byte budget reaches; the others take a token count
    (a user's cap) or a finished config, and are SGLang's own."""

    def __init__(self, inner, bytes_per_slot: int, extra_slots: int):
        self.inner, self.bytes_per_slot, self.extra_slots = inner, int(bytes_per_slot), int(extra_slots)

    def _tokens(self, budget: int, page_size: int) -> int:
        try:
            return int(self.inner.calculate_pool_sizes(budget, page_size).max_total_num_tokens)
        except (RuntimeError, ValueError):  # SGLang refuses a budget too small for any pool: zero tokens
            return 0

    def calculate_pool_sizes(self, available_bytes: int, page_size: int):
        budget = target_budget(int(available_bytes), lambda b: self._tokens(b, page_size), self.bytes_per_slot,
                               self.extra_slots)
        config = self.inner.calculate_pool_sizes(budget, page_size)  # SGLang's error if no pool fits
        tokens = int(config.max_total_num_tokens)
        draft = (tokens + self.extra_slots) * self.bytes_per_slot
        logger.info("DDTREE KV budget: %d bytes = target pool of %d tokens within %d bytes + draft cache of %d slots "
                    "x %d bytes = %d bytes (%d bytes left over)", available_bytes, tokens, budget,
                    tokens + self.extra_slots, self.bytes_per_slot, draft, available_bytes - budget - draft)
        return config

    def calculate_pool_sizes_from_max_tokens(self, max_total_num_tokens: int, page_size: int):
        return self.inner.calculate_pool_sizes_from_max_tokens(max_total_num_tokens, page_size)

    def finalize_with_max_running_requests(self, config):
        return self.inner.finalize_with_max_running_requests(config)

    def __getattr__(self, name: str):  # anything else SGLang reads is the wrapped configurator's
        return getattr(self.inner, name)


def ddtree_pool_configurator_hook(result, kvc=None, *args, **kwargs):
    """AFTER hook on `create_memory_pool_configurator(kvc)`: a DDTREE target's configurator wrapped in
    DraftCacheBudget; None (SGLang's answer kept) for every other runner (draft workers, other algorithms)."""
    global _budgeted_bytes_per_slot
    kvc = kwargs.get("kvc", kvc)
    from .ddtree_algorithm import is_ddtree

    if kvc is None or getattr(kvc, "is_draft_worker", False) or not is_ddtree(getattr(kvc, "spec_algorithm", None)):
        return None
    if isinstance(result, DraftCacheBudget):
        return None
    from sglang.srt.runtime_context import get_parallel, get_spec

    from .dflash_drafter import draft_cache_bytes_per_slot

    per_slot = draft_cache_bytes_per_slot(get_spec().speculative_draft_model_path, int(get_parallel().tp_size),
                                          kvc.model_dtype)
    _budgeted_bytes_per_slot = per_slot
    return DraftCacheBudget(result, per_slot, extra_slots=int(kvc.page_size) + 1)
