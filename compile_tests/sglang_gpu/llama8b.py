"""A Llama-3-8B-shaped markov target and its drafts, written on the GPU machine (TEST ONLY).

The shape of Llama-3-8B (32 layers, hidden 4096, 32/8 heads of 128, MLP 14336, vocabulary 128,256, RoPE theta
500,000; bf16, 16 GB) with sglang_cpu/ddtree_models' structure confined to the first EMBEDDED ids (MarkovShape): one-hot
embeddings of ids 0..EMBEDDED-1, the successor lm_head over the words 3..EMBEDDED-1, attention weights N(0, attn_std)
in every layer (the row of o_proj that writes the drafter's `unused_dim` zeroed, so the target's logits of the other
125,000 ids are exactly 0), MLP weights 0 (they still cost their full GEMMs). The lm_head is the real size: a large
part of a step, as in the model it stands for.

attn_std sets how often the target follows f (measured on the CPU in float32, greedy continuations of the suite's
prompts, 2026-12-05): 0.020 -> 100 %, 0.024 -> 89 %, 0.027 -> 68 %, 0.030 -> 34 %; the suite's default is 0.027.

No HF model object is built (8B float32 parameters would not fit the time); the tensors are drawn on the GPU and written
as safetensors shards, about 15 s on the H100 machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sglang_cpu import ddtree_models
from sglang_cpu.ddtree_models import FIRST_WORD, GAMMA, MarkovShape

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 4096, 32, 32, 8, 128, 14336, 128256
EMBEDDED = 3003  # specials and 3,000 words
SHAPE = MarkovShape(hidden=HIDDEN, vocab=VOCAB, embedded=EMBEDDED, draft_heads=32, draft_norm=0.5)
DEFAULT_ATTN_STD = 0.027


def _config() -> dict:
    return dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=VOCAB, hidden_size=HIDDEN,
                intermediate_size=MLP, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, max_position_embeddings=8192, rms_norm_eps=1e-5,
                rope_theta=500000.0, hidden_act="silu", tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                torch_dtype="bfloat16")


def _target_tensors(layer: int | None, seed: int, attn_std: float, device) -> dict:
    """One layer's tensors (bf16, CPU), or with layer None the embedding, final norm and lm_head."""
    bf16 = torch.bfloat16
    if layer is None:
        f = ddtree_models.successor(seed, SHAPE)
        embed = torch.zeros(VOCAB, HIDDEN, dtype=bf16, device=device)
        ids = torch.arange(EMBEDDED, device=device)
        embed[ids, ids] = HIDDEN ** 0.5
        head = torch.zeros(VOCAB, HIDDEN, dtype=bf16, device=device)
        words = torch.arange(FIRST_WORD, EMBEDDED, device=device)
        head[torch.tensor(f, device=device)[words], words] = GAMMA
        head[EMBEDDED:, SHAPE.unused_dim] = -ddtree_models.UNUSED_PENALTY
        return {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(HIDDEN, dtype=bf16),
                "lm_head.weight": head}
    gen = torch.Generator(device=device).manual_seed(seed * 1000 + layer + 1)
    p = f"model.layers.{layer}."

    def rnd(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen, device=device) * attn_std).to(bf16)

    o = rnd(HIDDEN, HEADS * HEAD_DIM)
    o[SHAPE.unused_dim] = 0
    return {p + "self_attn.q_proj.weight": rnd(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": rnd(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": rnd(KV_HEADS * HEAD_DIM, HIDDEN), p + "self_attn.o_proj.weight": o,
            p + "mlp.gate_proj.weight": torch.zeros(MLP, HIDDEN, dtype=bf16),
            p + "mlp.up_proj.weight": torch.zeros(MLP, HIDDEN, dtype=bf16),
            p + "mlp.down_proj.weight": torch.zeros(HIDDEN, MLP, dtype=bf16),
            p + "input_layernorm.weight": torch.ones(HIDDEN, dtype=bf16),
            p + "post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=bf16)}


def write_target(folder: Path, seed: int = 0, attn_std: float = DEFAULT_ATTN_STD) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "done").exists():
        return folder
    device = "cuda" if torch.cuda.is_available() else "cpu"
    index, shards = {}, [[None], *[[i, i + 1, i + 2, i + 3] for i in range(0, LAYERS, 4)]]
    for n, layers in enumerate(shards):
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for layer in layers:
            tensors.update({k: v.cpu().contiguous() for k, v in _target_tensors(layer, seed, attn_std, device).items()})
        save_file(tensors, str(folder / name))
        index.update(dict.fromkeys(tensors, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    (folder / "config.json").write_text(json.dumps(_config(), indent=1))
    (folder / "done").write_text("")
    return folder


def write_eagle_draft(folder: Path) -> Path:
    """EAGLE's draft: one decoder layer of zeros, fc = [I | 0]; SGLang's EAGLE shares the target's embedding and
    lm_head with it, so it drafts f(token) (ddtree_models.eagle_draft, without the copies of those two tensors)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    small = dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=32)
    config = dict(_config(), architectures=["LlamaForCausalLMEagle"], num_hidden_layers=1, **small)
    layer = "layers.0."
    draft = {layer + n: torch.zeros(shape, dtype=torch.bfloat16) for n, shape in (
        ("self_attn.q_proj.weight", (512, HIDDEN)), ("self_attn.k_proj.weight", (512, HIDDEN)),
        ("self_attn.v_proj.weight", (512, HIDDEN)), ("self_attn.o_proj.weight", (HIDDEN, 512)),
        ("mlp.gate_proj.weight", (32, HIDDEN)), ("mlp.up_proj.weight", (32, HIDDEN)),
        ("mlp.down_proj.weight", (HIDDEN, 32)))}
    draft[layer + "post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    draft["fc.weight"] = torch.cat([torch.eye(HIDDEN), torch.zeros(HIDDEN, HIDDEN)], dim=1).to(torch.bfloat16)
    draft["fc.bias"] = torch.zeros(HIDDEN, dtype=torch.bfloat16)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file(draft, str(folder / "model.safetensors"))
    return folder


def write_dflash_draft(folder: Path, seed: int = 0) -> Path:
    from safetensors.torch import save_file

    weights, config = ddtree_models.dflash_draft_weights(seed, SHAPE)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config, torch_dtype="bfloat16"), indent=1))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    return folder


def build(folder: Path, attn_std: float = DEFAULT_ATTN_STD) -> dict:
    """engine_models.build's answer for `llama8b` (no tokenizer: the engines run with skip_tokenizer_init)."""
    target = write_target(folder / f"target-{attn_std}", attn_std=attn_std)
    return {"target": str(target), "eagle": str(write_eagle_draft(folder / "eagle")),
            "dflash": str(write_dflash_draft(folder / "dflash")), "words": SHAPE.words,
            "engine": dict(mem_fraction_static=0.8, cuda_graph_max_bs_decode=4, skip_tokenizer_init=True,
                           max_total_tokens=65536)}
