"""A tiny random-weight decoder whose attention is `tree_verify_attention` over a paged KV cache.

Each layer is RMSNorm → Q/K/V projection → RoPE at the draft tokens' tree positions → K/V written into the
layer's token-slot pool → tree_verify_attention → output projection → RMSNorm → SwiGLU MLP, as a real
target model runs one DDTree-style verify step: the draft tree's tokens go in, one row of logits per tree
node comes out. `attention="reference"` runs the same weights with attention through the float64 reference
(call it on a float64 copy of the model and cache for an end-to-end reference). Used by examples/demo.py and
compile_tests/test_toy_decoder.py.

Two shapes of attention: GQA (`GQA_CONFIG`: Hq/Hkv heads, separate K and V pools) and MLA-like
(`MLA_CONFIG`: one KV head holding a latent plus a rotary part, and `v_cache = k_cache[..., :Dv]`, a view
of the same pool, as DeepSeek-style models run with absorbed weights).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import ops
from .reference import tree_mask_from_parents_reference, tree_verify_attention_reference
from .. import shapes
from .trees import tree_positions


@dataclass(frozen=True)
class ToyConfig:
    vocab_size: int = 128
    hidden: int = 128
    num_layers: int = 2
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim_qk: int = 64
    head_dim_v: int = 64
    rope_dim: int = 64       # the last rope_dim features of each q/k head are rotated
    mlp_hidden: int = 256
    mla: bool = False        # one KV head; values are the first head_dim_v features of the keys
    rope_theta: float = 10000.0
    eps: float = 1e-6

    def __post_init__(self):
        assert self.num_q_heads % self.num_kv_heads == 0, "num_q_heads must be a multiple of num_kv_heads"
        assert self.rope_dim % 2 == 0 and self.rope_dim <= self.head_dim_qk, "rope_dim: even, <= head_dim_qk"
        assert not self.mla or (self.num_kv_heads == 1 and self.head_dim_v + self.rope_dim <= self.head_dim_qk), \
            "MLA: one KV head whose first head_dim_v features (the values) are not rotated"


# Head dims that the CUDA kernels serve too ((64, 64) and MLA's (576, 512)), so one model runs on both devices.
GQA_CONFIG = ToyConfig()
MLA_CONFIG = ToyConfig(num_q_heads=4, num_kv_heads=1, head_dim_qk=576, head_dim_v=512, rope_dim=64, mla=True)


@dataclass
class PagedKVCache:
    """Per-layer token-slot pools. k[l]: [S, Hkv, Dqk]; v[l]: [S, Hkv, Dv] (MLA: the view k[l][..., :Dv])."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    values_view_keys: bool = False

    @classmethod
    def empty(cls, config: ToyConfig, num_slots: int, dtype=torch.float32, device="cpu") -> "PagedKVCache":
        k = [torch.zeros(num_slots, config.num_kv_heads, config.head_dim_qk, dtype=dtype, device=device)
             for _ in range(config.num_layers)]
        if config.mla:
            return cls(k, [kk[..., : config.head_dim_v] for kk in k], True)
        v = [torch.zeros(num_slots, config.num_kv_heads, config.head_dim_v, dtype=dtype, device=device)
             for _ in range(config.num_layers)]
        return cls(k, v)

    def to(self, dtype=None, device=None) -> "PagedKVCache":
        """A copy in another dtype/device (MLA's value views re-made on the copied pools)."""
        k = [t.to(dtype=dtype, device=device, copy=True) for t in self.k]
        if self.values_view_keys:
            return PagedKVCache(k, [kk[..., : vv.shape[-1]] for kk, vv in zip(k, self.v)], True)
        return PagedKVCache(k, [t.to(dtype=dtype, device=device, copy=True) for t in self.v])


@dataclass
class VerifyBatch:
    """One verify step's inputs for B requests with N = sum T_b tree tokens (plus padding rows).

    input_ids [N] int64; positions [N] int64 (prefix length + depth in the tree); parents [N] int32 (within
    the request, -1 for the root); qo_indptr, kv_indptr [B+1] int32; kv_indices [>= kv_indptr[B]] int32/int64;
    out_cache_loc [N] int64: the slot each token's K/V is written to; mask_words: int32 words per mask row;
    draft_in_cache: whether kv_indices lists the draft slots too (else K/V of the draft go as k_draft/v_draft).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    parents: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    mask_words: int
    draft_in_cache: bool = True
    tree_sizes: list[int] = field(default_factory=list)
    prefix_lens: list[int] = field(default_factory=list)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)}

    def to(self, device) -> "VerifyBatch":
        return dataclasses.replace(self, **{k: v.to(device) for k, v in self.tensors().items()})

    def mark_dynamic(self) -> "VerifyBatch":
        """Marks N, B+1 and len(kv_indices) dynamic for torch.compile (each must be >= 2)."""
        for t in self.tensors().values():
            torch._dynamo.mark_dynamic(t, 0)
        return self

    def copy_(self, other: "VerifyBatch") -> "VerifyBatch":
        """Writes `other` (same padded sizes) into these tensors in place: a CUDA graph's static inputs."""
        assert self.mask_words == other.mask_words and self.draft_in_cache == other.draft_in_cache
        for name, t in self.tensors().items():
            t.copy_(getattr(other, name))
        self.tree_sizes, self.prefix_lens = other.tree_sizes, other.prefix_lens
        return self


def build_verify_batch(tokens: list[list[int]], parents: list[list[int]], prefix_slots: list[list[int]],
                       draft_slots: list[list[int]], *, draft_in_cache: bool = True, mask_words: int | None = None,
                       num_tokens: int | None = None, kv_capacity: int | None = None, pad_slot: int = 0,
                       index_dtype=torch.int32, device="cpu") -> VerifyBatch:
    """Packs B requests' trees into one VerifyBatch.

    num_tokens pads N (rows past qo_indptr[B] are padding: token 0, root, written to `pad_slot`); kv_capacity
    pads kv_indices (a CUDA-graph buffer sized for the largest context). Both default to the exact sizes.
    """
    sizes = [len(t) for t in tokens]
    n = sum(sizes)
    num_tokens = n if num_tokens is None else num_tokens
    assert num_tokens >= n, f"num_tokens={num_tokens} < {n} tree tokens"
    mask_words = shapes.mask_words(max(sizes, default=0)) if mask_words is None else mask_words
    ids, pos, par, loc, kv = [], [], [], [], []
    qo, kvp = [0], [0]
    for tok, parent, prefix, slots in zip(tokens, parents, prefix_slots, draft_slots):
        assert len(tok) == len(parent) == len(slots)
        ids += tok
        pos += tree_positions(parent, len(prefix)).tolist()
        par += parent
        loc += slots
        kv += prefix + (slots if draft_in_cache else [])
        qo.append(qo[-1] + len(tok))
        kvp.append(len(kv))
    pad = num_tokens - n
    kv_capacity = len(kv) if kv_capacity is None else kv_capacity
    assert kv_capacity >= len(kv), f"kv_capacity={kv_capacity} < {len(kv)} slots"
    i32 = dict(dtype=torch.int32, device=device)
    return VerifyBatch(
        input_ids=torch.tensor(ids + [0] * pad, dtype=torch.int64, device=device),
        positions=torch.tensor(pos + [0] * pad, dtype=torch.int64, device=device),
        parents=torch.tensor(par + [-1] * pad, **i32),
        qo_indptr=torch.tensor(qo, **i32),
        kv_indptr=torch.tensor(kvp, **i32),
        kv_indices=torch.tensor(kv + [pad_slot] * (kv_capacity - len(kv)), dtype=index_dtype, device=device),
        out_cache_loc=torch.tensor(loc + [pad_slot] * pad, dtype=torch.int64, device=device),
        mask_words=mask_words,
        draft_in_cache=draft_in_cache,
        tree_sizes=sizes,
        prefix_lens=[len(p) for p in prefix_slots],
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def apply_rope(x: torch.Tensor, positions: torch.Tensor, rope_dim: int, theta: float) -> torch.Tensor:
    """Rotates the last rope_dim features of x [N, H, D] by angles positions × theta^(-2i/rope_dim)."""
    half = rope_dim // 2
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32  # angles in fp32 even for bf16 models
    inv_freq = theta ** (-torch.arange(half, device=x.device, dtype=dtype) * 2.0 / rope_dim)
    angle = positions.to(dtype)[:, None] * inv_freq[None, :]                  # [N, half]
    cos, sin = angle.cos()[:, None, :].to(x.dtype), angle.sin()[:, None, :].to(x.dtype)  # [N, 1, half]
    keep, rot = x[..., : x.shape[-1] - rope_dim], x[..., x.shape[-1] - rope_dim:]
    a, b = rot[..., :half], rot[..., half:]
    return torch.cat([keep, a * cos - b * sin, b * cos + a * sin], dim=-1)


class ToyLayer(nn.Module):
    def __init__(self, config: ToyConfig):
        super().__init__()
        c = config
        self.config = c
        self.attn_norm = nn.Parameter(torch.ones(c.hidden))
        self.mlp_norm = nn.Parameter(torch.ones(c.hidden))
        self.wq = nn.Linear(c.hidden, c.num_q_heads * c.head_dim_qk, bias=False)
        kv_out = c.head_dim_qk if c.mla else c.num_kv_heads * (c.head_dim_qk + c.head_dim_v)
        self.wkv = nn.Linear(c.hidden, kv_out, bias=False)
        self.wo = nn.Linear(c.num_q_heads * c.head_dim_v, c.hidden, bias=False)
        self.w_gate_up = nn.Linear(c.hidden, 2 * c.mlp_hidden, bias=False)
        self.w_down = nn.Linear(c.mlp_hidden, c.hidden, bias=False)

    def forward(self, x: torch.Tensor, batch: VerifyBatch, tree_mask: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, attention: str) -> torch.Tensor:
        c = self.config
        n = x.shape[0]
        h = rms_norm(x, self.attn_norm, c.eps)
        q = self.wq(h).view(n, c.num_q_heads, c.head_dim_qk)
        kv = self.wkv(h)
        if c.mla:
            k = kv.view(n, 1, c.head_dim_qk)
        else:
            k, v = kv.view(n, c.num_kv_heads, c.head_dim_qk + c.head_dim_v).split([c.head_dim_qk, c.head_dim_v], -1)
        q = apply_rope(q, batch.positions, c.rope_dim, c.rope_theta)
        k = apply_rope(k, batch.positions, c.rope_dim, c.rope_theta)
        if c.mla:
            v = k[..., : c.head_dim_v]   # the latent part, unrotated
        # The step writes its draft tokens' K/V into the pools (SGLang's set_kv_buffer), then attends.
        k_cache.index_copy_(0, batch.out_cache_loc, k)
        if not c.mla:  # MLA's v_cache is a view of k_cache: written above
            v_cache.index_copy_(0, batch.out_cache_loc, v)
        draft = {} if batch.draft_in_cache else {"k_draft": k, "v_draft": v}
        attend = ops.tree_verify_attention if attention == "op" else tree_verify_attention_reference
        sm_scale = 1.0 / math.sqrt(c.head_dim_qk)
        a = attend(q, k_cache, v_cache, batch.qo_indptr, batch.kv_indptr, batch.kv_indices, tree_mask, sm_scale,
                   0.0, **draft).to(x.dtype)
        x = x + self.wo(a.reshape(n, c.num_q_heads * c.head_dim_v))
        gate, up = self.w_gate_up(rms_norm(x, self.mlp_norm, c.eps)).chunk(2, dim=-1)
        return x + self.w_down(nn.functional.silu(gate) * up)


class ToyDecoder(nn.Module):
    """Embedding → num_layers ToyLayers → RMSNorm → LM head, with random weights from `seed`."""

    def __init__(self, config: ToyConfig = GQA_CONFIG, seed: int = 0):
        super().__init__()
        self.config = config
        gen = torch.Generator().manual_seed(seed)
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(ToyLayer(config) for _ in range(config.num_layers))
        self.final_norm = nn.Parameter(torch.ones(config.hidden))
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() == 2:  # scaled so that activations and logits stay O(1) through the layers
                    p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
        self.requires_grad_(False)  # inference only: torch.compile then traces no backward

    def hidden_states(self, batch: VerifyBatch, cache: PagedKVCache, attention: str = "op",
                      tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The final-normed hidden state [N, hidden] of every tree token: verify_step without the LM head.

        tree_mask: optional [N, W] int32 packed ancestor mask (e.g. the one a tree builder returned); by default
        it is built from `batch.parents` (by tree_mask_from_parents on the op path).
        """
        if tree_mask is None and attention == "op":
            tree_mask = ops.tree_mask_from_parents(batch.parents, batch.qo_indptr, batch.mask_words)
        elif tree_mask is None:  # the reference path builds its mask without the op's helper too
            tree_mask = tree_mask_from_parents_reference(batch.parents.cpu(), batch.qo_indptr.cpu(),
                                                         batch.mask_words).to(batch.parents.device)
        x = self.embed(batch.input_ids)
        for layer, k_cache, v_cache in zip(self.layers, cache.k, cache.v):
            x = layer(x, batch, tree_mask, k_cache, v_cache, attention)
        return rms_norm(x, self.final_norm, self.config.eps)

    def verify_step(self, batch: VerifyBatch, cache: PagedKVCache, attention: str = "op") -> torch.Tensor:
        """One verify step: logits [N, vocab] of every tree token (rows of padding included).

        attention: "op" (tree_verify_attention) or "reference" (the float64 reference; eager only).
        The tree mask is built once per step from `batch.parents` (by tree_mask_from_parents on the op path).
        """
        return self.lm_head(self.hidden_states(batch, cache, attention))

    forward = verify_step
