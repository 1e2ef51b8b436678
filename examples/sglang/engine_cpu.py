"""NGRAM speculative decoding through the kdtree backend in a real sglang.Engine, on a CPU.

Builds a tiny float32 Llama (random weights, a word-level tokenizer) in a temporary folder, starts an Engine with
`attention_backend="kdtree"` and NGRAM speculation, generates greedily, and prints the tokens, how many drafts
each verify step accepted, and the backend's status (what served TARGET_VERIFY, and its base). Then it checks the
tokens against the same engine without speculation.

    python examples/sglang/engine_cpu.py              # about a minute on 2 cores (two engines)
    python examples/sglang/engine_cpu.py --tokens 48 --draft-tokens 4

TEST-ONLY SHIMS: sglang 0.5.23's CPU path imports a few kernels from `sgl_kernel`, and no published sgl-kernel
wheel is a CPU build. This script borrows the test suite's stand-ins (compile_tests/sglang_cpu/: SGLang's CPU
entry points written in torch, put first on PYTHONPATH so SGLang's scheduler processes import them), and its
tiny-model builder. They are for trying the backend on a laptop, not for serving; kdtree_ops itself holds none of
them. On a GPU server none of this is needed: `--attention-backend kdtree` with SGLang's own kernels.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "compile_tests"


def cpu_environment() -> None:
    """SGLang on the CPU, offline, with the test-only sgl_kernel stand-in first on the path (set before sglang is
    imported: SGLang picks its platform at import, and its scheduler processes inherit the environment)."""
    sys.path[:0] = [str(TESTS / "sglang_cpu" / "stand_in"), str(TESTS)]
    from sglang_cpu.engine_driver import driver_env

    os.environ.update(driver_env())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    parser.add_argument("--draft-tokens", type=int, default=8, help="NGRAM's draft tree size")
    args = parser.parse_args(argv)
    cpu_environment()
    import sglang
    from sglang_cpu import tiny_models

    model = tiny_models.llama(Path(tempfile.mkdtemp(prefix="kdtree_tiny_llama_")))
    phrase = [11, 42, 7, 99, 23]
    prompts = [[5, 6, 7, 8, 9], (phrase * 8)[:37]]  # the second repeats itself: n-grams to draft from
    settings = dict(model_path=str(model), device="cpu", dtype="float32", attention_backend="kdtree",
                    mem_fraction_static=0.5, max_total_tokens=4096, disable_cuda_graph=True, log_level="warning")
    sampling = {"max_new_tokens": args.tokens, "temperature": 0.0, "ignore_eos": True}

    engine = sglang.Engine(**settings, speculative_algorithm="NGRAM", speculative_num_draft_tokens=args.draft_tokens)
    outputs = engine.generate(input_ids=prompts, sampling_params=sampling)
    (status,) = engine.get_server_info()["internal_states"][0]["kdtree"]
    engine.shutdown()
    for prompt, out in zip(prompts, outputs):
        meta = out["meta_info"]
        per_step = meta.get("spec_correct_drafts_histogram") or []
        steps = ", ".join(f"{count} step{'s' if count != 1 else ''} accepting {k}" for k, count in enumerate(per_step)
                          if count)
        print(f"prompt of {len(prompt)} tokens -> {out['output_ids']}")
        print(f"  {meta['spec_verify_ct']} verify steps, accept length {meta['spec_accept_length']:.2f} per step "
              f"(drafts accepted + the bonus token); drafts accepted per step: {steps or 'not reported'}")
    print(status["status"])
    print(f"  {status['verify_steps']} verify steps; op calls per layer {status['op_calls']}; "
          f"base calls {status['base_calls'] or 'none'}; fall-backs {status['fallbacks'] or 'none'}")

    engine = sglang.Engine(**settings)  # the same engine without speculation: every call is the base's
    plain = engine.generate(input_ids=prompts, sampling_params=sampling)
    engine.shutdown()
    same = [o["output_ids"] for o in outputs] == [o["output_ids"] for o in plain]
    print("NGRAM through kdtree " + ("equals" if same else "DIFFERS from") + " generation without speculation")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
