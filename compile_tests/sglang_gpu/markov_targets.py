"""Real-sized markov targets and their drafts, written as checkpoints on the GPU machine (TEST ONLY).

A target here has the shape of a published model (its layers, widths, vocabulary: the cost of a step) and the
structure of sglang_cpu/ddtree_models confined to its first `embedded` ids (MarkovShape): one-hot embeddings of ids
0..embedded-1, the successor lm_head over the words, attention weights N(0, attn_std) in every layer (the row of the
output projection that writes the drafter's `unused_dim` zeroed, so the target's logits of the other ids are exactly
0), MLP weights 0 (they still cost their full GEMMs). attn_std sets how often the target follows the drafter.

No HF model object is built (billions of float32 parameters would not fit the time): the tensors are drawn on the GPU
(on the CPU where there is none) and written as safetensors shards of four layers. A TargetSpec names the shape; the
modules llama8b.py (Llama-3-8B) and mla_lite.py (DeepSeek-V2-Lite's attention) hold theirs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from sglang_cpu import ddtree_models
from sglang_cpu.ddtree_models import FIRST_WORD, GAMMA, MarkovShape


@dataclass(frozen=True)
class TargetSpec:
    shape: MarkovShape  # hidden, vocabulary, embedded ids, the drafter's heads
    layers: int
    config: dict        # config.json of the target
    # One decoder layer's tensors: (prefix "model.layers.i.", a draw of N(0, attn_std) of a shape, bf16 ones, bf16
    # zeros) -> name -> tensor, the output projection's row `shape.unused_dim` zeroed.
    layer_tensors: Callable[[str, Callable, Callable, Callable], dict]


# sglang.Engine settings of every target here (no tokenizer: the engines run with skip_tokenizer_init)
ENGINE = dict(mem_fraction_static=0.8, cuda_graph_max_bs_decode=4, skip_tokenizer_init=True, max_total_tokens=65536)


def head_tensors(spec: TargetSpec, seed: int, device) -> dict:
    """The embedding (one-hot rows of the embedded ids), the final norm and the successor lm_head."""
    bf16, shape = torch.bfloat16, spec.shape
    f = ddtree_models.successor(seed, shape)
    embed = torch.zeros(shape.vocab, shape.hidden, dtype=bf16, device=device)
    ids = torch.arange(shape.embedded, device=device)
    embed[ids, ids] = shape.hidden ** 0.5
    head = torch.zeros(shape.vocab, shape.hidden, dtype=bf16, device=device)
    words = torch.arange(FIRST_WORD, shape.embedded, device=device)
    head[torch.tensor(f, device=device)[words], words] = GAMMA
    if shape.unused_dim is not None:
        head[shape.embedded:, shape.unused_dim] = -ddtree_models.UNUSED_PENALTY
    return {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(shape.hidden, dtype=bf16),
            "lm_head.weight": head}


def layer_tensors(spec: TargetSpec, layer: int, seed: int, attn_std: float, device) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed * 1000 + layer + 1)

    def rnd(*size: int) -> torch.Tensor:
        return (torch.randn(*size, generator=gen, device=device) * attn_std).to(torch.bfloat16)

    def ones(*size: int) -> torch.Tensor:
        return torch.ones(*size, dtype=torch.bfloat16)

    def zeros(*size: int) -> torch.Tensor:
        return torch.zeros(*size, dtype=torch.bfloat16)

    return spec.layer_tensors(f"model.layers.{layer}.", rnd, ones, zeros)


def write_target(spec: TargetSpec, folder: Path, attn_std: float, seed: int = 0) -> Path:
    """The target's checkpoint in `folder` (kept if a finished one is there)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "done").exists():
        return folder
    device = "cuda" if torch.cuda.is_available() else "cpu"
    index, shards = {}, [[None], *[list(range(i, min(i + 4, spec.layers))) for i in range(0, spec.layers, 4)]]
    for n, layers in enumerate(shards):
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for layer in layers:
            drawn = head_tensors(spec, seed, device) if layer is None else \
                layer_tensors(spec, layer, seed, attn_std, device)
            tensors.update({k: v.cpu().contiguous() for k, v in drawn.items()})
        save_file(tensors, str(folder / name))
        index.update(dict.fromkeys(tensors, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    (folder / "config.json").write_text(json.dumps(spec.config, indent=1))
    (folder / "done").write_text("")
    return folder


def write_eagle_draft(spec: TargetSpec, folder: Path) -> Path:
    """EAGLE's draft: one Llama decoder layer of zeros, fc = [I | 0]; SGLang's EAGLE shares the target's embedding and
    lm_head with it, so it drafts f(token) (ddtree_models.eagle_draft, without the copies of those two tensors)."""
    from safetensors.torch import save_file

    hidden = spec.shape.hidden
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(architectures=["LlamaForCausalLMEagle"], model_type="llama", vocab_size=spec.shape.vocab,
                  hidden_size=hidden, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=4, head_dim=128, max_position_embeddings=8192, rms_norm_eps=1e-5,
                  rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                  torch_dtype="bfloat16")
    layer = "layers.0."
    draft = {layer + n: torch.zeros(shape, dtype=torch.bfloat16) for n, shape in (
        ("self_attn.q_proj.weight", (512, hidden)), ("self_attn.k_proj.weight", (512, hidden)),
        ("self_attn.v_proj.weight", (512, hidden)), ("self_attn.o_proj.weight", (hidden, 512)),
        ("mlp.gate_proj.weight", (32, hidden)), ("mlp.up_proj.weight", (32, hidden)),
        ("mlp.down_proj.weight", (hidden, 32)))}
    draft[layer + "post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    draft["fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1).to(torch.bfloat16)
    draft["fc.bias"] = torch.zeros(hidden, dtype=torch.bfloat16)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file(draft, str(folder / "model.safetensors"))
    return folder


def write_dflash_draft(spec: TargetSpec, folder: Path, seed: int = 0) -> Path:
    from safetensors.torch import save_file

    weights, config = ddtree_models.dflash_draft_weights(seed, spec.shape)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config, torch_dtype="bfloat16"), indent=1))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    return folder


def build(spec: TargetSpec, folder: Path, attn_std: float) -> dict:
    """engine_models.build's answer for a target of `spec`: the paths of the target and its drafts, the word ids
    prompts may use, engine settings."""
    target = write_target(spec, folder / f"target-{attn_std}", attn_std=attn_std)
    return {"target": str(target), "eagle": str(write_eagle_draft(spec, folder / "eagle")),
            "dflash": str(write_dflash_draft(spec, folder / "dflash")), "words": spec.shape.words,
            "engine": dict(ENGINE)}
