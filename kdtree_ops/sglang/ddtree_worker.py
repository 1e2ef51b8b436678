"""The DDTREE speculative worker: a DFlash drafter's block, a best-first tree, one verify forward, on the device.

A round (a decode batch of B requests, each at its own committed length L_b, its last token `bonus_b` not yet in
the caches):
  1. draft: the DFlash block `[bonus, mask, ...]` over the request's draft cache gives the top-k log-probs of the
     K = block_size - 1 next positions (dflash_drafter.py);
  2. `ddtree.build_tree`: the root (bonus) and the budget = N - 1 best paths (N = --speculative-num-draft-tokens),
     their depths and the packed ancestor mask, [B, N] (never a dense mask);
  3. verify: one TARGET_VERIFY forward of the B N tree tokens at positions L_b + depth, their K/V into the N slots
     SGLang reserved after L_b; the kdtree backend takes the packed mask from the verify input;
  4. the target's token after every node — argmax, or (sampling requests) `ddtree.sample_targets` with SGLang's
     per-request parameters and noise keyed by (seed, position) — and `ddtree.accept_greedy`: the accepted path
     and the next bonus token;
  5. commit: `ddtree.commit_kv_layers` moves the accepted nodes' target K/V to positions L_b .. L_b + accepted (every
     layer), and the drafter writes the same positions' draft K/V from the target's hidden states there;
  6. SGLang gets the accepted drafts and the bonus token per request (`ddtree.emitted_tokens`: rows of D + 1,
     D = min(K, budget)).
No step reads the device from the host; shapes come from (B, N, K, top-k) and a host bound on the lengths; the host
values the device needs (seeds SGLang does not keep, a prefill's extend lengths) go by SGLang's `async_h2d` (pinned
staging, an asynchronous copy: a pageable `non_blocking` copy would synchronize the stream). Prefill (extend) batches run the
target with its DFlash layers captured and fill the draft cache for the prompt's tokens (chunk by chunk, and
only the uncached suffix under the radix cache: the draft cache shares the target's slots).

Greedy requests are lossless (the output is the target's greedy decoding); sampled requests follow the target's
own seeded sampling token for token (ddtree/sampling.py), penalties applied as SGLang applies them to verify
logits; log-probs are returned for the accepted tokens (the rows of their nodes), as NGRAM returns them. The round
is SGLang's spec v2 worker step: by default the scheduler runs it synchronously (it copies the new lengths to the
host after each round); with KDTREE_DDTREE_OVERLAP=1 it runs on the overlap scheduler: the round publishes the new
lengths (`on_publish`, after accept and before the commit, as DFLASH does; a plain-decode round, whose lengths grow
by one, before its verify) and returns the carry SGLang relays through its FutureMap. The prefix gathers (the
draft's, kdtree's verify metadata) are sized by a host bound on the lengths that needs no copy of them
(`bound_committed_lengths`: the KV lengths SGLang allocated), so the kdtree backend asks for host lengths only
where its base does, and over triton the scheduler prepares round n+1 without waiting for round n's publish
(examples/sglang/OVERLAP.md). Grammar-constrained requests are refused:
DDTREE launches with `--grammar-backend none`, so SGLang aborts them with its own message and the server goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import weakref
import zlib

import torch

from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.utils.common import async_h2d

from .. import ddtree
from ..ddtree.sampling import SamplingParams
from . import ddtree_memory
from .commit_graphs import CommitGraphs, commit_rows_plan
from .ddtree_algorithm import ddtree_topk
from .ddtree_budgets import budget_policy
from .ddtree_spec_info import DDTreeCarry, DDTreeVerifyInput
from .dflash_drafter import DFlashDrafter
from .draft_graphs import GRAPHS_ENV, DraftGraphs, capture_plan, draft_graphs_off_reason
from .verify_metadata import host_length_bound, prefix_kv
from .verify_widths import VerifyWidthGraphs, narrower_widths

logger = logging.getLogger(__name__)

PROFILE_ENV = "KDTREE_DDTREE_PROFILE"
PHASES = ("draft", "build", "verify", "accept", "commit")
_LIVE: list = []  # weak references to this process's workers (their stats reach get_server_info)


def live_workers() -> list:
    return [w for w in (ref() for ref in _LIVE) if w is not None]


class PhaseClock:
    """Wall time per round phase, only with KDTREE_DDTREE_PROFILE=1: it synchronizes the device at each phase
    boundary (and reads the accepted counts), so it is for measuring, never for serving. `host` is the time from
    one decode round's end to the next one's start when no prefill ran between them: the scheduler's work between
    two rounds (results to the host, output processing, the next batch's preparation), which the synchronous
    scheduler adds to every round and the overlap scheduler runs while the device works; `host_gaps` counts them.
    `published` counts the rounds that published their lengths (`on_publish`: SGLang passes it on the overlap
    scheduler only) and `published_early` those of them that published before their verify (plain decode);
    `without_host_lengths` the rounds SGLang copied no host lengths for (the overlap scheduler when no backend
    `needs_cpu_seq_lens`: it did not wait for the previous round's publish); all counted whether or not profiling
    is on."""

    def __init__(self, device):
        self.enabled = os.environ.get(PROFILE_ENV, "") == "1"
        self.device = torch.device(device)
        self.seconds = dict.fromkeys((*PHASES, "host"), 0.0)
        self.rounds = self.drafts_accepted = self.host_gaps = self.published = self.published_early = 0
        self.without_host_lengths = 0
        self._last = 0.0
        self._round_end: float | None = None  # the last decode round's end, until a prefill runs

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def start(self) -> None:
        if self.enabled:
            self._last = self._now()
            if self._round_end is not None:
                self.seconds["host"] += self._last - self._round_end
                self.host_gaps += 1

    def lap(self, phase: str) -> None:
        if self.enabled:
            now = self._now()
            self.seconds[phase] += now - self._last
            self._last = now

    def end(self, accept_len: torch.Tensor, published: bool, early: bool, host_lengths: bool) -> None:
        self.rounds += 1
        self.published += int(published)
        self.published_early += int(early)
        self.without_host_lengths += int(not host_lengths)
        if self.enabled:
            self.drafts_accepted += int(accept_len.sum())
            self._round_end = self._now()

    def prefill(self) -> None:
        """A prefill ran: the next round's start does not close a gap between two decode rounds."""
        self._round_end = None

    def stats(self) -> dict:
        out = {"rounds": self.rounds, "published": self.published, "published_early": self.published_early,
               "without_host_lengths": self.without_host_lengths, "profiled": self.enabled}
        if self.enabled:
            out.update(drafts_accepted=self.drafts_accepted, host_gaps=self.host_gaps, seconds=dict(self.seconds))
        return out


def extend_positions(seq_lens: torch.Tensor, extend_lens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[num_tokens] int64: the positions of an extend batch's new tokens, request after request (request b's run
    is seq_lens[b] - extend_lens[b] .. seq_lens[b] - 1), on the device; num_tokens = sum(extend_lens), a host int."""
    lens = extend_lens.to(torch.int64)
    request = torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens, output_size=num_tokens)
    run_end = torch.cumsum(lens, 0)[request]  # the batch index one past the token's run
    return seq_lens.to(torch.int64)[request] - (run_end - torch.arange(num_tokens, device=lens.device))


def bound_committed_lengths(batch) -> int:
    """A host upper bound on a decode batch's committed lengths, which sizes its prefix gathers (the draft's and
    kdtree's verify metadata): the max of `seq_lens_cpu` where the scheduler copied the lengths to the host; else
    (the overlap scheduler when no backend `needs_cpu_seq_lens`) the largest KV length SGLang allocated to a request,
    host state its decode preparation keeps (`req.kv.kv_allocated_len`; a slot is allocated before it is written),
    also set as the batch's `max_seq_len_host`, SGLang's field for this bound, so the verify forward carries it.
    SGLang's decode preparation sets that field only when it saw no host lengths itself (eagle_prepare_for_decode),
    not on the first decode round after a prefill, whose gathers would then span the table: the worker sets it fresh
    every round instead."""
    if batch.seq_lens_cpu is None:
        batch.max_seq_len_host = max(int(r.kv.kv_allocated_len) for r in batch.reqs)
    return host_length_bound(batch, len(batch.reqs))


def request_seed(req) -> int:
    """A request's sampling seed: its own (`sampling_seed`), else one fixed by its id (stable across rounds)."""
    seed = getattr(req.sampling_params, "sampling_seed", None)
    return int(seed) if seed is not None else zlib.crc32(str(req.rid).encode())


class DDTreeWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker, **_kwargs):
        super().__init__()
        from sglang.srt.runtime_context import get_device, get_spec

        self.server_args = server_args
        self._target_worker = target_worker
        self._draft_worker = None
        self.model_runner = target_worker.model_runner
        self.device = get_device().device
        self.num_tree_tokens = int(get_spec().speculative_num_draft_tokens)
        self.budget = self.num_tree_tokens - 1
        self.topk = ddtree_topk()
        self.draft_path = get_spec().speculative_draft_model_path
        # The drafter's weights load now, before SGLang measures the memory left for the KV pools (as DFLASH's draft
        # worker's do); its cache is charged by that sizing (ddtree_memory.py) and allocated in alloc_memory_pool.
        runner = self.model_runner
        target = runner.model
        num_layers = int(runner.model_config.num_hidden_layers)
        self.drafter = DFlashDrafter(self.draft_path, target, target_num_layers=num_layers, device=self.device,
                                     dtype=runner.dtype)
        if not hasattr(target, "set_dflash_layers_to_capture"):
            raise ValueError(f"DDTREE: the target model {type(target).__name__} cannot capture the hidden states a "
                             f"DFlash drafter reads (no set_dflash_layers_to_capture)")
        if max(self.drafter.target_layer_ids) + 1 >= num_layers:
            raise ValueError(f"DDTREE: the draft's dflash_config.target_layer_ids {self.drafter.target_layer_ids} "
                             f"must be below the target's last layer ({num_layers - 1}): SGLang captures layer i's "
                             f"output at layer i + 1's input")
        target.set_dflash_layers_to_capture(self.drafter.target_layer_ids)
        self.policy = budget_policy(self.num_tree_tokens, self.topk, self.drafter.block_size)
        self._last_width = self.num_tree_tokens
        self.clock = PhaseClock(self.device)
        self.draft_graphs = self.commit_graphs = self.verify_widths = None  # init_cuda_graphs captures them
        _LIVE.append(weakref.ref(self))
        logger.info("DDTREE worker: trees of %d tokens (budget %d), top-%d of %d drafted positions, paths up to %d "
                    "drafts", self.num_tree_tokens, self.budget, self.topk, self.drafter.block_size - 1,
                    self.max_depth(self.num_tree_tokens))

    def max_depth(self, width: int) -> int:
        """The deepest path a tree of `width` tokens holds: its budget, or the drafter's drafted positions."""
        return min(self.drafter.block_size - 1, width - 1)

    def width_for(self, batch_size: int) -> int:
        """Tree tokens of a round of `batch_size` requests (KDTREE_DDTREE_BUDGETS, else the launch width)."""
        return self.policy.width(batch_size) if self.policy is not None else self.num_tree_tokens

    def round_width(self, batch_size: int) -> int:
        """width_for this round's batch; a change is logged."""
        width = self.width_for(batch_size)
        if width != self._last_width:
            logger.info("DDTREE: batch of %d requests: trees of %d tokens%s", batch_size, width,
                        " (plain decode)" if width == 1 else "")
            self._last_width = width
        return width

    def stats(self) -> dict:
        """Rounds run, and with KDTREE_DDTREE_PROFILE=1 accepted drafts and seconds per phase (get_server_info)."""
        return {"num_tree_tokens": self.num_tree_tokens, "topk": self.topk, **self.clock.stats()}

    @property
    def draft_worker(self):
        return None  # the drafter runs inside this worker, over the target's slots

    def alloc_memory_pool(self, **kwargs):
        self.req_to_token_pool, self.token_to_kv_pool_allocator = self._target_worker.get_memory_pool()
        pool = self.model_runner.token_to_kv_pool
        budgeted = ddtree_memory.budgeted_bytes_per_slot()
        if budgeted is None:
            raise RuntimeError(f"DDTREE: SGLang sized the KV pool without the draft cache (the kdtree plugin's hook "
                               f"on {ddtree_memory.TARGET} did not run in this process; its log says why)")
        self.drafter.allocate_cache(num_slots=int(pool.size) + int(pool.page_size), budgeted_bytes_per_slot=budgeted)

    def init_cuda_graphs(self):
        """After the target's graphs (the scheduler's order): the target's verify graphs of the budget policy's
        narrower widths (verify_widths.py), the draft step's (draft_graphs.py) and the drafter's K/V writes
        (commit_graphs.py), for the batch sizes SGLang captured."""
        self.draft_graphs = self.commit_graphs = self.verify_widths = None
        sizes = list(getattr(getattr(self.model_runner, "decode_cuda_graph_runner", None), "capture_bs", None) or [])
        if not sizes or torch.device(self.device).type != "cuda":
            logger.info("DDTREE rounds run eagerly: SGLang captured no decode CUDA graphs")
            return
        widths = narrower_widths(self.num_tree_tokens, sizes, self.width_for)
        if widths:
            self.verify_widths = VerifyWidthGraphs(self.model_runner, widths)
        why_not = draft_graphs_off_reason(self.device)
        if why_not:
            logger.info("DDTREE draft step and drafter K/V writes run eagerly: %s", why_not)
            return
        plan = capture_plan(sizes, self.width_for)
        try:
            if plan:  # else no round drafts
                self.draft_graphs = DraftGraphs(self.drafter, self.topk, self.req_to_token_pool.req_to_token, plan)
            self.commit_graphs = CommitGraphs(self.drafter, commit_rows_plan(sizes, self.width_for, self.max_depth),
                                              self.drafter.target_hidden_width, self.model_runner.dtype, self.device)
        except RuntimeError as exc:  # lossless either way: the eager steps compute the same tree and K/V
            self.draft_graphs = self.commit_graphs = None
            logger.warning("DDTREE draft step and drafter K/V writes run eagerly: their CUDA graph capture failed "
                           "(%s: %s); %s=0 skips the capture", type(exc).__name__, exc, GRAPHS_ENV)

    # ---- one scheduler step ------------------------------------------------------------------------------

    def forward_batch_generation(self, batch, on_publish=None, pp_proxy_tensors=None, **_kwargs):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self._prefill(batch, on_publish)
        if batch.forward_mode.is_idle():
            raise NotImplementedError("DDTREE does not run idle batches (data-parallel attention)")
        self._refuse_unsupported(batch)
        return self._round(batch, on_publish)

    def _refuse_unsupported(self, batch) -> None:
        if batch.has_grammar:  # DDTREE launches with --grammar-backend none: SGLang aborts such requests first
            raise ValueError("DDTREE does not verify grammar-constrained requests (json_schema, regex, ebnf)")

    def _prefill(self, batch, on_publish):
        self.clock.prefill()
        out = self._target_worker.forward_batch_generation(batch, capture_hidden_mode=CaptureHiddenMode.FULL)
        hidden = out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE: the target returned no captured hidden states for the prefill")
        num_tokens = sum(batch.extend_lens)
        positions = extend_positions(batch.seq_lens, async_h2d(batch.extend_lens, dtype=torch.int64,
                                                               device=self.device), num_tokens)
        self.drafter.materialize(hidden[: positions.shape[0]], positions, batch.out_cache_loc.to(torch.int64))
        out.logits_output.hidden_states = None
        out.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(batch.seq_lens)
        out.next_draft_input = DDTreeCarry(out.next_token_ids.to(torch.int64), batch.seq_lens, self.num_tree_tokens)
        return out

    def _round(self, batch, on_publish):
        from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func

        bs = len(batch.reqs)
        n = self.round_width(bs)
        max_depth = self.max_depth(n)
        bonus = batch.spec_info.bonus_tokens
        prefix = batch.seq_lens
        if prefix.device.type == "cuda":  # overlap: gathered from the FutureMap on the schedule stream
            prefix.record_stream(torch.cuda.current_stream(prefix.device))
        req_to_token = self.req_to_token_pool.req_to_token
        host_lengths = batch.seq_lens_cpu is not None
        host_bound = bound_committed_lengths(batch)
        self.clock.start()
        # Overlap: plain decode accepts no draft, so its next lengths are known before the verify, and published
        # there the scheduler prepares the next round while this one's forward runs, as without speculation (where
        # a backend needs host lengths, the scheduler's host waits for the publish: examples/sglang/OVERLAP.md)
        publish_early = n == 1 and on_publish is not None
        if publish_early:
            new_seq_lens = prefix + 1  # the value the round returns: one tensor, published and returned
            on_publish(new_seq_lens)
        # 1-2. the draft step's graph where one holds this batch (the clock counts draft and build as `draft`) ...
        graphs = self.draft_graphs if n > 1 else None
        tree = graphs.run(bonus, prefix, batch.req_pool_indices, host_bound, n) if graphs else None
        if tree is not None:
            self.clock.lap("draft")
        else:  # ... else eagerly: draft over the committed slots (the host's bound on the lengths sizes the gather)
            if n > 1:
                kv_indptr, kv_indices = prefix_kv(req_to_token, batch.req_pool_indices, prefix, host_bound)
                logprobs, candidates = self.drafter.propose(bonus, prefix, kv_indptr, kv_indices, self.topk)
            else:  # plain decode: the root alone, nothing drafted
                logprobs = torch.zeros((bs, 1, 1), dtype=torch.float32, device=self.device)
                candidates = torch.zeros((bs, 1, 1), dtype=torch.int64, device=self.device)
            self.clock.lap("draft")
            tree = ddtree.build_tree(logprobs, candidates, bonus, n - 1)
            self.clock.lap("build")
        tree_tokens, parents, depths, tree_mask = tree
        # 3. verify
        positions = (prefix[:, None].to(torch.int64) + depths).reshape(-1)
        out_cache_loc = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices, req_to_token=req_to_token, start_offset=prefix,
            end_offset=prefix + n, batch_size=bs, draft_token_num=n, device=self.device)
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.input_ids = tree_tokens.reshape(-1)
        batch.out_cache_loc = out_cache_loc
        batch.spec_info = DDTreeVerifyInput(tree_tokens, positions, tree_mask)
        with self.verify_widths.serving(n) if self.verify_widths is not None else contextlib.nullcontext():
            out = self._target_worker.forward_batch_generation(batch, is_verify=True,
                                                               capture_hidden_mode=CaptureHiddenMode.FULL)
        logits_output = out.logits_output
        self.clock.lap("verify")
        # 4. the target's token after every node, and the accepted path
        targets = self._target_tokens(batch, logits_output.next_token_logits, positions.view(bs, n))
        accepted, accept_len, next_tokens = ddtree.accept_greedy(tree_tokens, parents, targets, max_depth)
        if batch.return_logprob:  # the accepted nodes' rows, as NGRAM hands them (flat row index, -1 padded)
            from sglang.srt.layers.logprob_processor import compute_spec_logprobs

            node_rows = torch.arange(bs, device=self.device)[:, None] * n + accepted
            compute_spec_logprobs(batch, logits_output, targets.reshape(-1),
                                  accept_index=torch.where(accepted >= 0, node_rows, -1))
        accept_lens = (accept_len + 1).to(torch.int32)
        if not publish_early:
            new_seq_lens = prefix + accept_lens.to(prefix.dtype)
            if on_publish is not None:  # overlap: the next round's lengths, published before the commit (as DFLASH)
                on_publish(new_seq_lens)
        self.clock.lap("accept")
        # 5. commit: target K/V of the accepted nodes to L_b + d, then the draft K/V of the same positions
        node_slots = out_cache_loc.view(bs, n).to(torch.int64)
        dest = node_slots[:, : max_depth + 1]
        pool = self.model_runner.token_to_kv_pool
        if max_depth > 0:  # a root-only tree (plain decode) already holds its K/V at L_b: nothing moves
            ddtree.commit_kv_layers(((pool.get_key_buffer(i), pool.get_value_buffer(i))
                                     for i in range(pool.start_layer, pool.start_layer + pool.layer_num)),
                                    accepted, node_slots, dest)
        rows = (torch.arange(bs, device=self.device)[:, None] * n + accepted.clamp_min(0)).reshape(-1)
        depth = torch.arange(max_depth + 1, device=self.device)
        hidden = logits_output.hidden_states
        draft_positions = (prefix[:, None].to(torch.int64) + depth).reshape(-1)
        draft_slots = torch.where(accepted >= 0, dest, self.drafter.scratch_slot).reshape(-1)
        if self.commit_graphs is None or not self.commit_graphs.run(hidden, rows, draft_positions, draft_slots):
            self.drafter.materialize(hidden[rows], draft_positions, draft_slots)
        logits_output.hidden_states = None
        # 6. the accepted drafts then the bonus token, D + 1 per request
        emitted = ddtree.emitted_tokens(tree_tokens, accepted, accept_len, next_tokens)
        batch.forward_mode = ForwardMode.DECODE
        self.clock.lap("commit")
        self.clock.end(accept_len, published=on_publish is not None, early=publish_early, host_lengths=host_lengths)
        return GenerationBatchResult(
            logits_output=logits_output, next_token_ids=emitted.reshape(-1), accept_lens=accept_lens,
            can_run_cuda_graph=out.can_run_cuda_graph, new_seq_lens=new_seq_lens,
            next_draft_input=DDTreeCarry(next_tokens, new_seq_lens, n), speculative_num_draft_tokens=n,
            speculative_output_stride=max_depth + 1)

    def _target_tokens(self, batch, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[B, N] the target's token after every node: greedy, or the requests' seeded sampling."""
        from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments

        info = batch.sampling_info
        if info is not None:
            apply_dflash_verify_logits_adjustments(next_token_logits=logits, sampling_info=info,
                                                   draft_token_num=positions.shape[1])
        if info is None or info.is_all_greedy:
            return ddtree.target_tokens(logits, positions, None)
        seeds = info.sampling_seed
        if seeds is None:  # SGLang keeps per-request seeds only under deterministic inference
            seeds = async_h2d([request_seed(r) for r in batch.reqs], dtype=torch.int64, device=self.device)
        return ddtree.target_tokens(logits, positions, SamplingParams.from_sglang(info, seeds))
