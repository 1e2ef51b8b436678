"""SGLang plugin entry point: registers the `kdtree` attention backend.

SGLang (0.5.23) calls `load_plugins()` in every process that builds a model (engine, schedulers/TP ranks,
DP controller), which runs `register()` below through the `sglang.srt.plugins` entry point declared in
pyproject.toml. `register()`:

- adds `kdtree` to the `--attention-backend` / `--prefill-attention-backend` / `--decode-attention-backend`
  choices (`add_attention_backend_choices`);
- registers a lazy factory under `kdtree` in SGLang's backend registry (`register_attention_backend`): the
  backend module, and with it the kdtree ops library, loads only when a model runner builds the backend;
- adds `kdtree` to SGLang's deterministic-inference backends (`add_deterministic_attention_backend_choices`
  and the radix-cache list beside it): under `--enable-deterministic-inference` every layer, TARGET_VERIFY
  included, runs on kdtree's base backend (name a batch-invariant one: SGLang lists triton, flashinfer, fa3,
  ...). The op itself is not batch-invariant (its key split depends on the whole batch), so it does not run in
  that mode, and the backend says so in one WARNING line;
- registers the speculative algorithm `DDTREE` (`--speculative-algorithm DDTREE`, ddtree_algorithm.py) with
  SGLang's `SpeculativeAlgorithm.register`; its worker (ddtree_worker.py) is imported only when a scheduler
  builds it;
- registers one HookRegistry AFTER hook on `resolve_dflash_verify_mask_policy`: DFLASH chooses whether to build a
  custom verify mask by the backend's *class name*, and a name it does not know (ours) gets the dense custom-mask
  path. kdtree reads a causal block with or without a mask; its base, which runs the layers the op does not,
  needs what SGLang decides for the base's class, so the hook answers the base's policy;
- registers one HookRegistry AFTER hook on `configure_logger`: SGLang loads plugins before it configures
  logging, so an INFO line logged by `register()` itself would be lost; the hook logs the success line once
  per process, as soon as SGLang's logging is set up (at once if logging was configured before);
- registers one HookRegistry AFTER hook on `DecodeCudaGraphRunner.get_spec_info`: it builds the spec info a decode
  graph is captured with for EAGLE, DFLASH and NGRAM only, so a plugin algorithm's graphs were captured with none
  and hidden mode NULL, and every replay of a verify that asks for FULL hidden states failed SGLang's check. For a
  DDTREE target the hook answers DDTREE's capture spec info (ddtree_spec_info.DDTreeVerifyInput.for_capture:
  hidden mode FULL, a packed mask of the capture's shape); other runners keep SGLang's answer;
- registers one HookRegistry AFTER hook on the scheduler's `get_internal_state`: the answer gains `kdtree`, the
  status of each kdtree backend of that scheduler process (base, mode, verify steps, op and base calls per
  layer, fall-backs, validate statistics), `ddtree`, the stats of each DDTREE worker (rounds; with
  KDTREE_DDTREE_PROFILE=1 accepted drafts and seconds per round phase), and `kdtree_ranks`, both for every TP rank
  (`[{"tp_rank": r, "kdtree": [...], "ddtree": [...]}]`, gathered over the TP group's CPU group: only the first
  rank answers SGLang's request), so `Engine.get_server_info()["internal_states"][i]["kdtree"]` (and the HTTP
  server's /get_server_info) show what ran where, across the process boundary.
SGLang applies the hooks itself (`HookRegistry.apply_hooks()` at the end of `load_plugins()`); nothing here
patches anything.

It is idempotent. `load_plugins()` catches and logs a plugin's exception, then goes on without the backend;
so a failure is also logged here, at ERROR, naming the plugin and the cause (ERROR reaches stderr even where
logging is not configured), before it is re-raised to SGLang.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

BACKEND_NAME = "kdtree"
BACKEND_CLASS_NAME = "KDTreeAttnBackend"
DFLASH_POLICY_TARGET = "sglang.srt.speculative.dflash_utils.resolve_dflash_verify_mask_policy"
CONFIGURE_LOGGER_TARGET = "sglang.srt.utils.common.configure_logger"
DECODE_GRAPH_SPEC_INFO_TARGET = ("sglang.srt.model_executor.runner.decode_cuda_graph_runner."
                                 "DecodeCudaGraphRunner.get_spec_info")
INTERNAL_STATE_TARGET = ("sglang.srt.managers.scheduler_components.internal_state."
                         "SchedulerInternalStateController.get_internal_state")
STATE_KEY = "kdtree"
DDTREE_STATE_KEY = "ddtree"
RANKS_STATE_KEY = "kdtree_ranks"
SUCCESS_LINE = f"kdtree_ops: registered SGLang attention backend {BACKEND_NAME!r} (KDTREE_VERIFY modes: off|validate|on)"

_registered = False
_status_logged = False


def create_kdtree_backend(runner):
    """SGLang backend factory (`ATTENTION_BACKENDS["kdtree"]`): imports the backend on first use."""
    from .backend import KDTreeAttnBackend

    return KDTreeAttnBackend(runner)


def _kdtree_backend_in(backend):
    """The KDTreeAttnBackend that runs TARGET_VERIFY under SGLang's wrappers (hybrid, TBO, linear-attention), or
    None. The same walk as resolve_dflash_verify_mask_policy's."""
    for _ in range(4):
        if type(backend).__name__ == BACKEND_CLASS_NAME:
            return backend
        if hasattr(type(backend), "_select_backend") and not hasattr(backend, "base"):
            from sglang.srt.model_executor.forward_batch_info import ForwardMode

            backend = backend._select_backend(ForwardMode.TARGET_VERIFY)
        else:
            backend = getattr(backend, "primary", None) or getattr(backend, "full_attn_backend", None)
        if backend is None:
            return None
    return None


def dflash_verify_mask_policy_hook(result, attn_backend=None, *args, **kwargs):
    """AFTER hook on `resolve_dflash_verify_mask_policy`: a kdtree backend gets its base's policy.

    The original returns `(backend_class_name, build_custom_mask)` by class name. kdtree verifies DFLASH's block
    with or without a mask; the base serves the layers the op does not (and validate mode), so the mask is built
    when the base's class needs one.
    """
    name, _build_custom_mask = result
    if name != BACKEND_CLASS_NAME:
        return None  # unchanged
    kdtree = _kdtree_backend_in(attn_backend)
    if getattr(kdtree, "base", None) is None:
        return None
    from sglang.srt.speculative import dflash_utils

    return name, dflash_utils.resolve_dflash_verify_mask_policy(kdtree.base)[1]


def ddtree_capture_spec_info_hook(result, runner=None, num_tokens=None, *args, **kwargs):
    """AFTER hook on `DecodeCudaGraphRunner.get_spec_info(self, num_tokens)`: DDTREE's capture spec info for a DDTREE
    target's runner (SGLang's answer there is None); None (SGLang's answer kept) for every other runner."""
    num_tokens = kwargs.get("num_tokens", num_tokens)
    model_runner = getattr(runner, "model_runner", None)
    if result is not None or model_runner is None or getattr(model_runner, "is_draft_worker", False):
        return None
    from .ddtree_algorithm import is_ddtree

    if not is_ddtree(getattr(model_runner, "spec_algorithm", None)):
        return None
    from .ddtree_spec_info import DDTreeVerifyInput

    return DDTreeVerifyInput.for_capture(int(num_tokens), int(runner.captured_req_width), model_runner.device)


def _process_state() -> dict:
    """This scheduler process's kdtree backends' status and DDTREE workers' stats (keys present once imported)."""
    import sys

    backend_module = sys.modules.get("kdtree_ops.sglang.backend")  # never imported: no kdtree backend here
    worker_module = sys.modules.get("kdtree_ops.sglang.ddtree_worker")  # imported when DDTREE runs
    state = {}
    if backend_module is not None:
        state[STATE_KEY] = [b.status() for b in backend_module.live_backends()]
    if worker_module is not None:
        state[DDTREE_STATE_KEY] = [w.stats() for w in worker_module.live_workers()]
    return state


def _every_tp_rank(state: dict) -> list:
    """[{"tp_rank": r, **state of rank r}] for every rank of the TP group, in rank order.

    Only the TP group's first rank answers SGLang's internal-state request, but every rank handles it, in the same
    order (the scheduler broadcasts control requests over the TP group's CPU group: request_receiver.py
    _broadcast_reqs_across_ranks), so the ranks can gather there. Under DP attention the control requests may be
    broadcast within attention-TP groups only: then this rank's state alone."""
    try:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        tp_size, tp_rank = int(parallel.tp_size), int(parallel.tp_rank)
        gather = tp_size > 1 and not parallel.attn_dp_enabled
    except Exception:  # no parallel state (a process that is not a scheduler)
        return [{"tp_rank": 0, **state}]
    if not gather:
        return [{"tp_rank": tp_rank, **state}]
    import torch.distributed as dist

    states = [None] * tp_size
    dist.all_gather_object(states, {"tp_rank": tp_rank, **state}, group=parallel.tp_group.cpu_group)
    return states


def internal_state_hook(result, *args, **kwargs):
    """AFTER hook on the scheduler's get_internal_state: adds this process's kdtree backends' status (`kdtree`),
    its DDTREE workers' stats (`ddtree`) and both for every TP rank (`kdtree_ranks`)."""
    state = getattr(result, "internal_state", None)
    if not isinstance(state, dict):
        return None
    local = _process_state()
    if not local:  # no kdtree backend nor DDTREE worker in this process (so in none of its TP group's)
        return None
    state.update(local)
    state[RANKS_STATE_KEY] = _every_tp_rank(local)
    return None  # the (updated) result is kept


def log_status_once(*_args, **_kwargs) -> None:
    """The success line, once per process; also the AFTER hook on SGLang's `configure_logger` (returns None:
    the hooked function's result is kept)."""
    global _status_logged
    if _registered and not _status_logged:
        _status_logged = True
        logger.info(SUCCESS_LINE)


def register() -> None:
    """Entry point `kdtree = "kdtree_ops.sglang.plugin:register"`: cheap, idempotent, loud on failure."""
    global _registered
    if _registered:
        return
    added: list = []  # undo callables of what this call added, run in reverse on failure
    try:
        from sglang.srt.arg_groups import choices
        from sglang.srt.layers.attention.attention_registry import (
            ATTENTION_BACKENDS,
            register_attention_backend,
        )
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        if ATTENTION_BACKENDS.get(BACKEND_NAME) is not create_kdtree_backend:
            register_attention_backend(BACKEND_NAME)(create_kdtree_backend)
            added.append(lambda: ATTENTION_BACKENDS.pop(BACKEND_NAME, None))
        for names, add in (
            (choices.ATTENTION_BACKEND_CHOICES, choices.add_attention_backend_choices),
            (choices.DETERMINISTIC_ATTENTION_BACKEND_CHOICES, choices.add_deterministic_attention_backend_choices),
            (choices.RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND,
             choices.add_radix_supported_deterministic_attention_backend_choices),
        ):
            if BACKEND_NAME not in names:
                add([BACKEND_NAME])
                added.append(lambda names=names: names.remove(BACKEND_NAME))
        from .ddtree_algorithm import register_ddtree_algorithm, unregister_ddtree_algorithm

        if register_ddtree_algorithm():
            added.append(unregister_ddtree_algorithm)
        HookRegistry.register(DFLASH_POLICY_TARGET, dflash_verify_mask_policy_hook, HookType.AFTER)
        HookRegistry.register(CONFIGURE_LOGGER_TARGET, log_status_once, HookType.AFTER)
        HookRegistry.register(INTERNAL_STATE_TARGET, internal_state_hook, HookType.AFTER)
        HookRegistry.register(DECODE_GRAPH_SPEC_INFO_TARGET, ddtree_capture_spec_info_hook, HookType.AFTER)
    except Exception as exc:
        # All or nothing: a CLI choice without its factory would fail later, far from the cause.
        for undo in reversed(added):
            undo()
        logger.error(
            "kdtree_ops: FAILED to register the SGLang attention backend %r (%s: %s); "
            "--attention-backend %s will not be available",
            BACKEND_NAME, type(exc).__name__, exc, BACKEND_NAME,
        )
        raise
    _registered = True
    if logging.getLogger().handlers:  # logging is configured already (an embedding application): say it now
        log_status_once()
