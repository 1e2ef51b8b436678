"""The DDTree round end to end on the device — draft, build tree, verify, accept, commit — with no host sync.

One round serves B requests, each at its own committed length (read on the device):
  1. the block drafter reads each request's last hidden state and proposes K positions, top-k each;
  2. `ddtree.build_tree`: the root (the last bonus token) and the `budget` best paths, with the ancestor mask;
  3. the target's verify forward over the trees: positions are committed length + depth, the tree's K/V go
     into its own slots, tree_verify_attention reads prefix + tree (kv_indices gathered on the device);
  4. the target's token after every node — its argmax, or with per-request sampling parameters (a `SamplingParams`
     in the state; greedy and sampled requests mixed) `ddtree.sample_targets`' draw keyed by (seed, position) — and
     `ddtree.accept_greedy` against those tokens: the accepted path, the bonus token;
  5. commit — the accepted nodes become the request's next positions:
       layout "paged" (page size 1): bookkeeping only — `ddtree.accepted_slots` go into req_to_token, and the
         tree slots they leave are replaced by fresh ones from the request's own (shuffled) slot region;
       layout "contiguous": `ddtree.commit_kv_layers` copies the accepted rows into the request's next contiguous
         slots; the tree always writes into the same scratch slots;
  6. the accepted drafts and the bonus token (`ddtree.emitted_tokens`) are appended to each request's output.
Every tensor's shape is fixed by (B, budget, K, capacities): no .item(), no shape from values, constants made
by kernels on the device, so on CUDA the whole round is captured into one torch.cuda.CUDAGraph
(DDTreeGraphRunner) and replayed every step. `greedy_decode` (and `sample_decode` with sampling parameters) is the plain
one-token-per-step decoding the loop must reproduce token for token.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from . import ops as ddtree
from .sampling import SamplingParams, target_tokens
from ..testing.toy_model import PagedKVCache, ToyDecoder, VerifyBatch, build_verify_batch

LAYOUTS = ("paged", "contiguous")
# The verify op takes trees of up to 1024 tokens: the root and at most 1023 draft nodes.
MAX_VERIFY_BUDGET = 1023


@dataclass
class DDTreeState:
    """What a round reads and updates in place, B requests (a CUDA graph's static buffers).

    seq_lens [B] int64: committed tokens (their K/V are in the cache); root_tokens [B] int64: the last bonus
    token, the next tree's root (not yet in the cache); last_hidden [B, hidden]: the target's hidden state at the
    last committed token (the drafter's input); req_to_token [B, max_len + 1] int64: slot of each committed
    position, the last column a sink for masked writes; tree_slots [B, budget + 1] int64: where the next tree's
    nodes write their K/V; slot_pool [B, R] int64 and next_fresh [B] int64 (paged only): request b's slots and
    the first not yet handed out; generated [B, G + 1] int64 and num_generated [B] int64: the output so far (last
    column a sink); accept_len [B] int32: the last round's accepted drafts; sampling: each request's sampling
    parameters ([B] tensors), or None for greedy decoding of every request.
    """

    seq_lens: torch.Tensor
    root_tokens: torch.Tensor
    last_hidden: torch.Tensor
    req_to_token: torch.Tensor
    tree_slots: torch.Tensor
    slot_pool: torch.Tensor | None
    next_fresh: torch.Tensor | None
    generated: torch.Tensor
    num_generated: torch.Tensor
    accept_len: torch.Tensor
    sampling: SamplingParams | None = None

    def clone(self) -> "DDTreeState":
        return DDTreeState(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name).clone()
                              for f in dataclasses.fields(self)})

    def outputs(self) -> list[list[int]]:
        """Each request's generated tokens (reads the device: outside a graph)."""
        counts = self.num_generated.tolist()
        assert max(counts) < self.generated.shape[1], "output capacity exceeded"
        return [row[:n] for row, n in zip(self.generated.tolist(), counts)]


def append_tokens(generated: torch.Tensor, num_generated: torch.Tensor, tokens: torch.Tensor,
                  counts: torch.Tensor) -> None:
    """Appends tokens[b, :counts[b]] to row b of `generated` [B, G + 1] after its num_generated[b] [B] tokens and
    advances num_generated, in place with no host sync; the other columns of `tokens` [B, C] land in generated's
    last column, a sink."""
    j = torch.arange(tokens.shape[1], device=tokens.device)
    sink = generated.shape[1] - 1
    columns = torch.where(j < counts[:, None], num_generated[:, None] + j, sink).clamp_max(sink)
    generated.scatter_(1, columns, tokens)
    num_generated.add_(counts)


def prefill(model: ToyDecoder, prompts: list[list[int]], prompt_slots: list[list[int]], cache: PagedKVCache,
            device) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs each prompt as a chain tree (causal attention) over an empty prefix, writing its K/V to
    `prompt_slots`; returns the hidden state [B, hidden] and logits [B, vocab] at each prompt's last token."""
    chains = [list(range(-1, len(p) - 1)) for p in prompts]
    batch = build_verify_batch(prompts, chains, [[] for _ in prompts], prompt_slots, device=device)
    hidden = model.hidden_states(batch, cache)
    last = hidden[batch.qo_indptr[1:].long() - 1]
    return last, model.lm_head(last)


class DDTreeRound:
    """One DDTree round (call it on a state and cache; it updates both in place). Host work only in `start`."""

    def __init__(self, model: ToyDecoder, drafter, budget: int, layout: str = "paged"):
        """model: the target; drafter: drafter(hidden [B, H], seq_lens [B], root_tokens [B]) -> (logprobs,
        tokens) [B, K, k] with a `block_size` K (toy_drafter.BlockDrafter); budget: draft nodes per tree;
        layout: LAYOUTS."""
        if layout not in LAYOUTS:
            raise ValueError(f"DDTreeRound: layout must be one of {LAYOUTS}, got {layout!r}")
        if not 0 <= budget <= MAX_VERIFY_BUDGET:
            raise ValueError(f"DDTreeRound: budget must be in [0, {MAX_VERIFY_BUDGET}] (the root and budget nodes "
                             f"verify as one tree of at most 1024 tokens), got {budget}")
        self.model, self.drafter, self.budget, self.layout = model, drafter, budget, layout
        self.nodes = budget + 1
        self.block_size = drafter.block_size

    def start(self, prompts: list[list[int]], rounds: int, dtype, device, seed: int = 0,
              sampling: SamplingParams | None = None) -> tuple[DDTreeState, PagedKVCache]:
        """Prefills the prompts and returns a state and cache sized for `rounds` rounds (host work, once).
        sampling: per-request parameters (on `device`), None for greedy; the first token is drawn by them too."""
        b, t, per_round = len(prompts), self.nodes, self.block_size + 1
        max_len = max(map(len, prompts)) + rounds * per_round   # positions a round may write stay below this
        out_len = 1 + rounds * per_round
        if self.layout == "paged":  # request b owns a shuffled region of R slots: page size 1, fragmented
            region = t + max_len
            pool = torch.randperm(b * region, generator=torch.Generator().manual_seed(seed)).view(b, region)
            prompt_slots = [pool[i, t:t + len(p)].tolist() for i, p in enumerate(prompts)]
            tree_slots = pool[:, :t].clone()
            num_slots = b * region
        else:  # request b's position p lives at slot b * max_len + p; trees write into a scratch region after
            prompt_slots = [list(range(i * max_len, i * max_len + len(p))) for i, p in enumerate(prompts)]
            tree_slots = b * max_len + torch.arange(b * t).view(b, t)
            num_slots = b * (max_len + t)
        req_to_token = torch.zeros(b, max_len + 1, dtype=torch.int64)
        if self.layout == "contiguous":
            req_to_token[:, :max_len] = torch.arange(b * max_len).view(b, max_len)
        for i, slots in enumerate(prompt_slots):
            req_to_token[i, :len(slots)] = torch.tensor(slots)
        cache = PagedKVCache.empty(self.model.config, num_slots, dtype=dtype, device=device)
        last_hidden, logits = prefill(self.model, prompts, prompt_slots, cache, device)
        lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=device)
        first = target_tokens(logits, (lens - 1)[:, None], sampling)[:, 0]  # keyed by the last prompt position
        generated = torch.zeros(b, out_len + 1, dtype=torch.int64, device=device)
        generated[:, 0] = first
        paged = self.layout == "paged"
        state = DDTreeState(
            seq_lens=lens, root_tokens=first, last_hidden=last_hidden, req_to_token=req_to_token.to(device),
            tree_slots=tree_slots.to(device), slot_pool=pool.to(device) if paged else None,
            next_fresh=(lens + t) if paged else None, generated=generated,
            num_generated=torch.ones(b, dtype=torch.int64, device=device),
            accept_len=torch.zeros(b, dtype=torch.int32, device=device), sampling=sampling)
        return state, cache

    def __call__(self, state: DDTreeState, cache: PagedKVCache) -> None:
        b, t, k = state.seq_lens.shape[0], self.nodes, self.block_size
        logprobs, candidates = self.drafter(state.last_hidden, state.seq_lens, state.root_tokens)
        tree_tokens, parents, depths, tree_mask = ddtree.build_tree(logprobs, candidates, state.root_tokens,
                                                                    self.budget)
        batch = self.verify_batch(state, tree_tokens, parents, depths, tree_mask.shape[1])
        hidden = self.model.hidden_states(batch, cache, tree_mask=tree_mask)          # [B*T, H]
        targets = target_tokens(self.model.lm_head(hidden), batch.positions.view(b, t), state.sampling)
        accepted, accept_len, next_tokens = ddtree.accept_greedy(tree_tokens, parents, targets, k)
        if self.layout == "paged":
            self.commit_paged(state, accepted, accept_len)
        else:
            self.commit_contiguous(state, cache, accepted)
        self.emit(state, tree_tokens, accepted, accept_len, next_tokens)
        last_node = accepted.gather(1, accept_len[:, None].long()).long()               # [B, 1]
        hidden = hidden.view(b, t, -1)
        state.last_hidden.copy_(hidden.gather(1, last_node[:, :, None].expand(-1, -1, hidden.shape[2]))[:, 0])
        state.root_tokens.copy_(next_tokens)
        state.seq_lens.add_(accept_len + 1)   # the root and the accepted drafts are now committed
        state.accept_len.copy_(accept_len)

    def verify_batch(self, state: DDTreeState, tree_tokens: torch.Tensor, parents: torch.Tensor,
                     depths: torch.Tensor, mask_words: int) -> VerifyBatch:
        """The verify step's inputs for trees tree_tokens/parents/depths [B, T] over the committed prefixes.

        kv_indices (capacity B * (max_len + T), fixed) lists request b's prefix slots then its tree slots; it
        is gathered element-wise: entry i belongs to the request whose kv_indptr range holds i."""
        b, t = tree_tokens.shape
        dev = tree_tokens.device
        max_len = state.req_to_token.shape[1] - 1
        kv_lens = state.seq_lens + t
        kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), kv_lens.cumsum(0)])
        entry = torch.arange(b * (max_len + t), device=dev)
        owner = torch.searchsorted(kv_indptr[1:], entry, right=True).clamp_max(b - 1)
        offset = entry - kv_indptr[owner]                        # past kv_indptr[B]: any slot, ignored
        prefix_len = state.seq_lens[owner]
        prefix_slot = state.req_to_token[owner, offset.clamp(0, max_len - 1)]
        tree_slot = state.tree_slots[owner, (offset - prefix_len).clamp(0, t - 1)]
        return VerifyBatch(
            input_ids=tree_tokens.reshape(-1),
            positions=(state.seq_lens[:, None] + depths).reshape(-1),
            parents=parents.reshape(-1),
            qo_indptr=torch.arange(b + 1, dtype=torch.int32, device=dev) * t,
            kv_indptr=kv_indptr.to(torch.int32),
            kv_indices=torch.where(offset < prefix_len, prefix_slot, tree_slot),
            out_cache_loc=state.tree_slots.reshape(-1),
            mask_words=mask_words,
        )

    def commit_paged(self, state: DDTreeState, accepted: torch.Tensor, accept_len: torch.Tensor) -> None:
        """Page size 1: the accepted nodes' slots become positions seq_len.. of the request; the tree slots
        they leave are refilled from the request's region, in node order."""
        slots = ddtree.accepted_slots(accepted, state.tree_slots)                         # [B, D+1], -1 pad
        sink = state.req_to_token.shape[1] - 1
        columns = state.seq_lens[:, None] + torch.arange(slots.shape[1], device=slots.device)
        state.req_to_token.scatter_(1, torch.where(slots >= 0, columns, sink), slots)
        used = torch.zeros_like(state.tree_slots, dtype=torch.bool)
        used.scatter_(1, accepted.clamp_min(0).long(), True)     # -1 pads land on node 0, the root: used anyway
        rank = used.long().cumsum(1) - 1
        fresh = state.slot_pool.gather(1, (state.next_fresh[:, None] + rank).clamp_max(state.slot_pool.shape[1] - 1))
        state.tree_slots.copy_(torch.where(used, fresh, state.tree_slots))
        state.next_fresh.add_(accept_len + 1)

    def commit_contiguous(self, state: DDTreeState, cache: PagedKVCache, accepted: torch.Tensor) -> None:
        """Contiguous layout: the accepted rows are copied into slots seq_len.. of the request, every layer."""
        max_len = state.req_to_token.shape[1] - 1
        depth = torch.arange(accepted.shape[1], device=accepted.device)
        dest = state.req_to_token.gather(1, (state.seq_lens[:, None] + depth).clamp_max(max_len - 1))
        ddtree.commit_kv_layers(zip(cache.k, cache.v), accepted, state.tree_slots, dest)

    @staticmethod
    def emit(state: DDTreeState, tree_tokens: torch.Tensor, accepted: torch.Tensor, accept_len: torch.Tensor,
             next_tokens: torch.Tensor) -> None:
        """Appends each request's accepted draft tokens and its bonus token to `generated`."""
        append_tokens(state.generated, state.num_generated,
                      ddtree.emitted_tokens(tree_tokens, accepted, accept_len, next_tokens), accept_len + 1)


class DDTreeGraphRunner:
    """The whole round (draft, build, verify forward, accept, commit) captured once into one CUDA graph over a
    state and cache, replayed every step; the state's tensors are the graph's static buffers."""

    def __init__(self, ddtree_round: DDTreeRound, state: DDTreeState, cache: PagedKVCache):
        # Warm-up outside the graph (lazy initialisation, allocator) on copies: the round mutates what it gets,
        # and the real state must enter the first replay as it is. Capture itself runs no kernel.
        warm_state, warm_cache = state.clone(), cache.to()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ddtree_round(warm_state, warm_cache)
        torch.cuda.current_stream().wait_stream(stream)
        del warm_state, warm_cache
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            ddtree_round(state, cache)

    def __call__(self) -> None:
        self.graph.replay()


@dataclass
class DDTreeRun:
    tokens: list[list[int]]          # per request: the generated tokens (the first one from the prefill)
    accepted: list[list[int]]        # per round: accepted draft tokens of each request
    step_seconds: list[float]        # per round: wall time of the round (synchronised)


def ddtree_generate(ddtree_round: DDTreeRound, prompts: list[list[int]], rounds: int, dtype, device,
                    cuda_graph: bool = False, sampling: SamplingParams | None = None) -> DDTreeRun:
    """Prefill, then `rounds` DDTree rounds: eagerly, or (cuda_graph) as replays of one captured graph.
    sampling: per-request parameters (greedy when None)."""
    state, cache = ddtree_round.start(prompts, rounds, dtype, device, sampling=sampling)
    step = DDTreeGraphRunner(ddtree_round, state, cache) if cuda_graph else (lambda: ddtree_round(state, cache))
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    accepted, seconds = [], []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        step()
        sync()
        seconds.append(time.perf_counter() - start)
        accepted.append(state.accept_len.tolist())   # outside the round: the step is over
    return DDTreeRun(state.outputs(), accepted, seconds)


def greedy_decode(model: ToyDecoder, prompts: list[list[int]], num_tokens: int, dtype,
                  device) -> tuple[list[list[int]], torch.Tensor]:
    """Plain greedy decoding: the prefill, then one token per request per step through a one-node tree
    (causal decode). Returns num_tokens tokens per request and every decision's logits [steps, B, vocab]."""
    return sample_decode(model, prompts, num_tokens, dtype, device, None)


def sample_decode(model: ToyDecoder, prompts: list[list[int]], num_tokens: int, dtype, device,
                  sampling: SamplingParams | None) -> tuple[list[list[int]], torch.Tensor]:
    """The target's own decoding, one token per request per step: greedy (sampling None) or each request's
    seeded sampling, the draw at step j keyed by the position of its input token (prompt length - 1 + j), as
    SGLang keys it. Returns num_tokens tokens per request and every decision's logits [steps, B, vocab]."""
    b = len(prompts)
    lens = [len(p) for p in prompts]
    capacity = max(lens) + num_tokens
    slots = [list(range(i * capacity, i * capacity + n)) for i, n in enumerate(lens)]
    cache = PagedKVCache.empty(model.config, b * capacity, dtype=dtype, device=device)
    _, logits = prefill(model, prompts, slots, cache, device)
    position = torch.tensor(lens, dtype=torch.int64, device=device)[:, None] - 1      # [B, 1]
    tokens = [[t] for t in target_tokens(logits, position, sampling)[:, 0].tolist()]
    all_logits = [logits.float().cpu()]
    for _ in range(num_tokens - 1):
        new = [[i * capacity + len(s)] for i, s in enumerate(slots)]
        batch = build_verify_batch([[t[-1]] for t in tokens], [[-1]] * b, slots, new, device=device)
        logits = model.verify_step(batch, cache)
        all_logits.append(logits.float().cpu())
        position = position + 1
        for t, s, n, nxt in zip(tokens, slots, new, target_tokens(logits, position, sampling)[:, 0].tolist()):
            t.append(nxt)
            s += n
    return tokens, torch.stack(all_logits)
