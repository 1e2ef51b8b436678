"""DDTree-style speculative verify steps of a tiny random-weight decoder, through the kdtree ops.

A batch of requests is prefilled (a prompt is a chain tree: causal attention is a special case of the tree
mask), then each step verifies one random best-first draft tree per request: the tree's tokens go through
every layer (tree_verify_attention over the paged KV cache), a greedy walk accepts the drafted tokens the
model agrees with, their slots are committed and the rest are freed. Every step runs in each mode —

  eager       the model in plain PyTorch calling the ops;
  compiled    torch.compile(fullgraph=True), Inductor, dynamic shapes: one compile for every step's N;
  cuda graph  (GPU only) one torch.cuda.CUDAGraph captured on an empty batch, replayed with each step's
              trees, lengths and slots copied into its static buffers —

each with its own KV cache, and each step's logits are checked against the same model in float64 with
attention through the float64 reference. Then the DDTree loop (examples/ddtree_demo.py): drafter, tree build,
verify, greedy acceptance and KV commit on the device, for tree budgets 16 to 1023, checked against plain
greedy decoding. Exit status 1 if any mode is off by more than the tolerance or the loop's output differs.

    python examples/demo.py                    # CPU
    python examples/demo.py --device cuda      # adds the CUDA-graph mode (bf16)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import statistics
import sys
import time

import torch
from ddtree_demo import run as run_ddtree_demo  # examples/, beside this file
from torch.utils._python_dispatch import TorchDispatchMode

from kdtree_ops.testing.toy_model import GQA_CONFIG, MLA_CONFIG, PagedKVCache, ToyDecoder, VerifyBatch, build_verify_batch
from kdtree_ops import shapes
from kdtree_ops.testing.trees import random_tree

# Max |logit - float64 logit| allowed, by model dtype (logits are O(1)-O(10) with these weights).
TOLERANCE = {torch.float32: 2e-3, torch.float16: 5e-2, torch.bfloat16: 2.5e-1}
SCRATCH_SLOT = 0  # padding rows of a CUDA-graph bucket write their K/V here; never given to a request


class OpCounter(TorchDispatchMode):
    """Counts kdtree op calls that reach the dispatcher (eager steps, and what a CUDA graph records)."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "kdtree":
            name = func.overloadpacket.__name__
            self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


class GraphRecorder:
    """torch.compile backend: remembers each Dynamo graph (to count graphs and kdtree calls), then Inductor."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.graphs.append(gm)
        return compile_fx(gm, example_inputs)

    def kdtree_calls(self) -> dict[str, int]:
        calls: dict[str, int] = {}
        for gm in self.graphs:
            for node in gm.graph.nodes:
                if node.op == "call_function" and getattr(node.target, "namespace", None) == "kdtree":
                    name = node.target.overloadpacket.__name__
                    calls[name] = calls.get(name, 0) + 1
        return calls


def describe(calls: dict[str, int]) -> str:
    return f"{sum(calls.values())} (" + ", ".join(f"{n} {op}" for op, n in sorted(calls.items())) + ")"


class Scheduler:
    """Requests, their committed slots and the free-slot list (shuffled: a fragmented pool)."""

    def __init__(self, num_requests: int, num_slots: int, vocab: int, prompt_range: tuple[int, int],
                 gen: torch.Generator):
        self.gen, self.vocab = gen, vocab
        self.free = [s for s in torch.randperm(num_slots, generator=gen).tolist() if s != SCRATCH_SLOT]
        self.committed: list[list[int]] = [[] for _ in range(num_requests)]
        lo, hi = prompt_range
        self.prompts = [torch.randint(vocab, (int(torch.randint(lo, hi + 1, (1,), generator=gen)),),
                                      generator=gen).tolist() for _ in range(num_requests)]
        self.next_token = [0] * num_requests
        self.pending: list[tuple[list[int], list[int], list[int]]] = []  # per request: tokens, parents, slots

    def prefill_trees(self) -> None:
        """Each prompt as a chain tree over an empty prefix (causal attention)."""
        self.pending = [(p, list(range(-1, len(p) - 1)), [self.free.pop() for _ in p]) for p in self.prompts]

    def draft_trees(self, max_tree: int, max_depth: int) -> None:
        """A random best-first tree per request: root = the last accepted token, the rest random drafts."""
        self.pending = []
        for b in range(len(self.committed)):
            size = int(torch.randint(max(2, max_tree // 2), max_tree + 1, (1,), generator=self.gen))
            parents = random_tree(size, max_depth=max_depth, generator=self.gen)
            tokens = [self.next_token[b]] + torch.randint(self.vocab, (size - 1,), generator=self.gen).tolist()
            self.pending.append((tokens, parents, [self.free.pop() for _ in range(size)]))

    def batch(self, mask_words: int, draft_in_cache: bool, **padding) -> VerifyBatch:
        tokens, parents, slots = zip(*self.pending)
        # At least 2 kv_indices entries (the tail is ignored): a prefill with draft K/V passed separately lists
        # no slot at all, and torch.compile specializes a dimension first seen with size 0 or 1.
        padding.setdefault("kv_capacity", max(2, sum(map(len, self.committed)) + draft_in_cache * sum(map(len, slots))))
        return build_verify_batch(list(tokens), list(parents), self.committed, list(slots), mask_words=mask_words,
                                  draft_in_cache=draft_in_cache, pad_slot=SCRATCH_SLOT, **padding)

    def accept(self, logits: torch.Tensor, prefill: bool) -> list[int]:
        """Greedy acceptance from the reference logits [N, vocab]: follow the child whose token is the model's
        argmax at its parent. Commits the accepted nodes' slots, frees the others; returns accepted counts."""
        accepted_counts, row = [], 0
        for b, (tokens, parents, slots) in enumerate(self.pending):
            predicted = logits[row:row + len(tokens)].argmax(-1).tolist()
            path = list(range(len(tokens))) if prefill else [0]
            while not prefill:
                child = next((c for c, p in enumerate(parents) if p == path[-1] and tokens[c] == predicted[path[-1]]),
                             None)
                if child is None:
                    break
                path.append(child)
            kept = set(path)
            self.committed[b] += [slots[i] for i in path]
            self.free += [s for i, s in enumerate(slots) if i not in kept]
            self.next_token[b] = predicted[path[-1]]  # the bonus token: the next tree's root
            accepted_counts.append(len(path) - 1)
            row += len(tokens)
        return accepted_counts


class CudaGraphRunner:
    """verify_step captured once into a CUDA graph over static, padded inputs; replayed with any batch that
    fits the bucket (N <= num_tokens, total slots <= kv_capacity)."""

    def __init__(self, model, cache, num_requests, num_tokens, kv_capacity, mask_words, draft_in_cache, device):
        empty = build_verify_batch([[]] * num_requests, [[]] * num_requests, [[]] * num_requests,
                                   [[]] * num_requests, mask_words=mask_words, draft_in_cache=draft_in_cache,
                                   num_tokens=num_tokens, kv_capacity=kv_capacity, pad_slot=SCRATCH_SLOT)
        self.static = empty.to(device)
        self.num_tokens, self.kv_capacity = num_tokens, kv_capacity
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph (an empty batch: only the scratch slot)
            model.verify_step(self.static, cache)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        self.counter = OpCounter()
        with self.counter, torch.cuda.graph(self.graph):
            self.logits = model.verify_step(self.static, cache)

    def __call__(self, batch_cpu_padded: VerifyBatch) -> torch.Tensor:
        self.static.copy_(batch_cpu_padded)
        self.graph.replay()
        return self.logits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, or auto")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="model dtype (default: float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--model", default="gqa", choices=["gqa", "mla"])
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="verify steps after the prefill")
    parser.add_argument("--tree-size", type=int, default=24, help="largest draft tree (tokens per request)")
    parser.add_argument("--max-depth", type=int, default=6)
    parser.add_argument("--separate-draft", action="store_true",
                        help="pass the draft K/V as k_draft/v_draft (SGLang's Triton backend) instead of by slot")
    parser.add_argument("--tol", type=float, default=None, help="max |logit error| (default: by dtype)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-ddtree", action="store_true", help="skip the DDTree loop section")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.requests < 1 or args.tree_size < 2:
        parser.error("need --steps >= 1, --requests >= 1 and --tree-size >= 2")

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    tol = TOLERANCE[dtype] if args.tol is None else args.tol
    config = GQA_CONFIG if args.model == "gqa" else MLA_CONFIG
    gen = torch.Generator().manual_seed(args.seed)
    prompt_range = (8, 20)
    num_slots = 1 + args.requests * (prompt_range[1] + (args.steps + 1) * args.tree_size)
    mask_words = shapes.mask_words(max(prompt_range[1], args.tree_size))
    draft_in_cache = not args.separate_draft

    model = ToyDecoder(config, seed=args.seed).to(device=device, dtype=dtype)
    reference_model = copy.deepcopy(model).to(device="cpu", dtype=torch.float64)  # the same (rounded) weights
    base_cache = PagedKVCache.empty(config, num_slots, dtype=dtype, device=device)
    reference_cache = base_cache.to(torch.float64, "cpu")
    recorder = GraphRecorder()
    compiled_step = torch.compile(model.verify_step, backend=recorder, fullgraph=True)
    torch._dynamo.utils.counters.clear()

    caches = {"eager": base_cache, "compiled": base_cache.to(dtype, device)}
    cuda_graph = None
    if device.type == "cuda":
        caches["cuda graph"] = base_cache.to(dtype, device)
        bucket = args.requests * max(prompt_range[1], args.tree_size)
        cuda_graph = CudaGraphRunner(model, caches["cuda graph"], args.requests, bucket, num_slots, mask_words,
                                     draft_in_cache, device)

    eager_counter = OpCounter()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(fn):
        sync()
        start = time.perf_counter()
        result = fn()
        sync()
        return result, time.perf_counter() - start

    errors = {mode: 0.0 for mode in caches}
    times = {mode: [] for mode in list(caches) + ["reference"]}
    first_compile_s = 0.0
    accepted = []
    scheduler = Scheduler(args.requests, num_slots, config.vocab_size, prompt_range, gen)
    for step in range(args.steps + 1):
        prefill = step == 0
        scheduler.prefill_trees() if prefill else scheduler.draft_trees(args.tree_size, args.max_depth)
        batch = scheduler.batch(mask_words, draft_in_cache)
        n = batch.input_ids.shape[0]
        reference, t_ref = timed(lambda: reference_model.verify_step(batch, reference_cache, attention="reference"))
        times["reference"].append(t_ref)
        step_batch = batch.to(device)
        with eager_counter if prefill else contextlib.nullcontext():  # counted once: dispatch modes are slow
            outputs = {"eager": timed(lambda: model.verify_step(step_batch, caches["eager"]))}
        compiled_batch = batch.to(device).mark_dynamic()
        outputs["compiled"] = timed(lambda: compiled_step(compiled_batch, caches["compiled"]))
        if cuda_graph is not None:
            padded = scheduler.batch(mask_words, draft_in_cache, num_tokens=cuda_graph.num_tokens,
                                     kv_capacity=cuda_graph.kv_capacity)
            outputs["cuda graph"] = timed(lambda: cuda_graph(padded))
        for mode, (logits, seconds) in outputs.items():
            err = (logits[:n].double().cpu() - reference).abs().max().item()
            errors[mode] = max(errors[mode], err if math.isfinite(err) else math.inf)  # NaN must fail too
            if mode == "compiled" and step == 0:
                first_compile_s = seconds
            elif not prefill:
                times[mode].append(seconds)
        counts = scheduler.accept(reference, prefill)
        accepted += [] if prefill else counts

    graph_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    failures = [f"{mode} error {err:.2e} > {tol:.1e}" for mode, err in errors.items() if not err <= tol]
    failures += [f"{graph_breaks} graph breaks"] if graph_breaks else []
    failures += [f"{len(recorder.graphs)} compiled graphs, not 1"] if len(recorder.graphs) != 1 else []

    print(f"kdtree_ops demo: toy {args.model.upper()} decoder ({config.num_layers} layers, Hq/Hkv "
          f"{config.num_q_heads}/{config.num_kv_heads}, Dqk/Dv {config.head_dim_qk}/{config.head_dim_v}), {dtype} "
          f"on {device}{' (' + torch.cuda.get_device_name(device) + ')' if device.type == 'cuda' else ''}, "
          f"torch {torch.__version__}")
    print(f"  {args.requests} requests, prefill + {args.steps} verify steps, draft trees of <= {args.tree_size} "
          f"tokens (depth <= {args.max_depth}), draft K/V {'in the cache' if draft_in_cache else 'passed separately'}")
    print(f"  {'mode':<11} {'max |logit err|':>16} {'ms/step':>9}  kdtree op calls per step")
    notes = {
        "eager": describe(eager_counter.calls),
        "compiled": f"{describe(recorder.kdtree_calls())} in {len(recorder.graphs)} graph(s), {graph_breaks} "
                    f"graph breaks (first call, compiling: {first_compile_s:.1f} s)",
    }
    if cuda_graph is not None:
        notes["cuda graph"] = f"{describe(cuda_graph.counter.calls)}, captured once, replayed {args.steps + 1} times"
    for mode in caches:
        print(f"  {mode:<11} {errors[mode]:>16.2e} {1e3 * statistics.median(times[mode]):>9.2f}  {notes[mode]}")
    print(f"  {'reference':<11} {'(float64)':>16} {1e3 * statistics.median(times['reference']):>9.2f}")
    print(f"  drafted tokens accepted per request and step: {statistics.mean(accepted):.2f} (random drafts)")
    print(f"  tolerance {tol:.1e}: " + ("FAIL: " + "; ".join(failures) if failures else "PASS"))
    ddtree_failed = 0 if args.no_ddtree else run_ddtree_demo(str(device), seed=args.seed)
    return 1 if failures or ddtree_failed else 0


if __name__ == "__main__":
    sys.exit(main())
