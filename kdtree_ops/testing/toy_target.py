"""A toy target model whose greedy choice keeps a wide margin by construction, for lossless-decoding tests.

In bf16 a near-tie can flip an argmax between a tree forward and a one-token forward without any bug, and a
random-weight model has near-ties somewhere in every long run. This target is the ToyDecoder (so every
forward runs tree_verify_attention over the paged KV cache) with weights set so that its greedy next token is

    next(x_t, x_{t-1}) = 2 * kappa[x_t] + (x_{t-1} mod 2),    kappa: a fixed random map vocab -> vocab / 2,

computed through the model's own layers, with a gap of min(PAIR_LOGIT, 2 PARITY_LOGIT) = 8 logits between the
top two candidates (less what the perturbation below moves). The residual stream holds three things (hidden 128, vocab 64):
  dims [0, V)  the current token, one-hot;   dim V  a constant;   dim V+1  the previous token's parity (±).
Layer 1's queries and keys read only the constant, so after RoPE their scores depend on the relative position
alone; they are set (ROPE_WEIGHTS) to peak at distance 1 by >= 32 (in units of the softmax's exponent) over
every other distance up to MAX_POSITION, so the softmax puts all but ~1e-14 of its weight on the previous
position: in a draft tree, the node's parent. Its values carry the token's parity into dim V+1. The LM head
scores the pair {2 kappa[x_t], 2 kappa[x_t] + 1} with PAIR_LOGIT and adds ±PARITY_LOGIT by parity agreement.
Everything else (layer 1's MLP, all of layer 2, the LM head) also gets random weights at `perturbation` times
the ToyDecoder's own scale, so every logit depends on the whole context through attention; the argmax does
not move while the perturbation stays small against the margin, and `greedy_margin` measures it.

So a wrong tree position, a wrong ancestor mask or a wrong committed K/V row changes the parity read from
the previous position and the next token: a lossless test over this target can fail for those bugs.
"""

from __future__ import annotations

import math

import torch

from .toy_model import ToyConfig, ToyDecoder

TARGET_CONFIG = ToyConfig(vocab_size=64)  # hidden 128, 2 layers, Hq/Hkv 4/2, head dims 64/64, all of q/k rotated
MAX_POSITION = 4096       # the previous-position attention is exact for positions below this
PAIR_LOGIT = 8.0          # logit of the current token's pair of candidates
PARITY_LOGIT = 4.0        # ± by agreement with the previous token's parity: top-1 minus top-2 = 8 logits
SCORE_GAP = 32.0          # the attention's exponent at distance 1 minus its largest at any other distance
# RoPE frequency weights of the query (fraction of |q|^2 on each of the 32 rotation frequencies): half on the
# fastest, half spread over the next 15. Min over distances 0, 2..4096 of sum w_i (1 - cos(d theta_i)) = 0.25,
# computed below; a linear program over all 32 weights reaches only 0.30.
ROPE_WEIGHTS = [0.5] + [0.5 / 15] * 15 + [0.0] * 16
BF16_UNIT_ROUNDOFF = 2.0 ** -8


def margin_target(seed: int = 0, perturbation: float = 0.05) -> tuple[ToyDecoder, torch.Tensor]:
    """The target model (float32, CPU) and its rule: kappa [vocab] int64, next = 2 kappa[x_t] + x_{t-1} % 2.

    perturbation: scale of the random weights added everywhere the rule does not need exact zeros (relative
    to ToyDecoder's own random initialisation).
    """
    c = TARGET_CONFIG
    v, hidden = c.vocab_size, c.hidden
    model = ToyDecoder(c, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    kappa = torch.randint(v // 2, (v,), generator=gen)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(perturbation)
        # Embedding: one-hot token and a constant, both 8 (two nonzero dims: RMSNorm leaves them at 8 when hidden = 128).
        model.embed.weight.zero_()
        model.embed.weight[torch.arange(v), torch.arange(v)] = 8.0
        model.embed.weight[:, v] = 8.0
        normed = 8.0 / math.sqrt(2 * 64 / hidden)  # each of the two nonzero dims after RMSNorm (= 8 here)
        first = model.layers[0]
        u, k0 = _previous_position_query_key(c)
        first.wq.weight.zero_()
        first.wkv.weight.zero_()
        for h in range(c.num_q_heads):
            first.wq.weight[h * c.head_dim_qk:(h + 1) * c.head_dim_qk, v] = u / normed
        parity_sign = (torch.arange(v) % 2) * 2.0 - 1.0  # +1 odd, -1 even
        row = c.head_dim_qk + c.head_dim_v
        for g in range(c.num_kv_heads):
            first.wkv.weight[g * row:g * row + c.head_dim_qk, v] = k0 / normed
            first.wkv.weight[g * row + c.head_dim_qk, :v] = parity_sign * 8.0 / normed  # value dim 0: ±8
        first.wo.weight.zero_()
        first.wo.weight[v + 1, torch.arange(c.num_q_heads) * c.head_dim_v] = 1.0 / c.num_q_heads
        # LM head on the final RMSNorm of (8 one-hot, 8 constant, ±8 parity): each nonzero dim is 8/sqrt(1.5).
        final = 8.0 / math.sqrt(3 * 64 / hidden)
        head = model.lm_head.weight
        head[:, : v + 2] = 0.0
        pair_of = torch.arange(v) // 2
        head[:, :v] = (pair_of[:, None] == kappa[None, :]).float() * PAIR_LOGIT / final
        head[:, v + 1] = parity_sign * PARITY_LOGIT / final
    return model, kappa


def _previous_position_query_key(c: ToyConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Query u and key k0 [head_dim_qk] (RoPE layout: pair (i, i + half)) whose score after RoPE at positions
    m (query) and n (key) is |u|^2 sum_i w_i cos((n + 1 - m) theta_i) * sm_scale: largest at n = m - 1."""
    half = c.rope_dim // 2
    assert c.rope_dim == c.head_dim_qk and len(ROPE_WEIGHTS) == half
    weights = torch.tensor(ROPE_WEIGHTS, dtype=torch.float64)
    theta = c.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2.0 / c.rope_dim)
    distances = torch.cat([torch.tensor([0.0]), torch.arange(2.0, MAX_POSITION + 1)]).to(torch.float64)
    relative_gap = ((1 - torch.cos((distances[:, None] - 1) * theta[None, :])) * weights).sum(-1).min().item()
    sm_scale = 1.0 / math.sqrt(c.head_dim_qk)
    norm_sq = SCORE_GAP / (relative_gap * sm_scale)
    u = torch.zeros(c.head_dim_qk, dtype=torch.float64)
    u[:half] = (weights * norm_sq).sqrt()
    k0 = torch.cat([u[:half] * torch.cos(theta), u[:half] * torch.sin(theta)])  # each pair rotated by +theta_i
    return u.float(), k0.float()


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    """[...] float32: top-1 minus top-2 logit of each row of logits [..., vocab]."""
    top = logits.float().topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def margin_bound(max_abs_logit: float, num_layers: int, unit_roundoff: float = BF16_UNIT_ROUNDOFF) -> float:
    """The top-1 minus top-2 gap above which two forwards of the same tokens that differ only in rounding
    (a tree forward and a one-token forward) cannot pick different argmaxes.

    Each bf16 tensor is within relative `unit_roundoff` (2^-8) of its exact value; fp32 accumulation order
    adds far less. Per layer the residual stream takes about four roundings (attention out, its projection,
    MLP, their sums), plus two for the final norm and LM head, each off by at most u times the magnitudes it
    rounds, which here the logit's own magnitude bounds: one forward's logit is within (4 L + 2) u M of the
    exact one (M = max |logit|), two forwards within twice that, and the gap between two logits moves by at
    most twice that again. So an argmax can flip only where gap < 4 (4 L + 2) u M.
    """
    return 4.0 * (4 * num_layers + 2) * unit_roundoff * max_abs_logit
