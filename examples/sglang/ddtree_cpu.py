"""DDTREE speculative decoding (`--speculative-algorithm DDTREE`) in a real sglang.Engine, on a CPU.

Builds a tiny float32 target and a DFlash drafter made to agree with it most of the time
(compile_tests/sglang_cpu/ddtree_models.py), starts an Engine with `attention_backend="kdtree"` and DDTREE, and
generates greedily; checks the tokens against the same target without speculation, and prints the accepted drafts
per round and where a round's time goes (KDTREE_DDTREE_PROFILE=1: draft, build, verify, accept, commit).

    python examples/sglang/ddtree_cpu.py                       # one budget: trees of 16 tokens
    python examples/sglang/ddtree_cpu.py --budgets 16 64 256 1024 --chain --out examples/results/ddtree_cpu.md

`--chain` adds the same drafter as a chain of top-1 picks (KDTREE_DDTREE_TOPK=1, block_size tokens): the round
shape of SGLang's DFLASH (its worker cannot run on the CPU: DESIGN.md, "DFLASH on the CPU"), measured through
this worker. `--out` writes the table as markdown with the machine and library versions.

TEST-ONLY SHIMS, as in engine_cpu.py: the sgl_kernel stand-in and the model builders come from compile_tests/.
On a GPU server: `--speculative-algorithm DDTREE --speculative-draft-model-path <DFlash checkpoint>
--attention-backend kdtree` with SGLang's own kernels (README).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
from pathlib import Path

from engine_cpu import cpu_environment

PROMPT_LENGTHS = (5, 17, 40, 23)


def commit() -> str:
    import subprocess

    run = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return run.stdout.strip() or "unknown"


def ddtree_stats(engine) -> dict:
    """The DDTREE worker's cumulative stats (rounds, seconds per phase), {} without DDTREE."""
    return (engine.get_server_info()["internal_states"][0].get("ddtree") or [{}])[0]


def run(sglang, target: Path, draft: Path, prompts, tokens: int, tree_tokens: int | None, topk: int) -> dict:
    os.environ["KDTREE_DDTREE_TOPK"] = str(topk)
    os.environ["KDTREE_DDTREE_PROFILE"] = "1"
    settings = dict(model_path=str(target), device="cpu", dtype="float32", attention_backend="kdtree",
                    mem_fraction_static=0.5, max_total_tokens=8192, disable_cuda_graph=True, log_level="warning")
    if tree_tokens is not None:
        settings.update(speculative_algorithm="DDTREE", speculative_draft_model_path=str(draft),
                        speculative_num_draft_tokens=tree_tokens)
    engine = sglang.Engine(**settings)
    sampling = {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    try:
        engine.generate(input_ids=prompts, sampling_params=dict(sampling, max_new_tokens=4))  # warm-up, not timed
        before = ddtree_stats(engine)
        outputs = engine.generate(input_ids=prompts, sampling_params=sampling)
        after = ddtree_stats(engine)
    finally:
        engine.shutdown()
    stats = {"rounds": after.get("rounds", 0) - before.get("rounds", 0),
             "seconds": {p: t - before["seconds"][p] for p, t in after.get("seconds", {}).items()}}
    metas = [o["meta_info"] for o in outputs]
    accepted = (sum((m["spec_accept_length"] - 1) * m["spec_verify_ct"] for m in metas)
                / sum(m["spec_verify_ct"] for m in metas)) if tree_tokens is not None else 0.0
    return {"ids": [o["output_ids"] for o in outputs], "stats": stats, "accepted": accepted}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    parser.add_argument("--budgets", type=int, nargs="+", default=[16],
                        help="tree sizes (--speculative-num-draft-tokens: the root plus the node budget)")
    parser.add_argument("--topk", type=int, default=8, help="KDTREE_DDTREE_TOPK: candidates per drafted position")
    parser.add_argument("--chain", action="store_true", help="also the top-1 chain (DFLASH's round shape)")
    parser.add_argument("--out", type=Path, help="write the table here (markdown)")
    args = parser.parse_args(argv)
    cpu_environment()
    import sglang
    import torch
    from sglang_cpu import ddtree_models

    root = Path(tempfile.mkdtemp(prefix="kdtree_ddtree_models_"))
    target, draft = ddtree_models.markov_llama(root / "target"), ddtree_models.dflash_draft(root / "draft")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 320) for _ in range(n)] for n in PROMPT_LENGTHS]
    plain = run(sglang, target, draft, prompts, args.tokens, None, args.topk)
    configs = [(n, args.topk, f"tree, top-{args.topk}") for n in args.budgets]
    if args.chain:
        configs.append((ddtree_models.BLOCK_SIZE, 1, "chain, top-1 (DFLASH's shape)"))
    rows, lossless = [], True
    for tree_tokens, topk, label in configs:
        result = run(sglang, target, draft, prompts, args.tokens, tree_tokens, topk)
        same = result["ids"] == plain["ids"]
        lossless &= same
        s = result["stats"]
        per_round = {p: 1e3 * t / s["rounds"] for p, t in s["seconds"].items()}
        rows.append(f"| {label} | {tree_tokens} | {result['accepted']:.2f} | "
                    + " | ".join(f"{per_round[p]:.2f}" for p in ("draft", "build", "verify", "accept", "commit"))
                    + f" | {sum(per_round.values()):.2f} | {'yes' if same else 'NO'} |")
        print(rows[-1], flush=True)
    table = [f"DDTREE on the CPU: {len(prompts)} requests (prompts of {', '.join(map(str, PROMPT_LENGTHS))} "
             f"tokens), {args.tokens} new tokens each, greedy; the toy target and DFlash drafter of "
             "compile_tests/sglang_cpu/ddtree_models.py (block size 8: 7 drafted positions). Milliseconds per "
             "round (all requests of the batch at once), each phase timed with KDTREE_DDTREE_PROFILE=1, after a warm-up "
             "generation in the same engine.", "",
             "| drafter | tree tokens | drafts accepted per request per round | draft ms | build ms | verify ms | "
             "accept ms | commit ms | round ms | equals no speculation |", "|---|---|---|---|---|---|---|---|---|---|",
             *rows, "",
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
             f"sglang {sglang.__version__}, commit {commit()}; `python examples/sglang/ddtree_cpu.py {' '.join(argv or sys.argv[1:])}`"]
    print("\n".join(table))
    if args.out:
        args.out.write_text("\n".join(table) + "\n")
    print("DDTREE through kdtree " + ("equals" if lossless else "DIFFERS from") + " generation without speculation")
    return 0 if lossless else 1


if __name__ == "__main__":
    sys.exit(main())
