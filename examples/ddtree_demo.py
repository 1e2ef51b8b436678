"""The DDTree loop on the toy target: accepted tokens and time per step for tree budgets 16 to 1023.

Each step is one DDTree round for every request at once — the block drafter proposes K = 16 positions, the
ddtree ops build the best-first tree, the target verifies it through tree_verify_attention, accept_greedy walks
it and the accepted path's K/V is committed (page size 1 bookkeeping) — run eagerly on the CPU, and on a GPU as
replays of one CUDA graph that holds the whole round. The output is checked against plain greedy decoding of
the same target, token for token. The largest budget is 1023 draft nodes: with the root, a tree of 1024
tokens, the verify op's maximum.

    python examples/ddtree_demo.py                 # CPU
    python examples/ddtree_demo.py --device cuda   # bf16, CUDA-graph replay
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from kdtree_ops.ddtree.loop import DDTreeRound, ddtree_generate, greedy_decode
from kdtree_ops.testing.toy_drafter import BlockDrafter, top1_accuracy
from kdtree_ops.testing.toy_target import margin_bound, margin_target, top2_gap

BUDGETS = (16, 64, 256, 1023)
BLOCK_SIZE, TOP_K = 16, 4


def run(device: str = "cpu", requests: int | None = None, rounds: int | None = None, noise: float = 0.3,
        seed: int = 0) -> int:
    """Prints one block per budget; returns 1 if any output differs from greedy decoding, else 0."""
    cuda = torch.device(device).type == "cuda"
    requests = requests or (4 if cuda else 2)
    rounds = rounds or (8 if cuda else 3)  # a CPU step at budget 1023 takes ~2 s on 2 cores
    dtype = torch.bfloat16 if cuda else torch.float32
    model, kappa = margin_target(seed)
    model = model.to(device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(kappa.shape[0], (int(n),), generator=gen).tolist()
               for n in torch.randint(4, 40, (requests,), generator=gen)]
    print(f"DDTree loop: toy margin target ({model.config.num_layers} layers, vocab {model.config.vocab_size}), "
          f"{dtype} on {device}, {'one CUDA graph per round, replayed' if cuda else 'eager'}; {requests} requests "
          f"(prompts {', '.join(str(len(p)) for p in prompts)}), {rounds} steps, drafter K={BLOCK_SIZE} top-{TOP_K}, "
          f"noise {noise} (its top-1 is the target's token with p={top1_accuracy(noise):.2f})")
    failures = []
    for budget in BUDGETS:
        drafter = BlockDrafter(kappa, BLOCK_SIZE, TOP_K, noise, seed=seed, device=device)
        result = ddtree_generate(DDTreeRound(model, drafter, budget), prompts, rounds, dtype, device, cuda_graph=cuda)
        greedy, logits = greedy_decode(model, prompts, max(map(len, result.tokens)), dtype, device)
        same = all(got == want[:len(got)] for got, want in zip(result.tokens, greedy))
        bound = margin_bound(logits.abs().max().item(), model.config.num_layers)
        margin = top2_gap(logits).min().item()
        failures += [] if same else [f"budget {budget}: output differs from greedy decoding"]
        failures += [] if margin > bound else [f"budget {budget}: greedy margin {margin:.2f} <= {bound:.2f}"]
        per_step = "  ".join(",".join(map(str, step)) for step in result.accepted)
        steady = result.step_seconds[1:] if cuda and len(result.step_seconds) > 1 else result.step_seconds
        mean_accepted = statistics.mean(a for step in result.accepted for a in step)
        print(f"  budget {budget:>4}: drafts accepted per step and request [{per_step}], mean {mean_accepted:.2f} "
              f"of at most {BLOCK_SIZE} (each step also emits the bonus token);  "
              f"{1e3 * statistics.median(steady):8.2f} ms/step;  "
              f"{'= greedy' if same else 'DIFFERS from greedy'} ({sum(map(len, result.tokens))} tokens, "
              f"margin {margin:.2f} > {bound:.2f})")
    print("  DDTree: " + ("FAIL: " + "; ".join(failures) if failures else "PASS"))
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="DDTree rounds per budget")
    parser.add_argument("--noise", type=float, default=0.3, help="drafter noise (0: always right)")
    args = parser.parse_args(argv)
    return run(args.device, args.requests, args.steps, args.noise)


if __name__ == "__main__":
    sys.exit(main())
