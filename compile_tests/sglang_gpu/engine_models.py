"""The GPU engine suite's checkpoints: targets built so that their drafters agree with them part of the time.

- `tiny`: sglang_cpu/ddtree_models.markov_llama with head dim 128 (a GQA family the CUDA op serves), its EAGLE
  draft (ddtree_models.eagle_draft: drafts f(token)) and DFlash draft (ddtree_models.dflash_draft);
- `mla`: ddtree_models.markov_mla (DeepSeek-V3 attention, kv_lora_rank 512 + rope 64: the op's absorbed MLA family)
  with the same two drafts (same embeddings and lm_head);
- `llama8b`: a Llama-3-8B-shaped target (sglang_gpu/llama8b.py), built on the device;
- `mla_lite`: a target of DeepSeek-V2-Lite's attention shape (sglang_gpu/mla_lite.py), built on the device.
Engine settings: the models run side by side on one GPU (examples/gpu_suite.sh), so every engine's KV pool is
capped by max_total_tokens, and mem_fraction_static is high only so that SGLang's start-up check (the memory its
fraction leaves free must be free) passes while the other models' engines hold theirs.
Measured on the CPU in float32 (greedy continuations of the suite's prompts): the target follows f at 66 % (tiny)
and 54 % (mla) of positions.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from sglang_cpu import ddtree_models


def build(model: str, root: Path) -> dict:
    """Paths of the target and its drafts, the word ids prompts may use, and engine settings of the model."""
    folder = root / model
    if model == "tiny":
        target = ddtree_models.markov_llama(folder / "target", head_dim=128)
    elif model == "mla":
        target = ddtree_models.markov_mla(folder / "target")
    elif model in ("llama8b", "mla_lite"):
        return importlib.import_module(f"sglang_gpu.{model}").build(folder)
    else:
        raise ValueError(f"unknown engine model {model!r} (tiny, mla, llama8b, mla_lite)")
    return {"target": str(target), "eagle": str(ddtree_models.eagle_draft(folder / "eagle", target)),
            "dflash": str(ddtree_models.dflash_draft(folder / "dflash")),
            "words": range(ddtree_models.FIRST_WORD, ddtree_models.VOCAB),
            "engine": dict(mem_fraction_static=0.8, cuda_graph_max_bs_decode=4, max_total_tokens=65536)}
