"""A markov target of DeepSeek-V2-Lite's attention shape and its drafts, written on the GPU machine (TEST ONLY;
markov_targets.py).

DeepSeek-V2-Lite's attention and widths: 27 layers, hidden 2048, 16 heads, no q LoRA, kv_lora_rank 512, qk
nope/rope 128/64, v 128 (the op's absorbed (576, 512) MLA family), vocabulary 102,400; its MLPs dense of width 10,944
(the published model routes 26 of its layers to 64 experts: the issue asks for the attention shape, and a dense MLP of
zeros keeps the step's GEMMs without the router). Plain RoPE (theta 10,000) instead of YaRN. The words are the first
1,000 ids (one-hot embeddings need hidden > embedded, the drafter 16 heads of 128 > embedded). bf16, about 5 GB.
Written as DeepseekV3ForCausalLM, as sglang_cpu/ddtree_models.markov_mla, whose structure it scales up.

attn_std sets how often the target follows f. Measured on the CPU in float32 (2026-12-06), teacher-forced on four
random 128-word sequences, as the share of positions whose greedy next token is f(token):
- this target: 0.040 -> 99.6 %, 0.046 -> 93.4 %, 0.050 -> 80.9 %, 0.055 -> 53.9 %, 0.060 -> 36.1 %;
- llama8b on the same measure: 0.024 -> 93.8 %, 0.027 -> 72.1 %, 0.030 -> 47.1 %.
So 0.046 (the default) stands beside llama8b's 0.024 and 0.056 beside its 0.030. The MLP's width does not change it
(its weights are 0), so the measure ran with MLPs of width 64.
"""

from __future__ import annotations

from pathlib import Path

from sglang_cpu.ddtree_models import MarkovShape
from sglang_gpu import markov_targets

DEFAULT_ATTN_STD = 0.046
KV_LORA, NOPE, ROPE, V_DIM = 512, 128, 64, 128


def spec(layers: int = 27, hidden: int = 2048, heads: int = 16, mlp: int = 10944, vocab: int = 102400,
         embedded: int = 1003, draft_heads: int = 16) -> markov_targets.TargetSpec:
    """DeepSeek-V2-Lite's attention shape by default; smaller ones for the CPU test of the writer."""
    from transformers import DeepseekV3Config

    def layer(p, rnd, ones, zeros) -> dict:
        o = rnd(hidden, heads * V_DIM)
        o[hidden - 1] = 0  # the unused dimension (MarkovShape.unused_dim)
        return {p + "self_attn.q_proj.weight": rnd(heads * (NOPE + ROPE), hidden),
                p + "self_attn.kv_a_proj_with_mqa.weight": rnd(KV_LORA + ROPE, hidden),
                p + "self_attn.kv_a_layernorm.weight": ones(KV_LORA),
                p + "self_attn.kv_b_proj.weight": rnd(heads * (NOPE + V_DIM), KV_LORA),
                p + "self_attn.o_proj.weight": o,
                p + "mlp.gate_proj.weight": zeros(mlp, hidden), p + "mlp.up_proj.weight": zeros(mlp, hidden),
                p + "mlp.down_proj.weight": zeros(hidden, mlp), p + "input_layernorm.weight": ones(hidden),
                p + "post_attention_layernorm.weight": ones(hidden)}

    config = DeepseekV3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, moe_intermediate_size=1408,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads, q_lora_rank=None,
        kv_lora_rank=KV_LORA, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V_DIM,
        first_k_dense_replace=layers, n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2, n_group=1,
        topk_group=1, max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16").to_dict()
    config["architectures"] = ["DeepseekV3ForCausalLM"]
    # Fields of DeepSeek's published configs that SGLang's DeepseekV2 model reads and transformers' class omits.
    config.update(moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid", routed_scaling_factor=1.0,
                  norm_topk_prob=True, ep_size=1, num_nextn_predict_layers=0)
    shape = MarkovShape(hidden=hidden, vocab=vocab, embedded=embedded, draft_heads=draft_heads, draft_norm=0.5)
    return markov_targets.TargetSpec(shape=shape, layers=layers, config=config, layer_tensors=layer)


def build(folder: Path, attn_std: float = DEFAULT_ATTN_STD) -> dict:
    """engine_models.build's answer for `mla_lite`."""
    return markov_targets.build(spec(), folder, attn_std)
