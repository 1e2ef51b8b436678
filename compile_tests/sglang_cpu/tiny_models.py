"""Tiny checkpoints the engine tests build for themselves: config, safetensors weights and a tokenizer (TEST ONLY).

Nothing is downloaded (HF_HUB_OFFLINE=1): each builder writes a folder SGLang loads like any local checkpoint.
The models are float32 with random weights drawn from a fixed seed, so a run is reproducible and greedy decoding
has no bf16 rounding to flip a near-tie; the engine tests also measure the greedy margin of every token they
compare (log-prob of the first token minus the second's, from the reference run), so a tie that float32 could
still close fails loudly instead of passing by luck.

- `llama`: LlamaForCausalLM, GQA (4 query / 2 KV heads of 32), 2 layers. Its embedding rows have unit RMS and
  every norm weight is 1, so layer 0's input norm is the identity on them; layer 1 is weak (weights x 0.1), so
  layer 0 decides most of the output while layer 1's attention still moves the logits.
- `eagle_draft`: LlamaForCausalLMEagle (EAGLE) for `llama`: one decoder layer that is a copy of the target's
  layer 0, `fc = [I | 0]` (the token embedding in, the target's hidden state ignored) and the target's lm_head.
  EAGLE's draft layer skips its input norm and its model has no final norm; on unit-RMS embeddings and all-ones
  norms neither changes the argmax, so the draft predicts what the target's layer 0 alone predicts. It runs the
  layer over its own cache of the shifted tokens (EAGLE feeds token t+1 at position t: RoPE sees the same
  distances), missing only the first prompt token: a draft that is mostly right, so verification accepts trees.
- `deepseek_mla`: DeepseekV3ForCausalLM with MLA (kv_lora_rank 32, rope dim 16), dense MLPs, 2 layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 320  # word tokens w3..w319 after <unk>, <s>, </s>
SPECIAL = ["<unk>", "<s>", "</s>"]
BOS, EOS = 1, 2


def save_tokenizer(folder: Path) -> None:
    """A word-level tokenizer over 'w3' .. 'w{VOCAB-1}' (whitespace split), saved as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL), VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)


def _randomize(model, seed: int, init_std: float, deep_scale: float = 1.0) -> None:
    """Every weight from N(0, init_std) with `seed` (layers past 0 times deep_scale); norms 1; embedding rows
    scaled to unit RMS."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.fill_(1.0)
                continue
            p.copy_(torch.randn(p.shape, generator=gen) * init_std)
            if ".layers." in name and ".layers.0." not in name:
                p.mul_(deep_scale)
            if "embed_tokens" in name:
                p.div_(p.pow(2).mean(-1, keepdim=True).sqrt())


def _save(model, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    save_tokenizer(folder)
    return folder


def llama(folder: Path, seed: int = 0, init_std: float = 0.25) -> Path:
    """A tiny float32 Llama (GQA 4/2 heads of 32, 2 layers); see the module docstring."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=10000.0,
        tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    _randomize(model, seed, init_std, deep_scale=0.1)
    return _save(model, folder)


def eagle_draft(folder: Path, target: Path) -> Path:
    """EAGLE's one-layer draft for `llama` (SGLang's LlamaForCausalLMEagle): see the module docstring."""
    from safetensors.torch import load_file, save_file

    config = json.loads((target / "config.json").read_text())
    weights = load_file(str(target / "model.safetensors"))
    hidden = config["hidden_size"]
    draft = {name.removeprefix("model."): w for name, w in weights.items()
             if name.startswith("model.layers.0.") and "input_layernorm" not in name}
    draft.update({
        "embed_tokens.weight": weights["model.embed_tokens.weight"],
        "fc.weight": torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1),  # [I | 0]
        "fc.bias": torch.zeros(hidden),
        "lm_head.weight": weights["lm_head.weight"],
    })
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config, architectures=["LlamaForCausalLMEagle"],
                                                        num_hidden_layers=1), indent=1))
    save_file({k: v.contiguous() for k, v in draft.items()}, str(folder / "model.safetensors"))
    save_tokenizer(folder)
    return folder


def plain_rope_as_yarn(max_positions: int) -> dict:
    """SGLang's CPU rope for MLA is DeepSeek's YaRN only (layers/rotary_embedding/factory.py: get_rope_cpu asserts
    rope_scaling); factor 1 with mscale 1 is plain RoPE."""
    return {"rope_type": "yarn", "type": "yarn", "factor": 1.0, "original_max_position_embeddings": max_positions,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def deepseek_mla(folder: Path, seed: int = 0, init_std: float = 0.25) -> Path:
    """A tiny float32 DeepSeek-V3-style model: MLA attention (absorbed on the decode/verify path), dense MLPs."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=16, v_head_dim=16, first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, max_position_embeddings=1024, rms_norm_eps=1e-6,
        rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS,
        torch_dtype="float32")
    model = DeepseekV3ForCausalLM(config)
    _randomize(model, seed, init_std)
    folder = _save(model, folder)
    meta = json.loads((folder / "config.json").read_text())
    meta["rope_scaling"] = plain_rope_as_yarn(1024)
    # Fields of DeepSeek-V3's published config that SGLang's DeepseekV2 model reads and transformers' class omits.
    meta.update(moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid", routed_scaling_factor=1.0,
                norm_topk_prob=True, ep_size=1, num_nextn_predict_layers=0)
    (folder / "config.json").write_text(json.dumps(meta, indent=1))
    return folder
