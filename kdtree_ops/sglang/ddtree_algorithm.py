"""`--speculative-algorithm DDTREE`: the algorithm the plugin registers with SGLang (no patch).

SGLang 0.5.23 takes plugin algorithms through `SpeculativeAlgorithm.register(name, spec_class=...)`: a factory
returning the worker class (imported only when a scheduler builds the worker) and a `CustomSpecAlgo` subclass whose
`handle_server_args` resolves the server arguments before anything is allocated. DDTREE's:

- `--speculative-draft-model-path`: a DFlash draft checkpoint (required);
- `--speculative-num-draft-tokens N`: the verify width, the root plus a node budget of N - 1 draft tokens
  (2 <= N <= 1024: the verify op's trees); default 64;
- the top-k per drafted position: `KDTREE_DDTREE_TOPK` (default 8), read by the worker; a budget the drafter cannot
  fill (`check_node_budget`: N - 1 > sum_{d=1..K} k^d, K = the draft config's block_size - 1) is refused here, in
  the launching process before any model loads (a scheduler's failure would take the launcher down with SIGQUIT);
- the tree size per batch size, down to plain decode: `KDTREE_DDTREE_BUDGETS` (ddtree_budgets.py), checked here;
- the draft step's CUDA graphs: `KDTREE_DDTREE_DRAFT_GRAPHS` (draft_graphs.py; 1, the default, or 0), checked here;
- grammar-constrained requests are refused: `--grammar-backend none` (SGLang aborts each such request with
  its own message; the server goes on);
- overlap scheduling (SGLang's spec v2 loop: the host schedules round n+1 while the device runs round n) only with
  `KDTREE_DDTREE_OVERLAP=1`; by default it is turned off and each round runs synchronously. The algorithm is
  registered with `supports_overlap=True` either way (SGLang refuses an overlapped launch of an algorithm registered
  without it, spec_registry.py `create_worker`); ddtree_spec_info.DDTreeCarry relays through SGLang's FutureMap.
  Mixed chunked prefill is turned off (the round must see decode batches alone); EAGLE's step and top-k fields are
  set to 1 so SGLang's per-decode KV reservation is 2 N slots per request (N a round, doubled for the overlap lag);
- every TARGET_VERIFY layer must run the kdtree op (`check_ddtree_verify_route`): DDTREE's verify input carries
  each tree only as the op's packed mask (a dense mask is not built: budgets reach 1023 tokens over long contexts),
  so any other kernel would attend causally over the flattened tree and return wrong tokens. Refused at launch:
  a verify backend other than kdtree, `KDTREE_VERIFY=off|validate` (the base's output), and
  `--enable-deterministic-inference` (the base's kernels); what only the loaded model shows (a layer the op cannot
  serve) is refused when the kdtree backend is built (backend.py).
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

ALGORITHM_NAME = "DDTREE"
DEFAULT_NUM_DRAFT_TOKENS = 64
MAX_VERIFY_TOKENS = 1024  # the verify op's masks are at most 32 words wide
TOPK_ENV = "KDTREE_DDTREE_TOPK"
DEFAULT_TOPK = 8
OVERLAP_ENV = "KDTREE_DDTREE_OVERLAP"


def ddtree_topk() -> int:
    """The drafter's candidates per position (KDTREE_DDTREE_TOPK, default 8)."""
    raw = os.environ.get(TOPK_ENV, str(DEFAULT_TOPK))
    try:
        topk = int(raw)
    except ValueError:
        topk = 0
    if topk < 1:
        raise ValueError(f"{TOPK_ENV} must be a positive integer (candidates per drafted position), got {raw!r}")
    return topk


def check_node_budget(num_draft_tokens: int, topk: int, block_size: int) -> None:
    """Raises, naming both settings and the fix, when the drafter cannot fill the node budget.

    A tree holds the root and N - 1 draft nodes (N = --speculative-num-draft-tokens); its draft nodes are distinct
    paths over the K = block_size - 1 drafted positions with `topk` candidates each, so at most sum_{d=1..K} k^d of
    them exist (ddtree_build_tree refuses a larger budget: in the first round, killing the engine). Pure: called by
    resolve_ddtree_server_args with the draft config's block_size."""
    from ..shapes import build_tree_path_count

    drafted, budget = block_size - 1, num_draft_tokens - 1
    paths = build_tree_path_count(drafted, topk)
    if budget <= paths:
        return
    smallest_topk = next(k for k in range(topk + 1, budget + 1) if build_tree_path_count(drafted, k) >= budget)
    raise ValueError(
        f"DDTREE cannot fill its trees: --speculative-num-draft-tokens {num_draft_tokens} asks for {budget} draft "
        f"nodes per tree, but with {TOPK_ENV}={topk} candidates at each of the drafter's {drafted} drafted positions "
        f"(block_size {block_size}) there are only {paths} paths (sum over d = 1..{drafted} of {topk}^d); fix: "
        f"--speculative-num-draft-tokens <= {paths + 1}, or {TOPK_ENV} >= {smallest_topk}")


def env_switch(name: str, default: str, on: str, off: str) -> bool:
    """A 0/1 environment switch (unset: `default`); any other value raises naming the variable and both meanings."""
    raw = os.environ.get(name, default)
    if raw not in ("0", "1"):
        raise ValueError(f"{name} must be 1 ({on}) or 0 ({off}), got {raw!r}")
    return raw == "1"


def ddtree_overlap() -> bool:
    """Whether DDTREE runs on SGLang's overlap scheduler (KDTREE_DDTREE_OVERLAP=1; unset or 0: synchronous)."""
    return env_switch(OVERLAP_ENV, "0", "DDTREE on SGLang's overlap scheduler", "synchronous rounds")


def resolve_ddtree_server_args(server_args) -> None:
    """Validates and completes DDTREE's server arguments in place (SGLang hands a recording stand-in)."""
    if not getattr(server_args, "speculative_draft_model_path", None):
        raise ValueError("--speculative-algorithm DDTREE needs --speculative-draft-model-path: a DFlash draft "
                         "checkpoint (architectures DFlashDraftModel, dflash_config.mask_token_id)")
    tokens = getattr(server_args, "speculative_num_draft_tokens", None)
    if tokens is None:
        tokens = DEFAULT_NUM_DRAFT_TOKENS
        logger.info("DDTREE: --speculative-num-draft-tokens not given; verifying trees of %d tokens "
                    "(the root and %d draft nodes)", tokens, tokens - 1)
    if not 2 <= int(tokens) <= MAX_VERIFY_TOKENS:
        raise ValueError(f"--speculative-num-draft-tokens for DDTREE is the verify width (the root plus the node "
                         f"budget) and must be in [2, {MAX_VERIFY_TOKENS}], got {tokens}")
    from .ddtree_budgets import BUDGETS_ENV, budget_policy
    from .dflash_drafter import draft_block_size
    from .draft_graphs import draft_graphs_requested

    # a bad KDTREE_DDTREE_TOPK, KDTREE_DDTREE_BUDGETS or KDTREE_DDTREE_DRAFT_GRAPHS, or a budget the drafter cannot
    # fill, fails here, not in the first round
    draft_graphs_requested()
    topk, block_size = ddtree_topk(), draft_block_size(server_args.speculative_draft_model_path)
    check_node_budget(int(tokens), topk, block_size)
    policy = budget_policy(int(tokens), topk, block_size)
    if policy is not None:
        logger.info("DDTREE: tree tokens per batch size (%s): %s", BUDGETS_ENV, policy.describe())
    server_args.speculative_num_draft_tokens = int(tokens)
    server_args.speculative_num_steps = 1
    server_args.speculative_eagle_topk = 1
    if ddtree_overlap():
        logger.info("DDTREE: %s=1, overlap scheduling %s", OVERLAP_ENV,
                    "off (--disable-overlap-schedule)" if getattr(server_args, "disable_overlap_schedule", False)
                    else "on (the host schedules round n+1 while the device runs round n)")
    else:
        if not getattr(server_args, "disable_overlap_schedule", False):
            logger.info("DDTREE: overlap scheduling turned off (each round runs synchronously; %s=1 turns it on)",
                        OVERLAP_ENV)
        server_args.disable_overlap_schedule = True
    server_args.enable_mixed_chunk = False
    if getattr(server_args, "grammar_backend", None) not in (None, "none"):
        logger.info("DDTREE: grammar-constrained requests are not verified by DDTREE; --grammar-backend %s "
                    "replaced by none (SGLang aborts such requests with its message)", server_args.grammar_backend)
    server_args.grammar_backend = "none"


DDTREE_VERIFY_NEEDS_OP = (
    "DDTREE verifies its trees only through the kdtree op: its verify input carries each tree as the op's packed mask "
    "and no dense mask, so any other attention kernel would attend causally over the flattened tree and return "
    "wrong tokens")


def is_ddtree(spec_algorithm) -> bool:
    """Whether a runner's speculative algorithm (SGLang's enum member or a plugin's CustomSpecAlgo) is DDTREE."""
    return getattr(spec_algorithm, "name", None) == ALGORITHM_NAME


def ddtree_verify_refusals(server_args) -> list[str]:
    """Why a TARGET_VERIFY layer of this launch would not run the kdtree op, each with its fix (empty: it would)."""
    from sglang.srt.arg_groups.model_override_base import attention_backends_of

    from .plugin import BACKEND_NAME
    from .verify_mode import verify_mode_from_env

    reasons = []
    prefill, decode = attention_backends_of(server_args)
    on_decode = getattr(server_args, "speculative_attention_mode", None) == "decode"
    verify_backend = decode if on_decode and prefill != decode else prefill
    if verify_backend != BACKEND_NAME:
        reasons.append(f"TARGET_VERIFY runs on the attention backend {verify_backend or 'SGLang picks'!r} "
                       f"(--attention-backend {getattr(server_args, 'attention_backend', None)}, prefill "
                       f"{prefill}, decode {decode}, --speculative-attention-mode "
                       f"{getattr(server_args, 'speculative_attention_mode', None)}); fix: launch with "
                       f"--attention-backend {BACKEND_NAME} (KDTREE_BASE_BACKEND names the backend of everything else)")
    mode = verify_mode_from_env()
    if mode != "on":
        reasons.append(f"KDTREE_VERIFY={mode} runs TARGET_VERIFY on the base backend (and returns its output); fix: "
                       f"unset KDTREE_VERIFY or set it to on")
    if getattr(server_args, "enable_deterministic_inference", False):
        reasons.append("--enable-deterministic-inference runs every verify layer on the base backend (the op is not "
                       "batch-invariant); fix: launch without it")
    return reasons


def check_ddtree_verify_route(server_args) -> None:
    """Raises, naming each cause and its fix, when a TARGET_VERIFY layer of a DDTREE launch would not run the op.

    Not on kdtree's scratch resolution of SGLang's default base (base.sglang_default_backend): its backend fields are
    unset on purpose, and the launch it serves was checked already."""
    from .base import in_scratch_resolution

    if in_scratch_resolution():
        return
    reasons = ddtree_verify_refusals(server_args)
    if reasons:
        raise ValueError(f"{DDTREE_VERIFY_NEEDS_OP}; here " + "; ".join(reasons))


def _ddtree_worker_class(server_args):
    from .ddtree_worker import DDTreeWorker

    return DDTreeWorker


def register_ddtree_algorithm() -> bool:
    """Registers DDTREE with SGLang's speculative registry; False if it was registered before (idempotent)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo, get_spec

    if get_spec(ALGORITHM_NAME) is not None:
        return False

    class DDTreeAlgorithm(CustomSpecAlgo):
        """DDTREE's answers to SGLang's algorithm predicates (all False but these), and the methods of
        SpeculativeAlgorithm that 0.5.23's scheduler calls but CustomSpecAlgo lacks."""

        def handle_server_args(self, server_args) -> None:
            resolve_ddtree_server_args(server_args)
            check_ddtree_verify_route(server_args)

        def carries_draft_hidden_states(self) -> bool:
            return False  # no EAGLE hidden states cross a disaggregation boundary

        def need_topk(self) -> bool:
            return False

        def get_platform_worker_cls(self):
            return None

        def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True,
                              needs_confidence_relay=False):
            from sglang.srt.managers.overlap_utils import FutureMap

            return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    # supports_overlap=True: SGLang's only use of the flag is create_worker's refusal of an overlapped launch;
    # whether this launch overlaps is resolve_ddtree_server_args's (KDTREE_DDTREE_OVERLAP)
    SpeculativeAlgorithm.register(ALGORITHM_NAME, supports_overlap=True,
                                  spec_class=DDTreeAlgorithm)(_ddtree_worker_class)
    return True


def unregister_ddtree_algorithm() -> None:
    """Removes DDTREE from the registry (the plugin's undo path when a later registration step fails)."""
    from sglang.srt.speculative import spec_registry

    spec_registry._REGISTRY.pop(ALGORITHM_NAME, None)
