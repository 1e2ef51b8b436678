"""A Llama-3-8B-shaped markov target and its drafts, written on the GPU machine (TEST ONLY; markov_targets.py).

The shape of Llama-3-8B (32 layers, hidden 4096, 32/8 heads of 128, MLP 14336, vocabulary 128,256, RoPE theta
500,000; bf16, 16 GB), its words the first 3,000 ids. The lm_head is the real size: a large part of a step, as in the
model it stands for. attn_std sets how often the target follows f (measured on the CPU in float32, greedy
continuations of the suite's prompts, 2026-12-05): 0.020 -> 100 %, 0.024 -> 89 %, 0.027 -> 68 %, 0.030 -> 34 %;
the suite's default is 0.027. Writing the target takes about 15 s on the H100 machine.
"""

from __future__ import annotations

from pathlib import Path

from sglang_cpu.ddtree_models import MarkovShape
from sglang_gpu import markov_targets

DEFAULT_ATTN_STD = 0.027


def spec(layers: int = 32, hidden: int = 4096, heads: int = 32, kv_heads: int = 8, mlp: int = 14336,
         vocab: int = 128256, embedded: int = 3003, draft_heads: int = 32) -> markov_targets.TargetSpec:
    """Llama-3-8B's shape by default; smaller ones for the CPU test of the writer."""
    head_dim = 128

    def layer(p, rnd, ones, zeros) -> dict:
        o = rnd(hidden, heads * head_dim)
        o[hidden - 1] = 0  # the unused dimension (MarkovShape.unused_dim)
        return {p + "self_attn.q_proj.weight": rnd(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": rnd(kv_heads * head_dim, hidden),
                p + "self_attn.v_proj.weight": rnd(kv_heads * head_dim, hidden), p + "self_attn.o_proj.weight": o,
                p + "mlp.gate_proj.weight": zeros(mlp, hidden), p + "mlp.up_proj.weight": zeros(mlp, hidden),
                p + "mlp.down_proj.weight": zeros(hidden, mlp), p + "input_layernorm.weight": ones(hidden),
                p + "post_attention_layernorm.weight": ones(hidden)}

    config = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab, hidden_size=hidden,
                  intermediate_size=mlp, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=8192, rms_norm_eps=1e-5,
                  rope_theta=500000.0, hidden_act="silu", tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                  torch_dtype="bfloat16")
    shape = MarkovShape(hidden=hidden, vocab=vocab, embedded=embedded, draft_heads=draft_heads, draft_norm=0.5)
    return markov_targets.TargetSpec(shape=shape, layers=layers, config=config, layer_tensors=layer)


SPEC = spec()


def build(folder: Path, attn_std: float = DEFAULT_ATTN_STD) -> dict:
    """engine_models.build's answer for `llama8b`."""
    return markov_targets.build(SPEC, folder, attn_std)
