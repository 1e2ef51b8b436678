"""A target and a DFlash drafter built to agree most of the time, for DDTREE's engine tests (TEST ONLY).

Random weights would give a drafter whose drafts are never accepted, which leaves the tree rows untested; these
are set by hand so that the drafter is right often and wrong sometimes, for reasons the target's attention decides.

- `markov_llama`: LlamaForCausalLM (float32) with one-hot token embeddings (hidden 384 > vocabulary 320: token t is
  sqrt(384) e_t) and `lm_head` rows that read the successor permutation `f` (row f(t) is GAMMA e_t): left alone the
  residual stream makes f(current token) the greedy next token. Two attention layers of random weights (std
  ATTN_STD, MLPs zero) add context-dependent terms that flip that choice at a fraction of positions, so the
  output is not a function of the last token alone and the verify's attention (prefix slots, tree mask) decides
  tokens: a wrong ancestor or slot changes the output.
- `dflash_draft`: a one-layer DFlashDraftModel for it (block size 8: seven drafted positions). Every block row
  attends to the block's first token (the bonus; `q` of the mask token and `k` of every real token lie along one
  low-frequency rotary dimension, so the offset's rotation is negligible) and copies its one-hot through V;
  `o_proj` writes DRAFT_WEIGHTS[d] at e_{f^d(bonus)}, and the shared lm_head turns that into a distribution whose
  top candidates, at every position, are f(bonus), f^2(bonus), f^3(bonus), f^4(bonus) in this order. The block
  is one distribution for all seven positions, so the chain of top-1 picks (DFLASH's block) is right at depth 1
  only, while a best-first tree reaches f^d(bonus) at depth d through rank-d candidates: acceptance grows with
  the node budget. `fc` projects the target's layer-0 states into dimensions no head reads (the context path runs;
  its keys are zero, so the bonus dominates every block row).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .tiny_models import BOS, EOS, VOCAB, save_tokenizer

HIDDEN = 384
GAMMA = 0.4         # lm_head scale: flatter draft distributions, so deep paths enter the tree
ATTN_STD = 0.11     # the target's attention weights: f(current) stays the greedy token at ~84 % of positions
MLA_ATTN_STD = 0.11  # the same for markov_mla (measured below)
DRAFT_WEIGHTS = (1.0, 0.8, 0.65, 0.5)  # o_proj's weight of f^1 .. f^4 of the bonus token
MASK_TOKEN_ID = 0   # <unk>: never the target's greedy token (its lm_head row is zero)
BLOCK_SIZE = 8
FIRST_WORD = 3      # ids 0..2 are special tokens


@dataclass(frozen=True)
class MarkovShape:
    """Sizes of a markov target and its drafter. Ids below `embedded` (specials, then the words) have a hidden
    dimension of their own (one-hot embeddings: embedded <= hidden); ids past it, where the vocabulary is larger
    (a real tokenizer's 128,256), are never prompted nor produced: the target's logit for them is exactly 0, and the
    drafter pushes them down through `unused_dim` (a dimension only the drafter writes; lm_head rows of those ids
    read it with weight -UNUSED_PENALTY), so its distributions stay as flat as the toy's."""

    hidden: int = HIDDEN
    vocab: int = VOCAB
    embedded: int = VOCAB
    draft_heads: int = 4          # DFlash draft: heads of 128 (heads * 128 > embedded: V copies a one-hot)
    draft_norm: float = 1.0       # its final norm's weight: sets how sharp its distributions are

    @property
    def words(self) -> range:
        return range(FIRST_WORD, self.embedded)

    @property
    def unused_dim(self) -> int | None:
        return self.hidden - 1 if self.vocab > self.embedded else None


TOY = MarkovShape()
UNUSED_PENALTY = 2.0


def successor(seed: int = 0, shape: MarkovShape = TOY) -> list[int]:
    """f: a random permutation of the word ids (other ids map to themselves and are never produced)."""
    gen = torch.Generator().manual_seed(seed)
    words = torch.arange(FIRST_WORD, shape.embedded)
    perm = words[torch.randperm(len(words), generator=gen)]
    f = list(range(shape.embedded))
    for src, dst in zip(words.tolist(), perm.tolist()):
        f[src] = dst
    return f


def _power(f: list[int], t: int, d: int) -> int:
    for _ in range(d):
        t = f[t]
    return t


def _set_markov_weights(model, seed: int, attn_std: float) -> None:
    """One-hot embeddings, the successor lm_head, attention weights N(0, attn_std), norms 1, everything else 0."""
    f = successor(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif "self_attn" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * attn_std)
            else:
                p.zero_()
        embed = model.model.embed_tokens.weight
        for t in range(VOCAB):
            embed[t, t] = HIDDEN ** 0.5
        head = model.lm_head.weight
        for t in range(FIRST_WORD, VOCAB):
            head[f[t], t] = GAMMA


def markov_llama(folder: Path, seed: int = 0, head_dim: int = 96) -> Path:
    """The target (module docstring). head_dim: 96 on the CPU; 128 where the CUDA op serves it (64/128/256)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    _set_markov_weights(model, seed, ATTN_STD)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    save_tokenizer(folder)
    return folder


def markov_mla(folder: Path, seed: int = 0) -> Path:
    """The same structure with DeepSeek-V3 attention (MLA: kv_lora_rank 512, rope 64, so the absorbed verify is the
    op's (576, 512) family) and dense MLPs: `dflash_draft(seed)` drafts for it too (same embeddings and lm_head)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS,
        torch_dtype="float32")
    model = DeepseekV3ForCausalLM(config)
    _set_markov_weights(model, seed, MLA_ATTN_STD)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    save_tokenizer(folder)
    meta = json.loads((folder / "config.json").read_text())
    # Fields of DeepSeek-V3's published config that SGLang's DeepseekV2 model reads and transformers' class omits.
    meta.update(moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid", routed_scaling_factor=1.0,
                norm_topk_prob=True, ep_size=1, num_nextn_predict_layers=0)
    (folder / "config.json").write_text(json.dumps(meta, indent=1))
    return folder


def eagle_draft(folder: Path, target: Path) -> Path:
    """An EAGLE draft (SGLang's LlamaForCausalLMEagle) for any markov target: one decoder layer of zeros (the
    residual passes through), `fc = [I | 0]` (the token's one-hot embedding in) and the target's embeddings and
    lm_head, so it drafts f(token): right wherever the target follows f, wrong where its attention decides."""
    from safetensors.torch import load_file, save_file

    weights = {}
    for file in sorted(target.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    config = dict(architectures=["LlamaForCausalLMEagle"], model_type="llama", vocab_size=VOCAB,
                  hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=128, max_position_embeddings=4096, rms_norm_eps=1e-6,
                  rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS,
                  torch_dtype="float32")
    layer = "layers.0."
    draft = {layer + n: torch.zeros(shape) for n, shape in (
        ("self_attn.q_proj.weight", (512, HIDDEN)), ("self_attn.k_proj.weight", (256, HIDDEN)),
        ("self_attn.v_proj.weight", (256, HIDDEN)), ("self_attn.o_proj.weight", (HIDDEN, 512)),
        ("mlp.gate_proj.weight", (32, HIDDEN)), ("mlp.up_proj.weight", (32, HIDDEN)),
        ("mlp.down_proj.weight", (HIDDEN, 32)))}
    draft[layer + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
    draft.update({"embed_tokens.weight": weights["model.embed_tokens.weight"],
                  "fc.weight": torch.cat([torch.eye(HIDDEN), torch.zeros(HIDDEN, HIDDEN)], dim=1),
                  "fc.bias": torch.zeros(HIDDEN), "lm_head.weight": weights["lm_head.weight"]})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.contiguous() for k, v in draft.items()}, str(folder / "model.safetensors"))
    save_tokenizer(folder)
    return folder


def dflash_draft_weights(seed: int = 0, shape: MarkovShape = TOY) -> tuple[dict, dict]:
    """The drafter's weights (float32, names of SGLang's DFlashDraftModel) and config.json for `shape`."""
    hidden, heads, head_dim = shape.hidden, shape.draft_heads, 128
    f = successor(seed, shape)
    w: dict[str, torch.Tensor] = {}
    low = head_dim // 2 - 1           # the lowest-frequency rotary pair (neox layout): rotation ~1e-4 per position
    q = torch.zeros(heads * head_dim, hidden)
    k = torch.zeros(heads * head_dim, hidden)
    v = torch.zeros(heads * head_dim, hidden)
    o = torch.zeros(hidden, heads * head_dim)
    bias_channel = heads * head_dim - 1  # V's constant 1 for real tokens: cancels the mask token's residual
    for h in range(heads):
        q[h * head_dim + low, MASK_TOKEN_ID] = 1.0
        k[h * head_dim + low, FIRST_WORD:shape.embedded] = 1.0
        k[h * head_dim + low, MASK_TOKEN_ID] = -1.0
    scale = hidden ** -0.5                  # the input norm leaves sqrt(hidden) on the token's dimension
    for t in range(shape.embedded):
        v[t, t] = scale
    v[bias_channel, FIRST_WORD:shape.embedded] = scale
    for t in shape.words:
        for d, weight in enumerate(DRAFT_WEIGHTS):
            o[_power(f, t, d), t] += weight * hidden ** 0.5   # h[f^d(t)] -> lm_head favours f^{d+1}(t)
    o[MASK_TOKEN_ID, bias_channel] = -hidden ** 0.5
    if shape.unused_dim is not None:
        o[shape.unused_dim, bias_channel] = hidden ** 0.5
    gen = torch.Generator().manual_seed(seed + 2)
    fc = torch.zeros(hidden, hidden)
    free = hidden - shape.embedded - 8 - (shape.unused_dim is not None)  # dimensions no head reads
    fc[shape.embedded + 8: shape.embedded + 8 + free, :] = torch.randn(free, hidden, generator=gen) * 0.1
    prefix = "layers.0."
    w.update({
        prefix + "self_attn.q_proj.weight": q, prefix + "self_attn.k_proj.weight": k,
        prefix + "self_attn.v_proj.weight": v, prefix + "self_attn.o_proj.weight": o,
        prefix + "self_attn.q_norm.weight": torch.full((head_dim,), 3.0),
        prefix + "self_attn.k_norm.weight": torch.ones(head_dim),
        prefix + "input_layernorm.weight": torch.ones(hidden),
        prefix + "post_attention_layernorm.weight": torch.ones(hidden),
        prefix + "mlp.gate_proj.weight": torch.zeros(32, hidden), prefix + "mlp.up_proj.weight": torch.zeros(32, hidden),
        prefix + "mlp.down_proj.weight": torch.zeros(hidden, 32),
        "norm.weight": torch.full((hidden,), shape.draft_norm), "hidden_norm.weight": torch.ones(hidden),
        "fc.weight": fc,
    })
    config = dict(
        architectures=["DFlashDraftModel"], model_type="qwen3", vocab_size=shape.vocab, hidden_size=hidden,
        intermediate_size=32, num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=heads,
        head_dim=head_dim, max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
        attention_bias=False, tie_word_embeddings=False, torch_dtype="float32", bos_token_id=BOS, eos_token_id=EOS,
        block_size=BLOCK_SIZE, dflash_config={"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": [0]})
    return w, config


def dflash_draft(folder: Path, seed: int = 0, shape: MarkovShape = TOY) -> Path:
    """The drafter for `markov_llama(seed=seed)` / `markov_mla` (module docstring)."""
    from safetensors.torch import save_file

    w, config = dflash_draft_weights(seed, shape)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file({name: t.contiguous() for name, t in w.items()}, str(folder / "model.safetensors"))
    save_tokenizer(folder)
    return folder
