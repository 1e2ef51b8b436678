"""DDTree at temperature > 0, lossless: the target's token after every tree node, drawn with position-keyed noise.

`sample_targets` draws, for every node i of request b, the token the target would sample after it:

    target_tokens[b, i] = argmax over kept v of (z_v + g(seed_b, positions[b, i], v)),
    z = logits[b*T + i] / temperature_b,

with g a Gumbel variate keyed by (request seed, absolute position, vocab id) — every node at one depth shares its
position's noise. `accept_greedy` then walks the tree with these tokens exactly as at temperature 0. Along the
accepted path each position's token is the argmax of its own context's filtered logits plus that position's noise:
the token SGLang's seeded sampler draws there, autoregressively. So the round's output is token for token the
target's own seeded sampling (lossless by construction, not only in distribution), and the accepted length is the
most any lossless verification of a fixed tree can reach: whatever the scheme, the token emitted after a node is
distributed as the target's filtered q, so it is one of the node's children with probability exactly q(children) —
the probability with which this walk moves on. (Schemes that beat it, multi-draft rejection sampling, need children
drawn at random from the drafter; DDTree's best-first trees are deterministic.)

The noise is SGLang's own (`multinomial_with_seed` in sglang/srt/layers/sampler.py): murmur_hash32(seed, position, v)
as u = hash / (2^32 - 1), g = -log(-log u). `positions[b, i]` is the absolute position of node i's own token, the
position SGLang's sampler keys a draw with (`forward_batch.positions` in decode: the input token's position; the
drawn token lands at position + 1) — in a verify forward, committed length + depth, the verify batch's positions.
With SGLang's seed, a DDTree request draws what SGLang's deterministic sampler draws without speculation, except
where two candidates' scores tie within float32 rounding (SGLang adds them in float64).

Filtering, exactly as SGLang's seeded (pytorch-backend) sampler `top_k_top_p_min_p_sampling_from_probs_torch`
applies it, in this order:
  1. z = logits / temperature (float32); p = softmax(z);
  2. rank the vocabulary by descending z, ties to the smaller vocab id (SGLang sorts the probabilities descending);
  3. top-k: keep ranks < top_k;
  4. top-p: keep a token while the probability ranked before it is <= top_p — SGLang's `(cumsum - p) > top_p`
     zeroing, on the full softmax (computed before the top-k zeroing, so top-k and top-p are joint, not sequential);
  5. min-p: keep tokens with p >= min_p * p_max (p_max of the full softmax);
  6. draw among the kept tokens proportionally to p (renormalised), here by the Gumbel argmax of z + g.
The most likely token is always kept. All three filters compare against the full softmax, so the order of 3-5
does not change the kept set; what matters is that temperature comes first (top-p of softmax(logits) would keep
another set) and that top-p is not renormalised after top-k (FlashInfer's sequential min-p path does that; it takes
no seed). Masses are summed exactly, as integers in units of 2^-31 of p_max (a token below 2^-31 p_max counts 0
for top-p); the comparison `mass before <= top_p x total` is in float64. (SGLang's float32 cumsum can pass 1 by
rounding and cut a few tail tokens of a top_p = 1 request batched with top_p < 1 ones; here 1 is always off.)
Off values: temperature 0 greedy (plain argmax of the logits, first maximum, no noise), top_k <= 0 or >= V, top_p
1, min_p 0 (SGLang's greedy, temperature 1 with top_k 1, gives the same argmax).

Penalties (repetition, frequency, presence), logit bias and grammar masks are applied by the caller to the logits
before this op, as SGLang does for speculative verification: every node's logits get the penalties of the request's
committed tokens (eagle_utils.py, "a relaxed version of penalties for speculative decoding";
dflash_utils.apply_dflash_verify_logits_adjustments). So with penalties the output is SGLang's own speculative
behaviour, not path-exact: a token accepted at depth 1 is not yet penalised at depth 2.

Capture-safe: the output shape [B, T] comes from positions' shape, parameters are read on the device, no host sync;
one opaque node under torch.compile. SGLang's `SamplingBatchInfo` passes as is: temperatures [B, 1] float32, top_ks
[B] int32, top_ps and min_ps [B] float32, and a seed [B] int64 (`sampling_seed` when deterministic inference is on;
a worker supplies one per request otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .. import build

build.load()

__all__ = ["sample_targets", "target_tokens", "SamplingParams"]

TOP_K_OFF = 1 << 30  # SGLang's TOP_K_ALL: any top_k <= 0 or >= V is off


def sample_targets(logits: torch.Tensor, positions: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor,
                   top_ps: torch.Tensor, min_ps: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """The target's sampled token after every tree node (see the module docstring for the rule).

    Args:
        logits: [B*T, V] float32, bfloat16 or float16 (1 <= V <= 2^22, any row stride): the target's logits after
            each node, request-major, nodes in tree order, penalties already applied.
        positions: [B, T] int64: absolute position of each node's own token (committed length + depth); only the
            low 32 bits key the noise, as in SGLang.
        temperatures: [B] or [B, 1] float32, finite and >= 0; 0 is greedy.
        top_ks: [B] int32 or int64; <= 0 or >= V is off.
        top_ps: [B] float32 in (0, 1]; 1 is off.
        min_ps: [B] float32 in [0, 1]; 0 is off.
        seeds: [B] int64: each request's seed (any value, its two's-complement bits key the noise).

    Returns:
        target_tokens: [B, T] int64, ddtree.accept_greedy's `target_tokens`.

    Value ranges are checked on the CPU always, on CUDA with KDTREE_OPS_DEBUG=1 outside graph capture.
    """
    return torch.ops.kdtree.ddtree_sample_targets.default(logits, positions, temperatures, top_ks, top_ps, min_ps,
                                                          seeds)


def target_tokens(logits: torch.Tensor, positions: torch.Tensor, sampling: "SamplingParams | None") -> torch.Tensor:
    """[B, T] int64: the target's token after each of T rows per request, logits [B*T, V] — its argmax (first
    maximum) when `sampling` is None, else sample_targets' draw, whose noise positions [B, T] (each row's own
    token's position) key. The DDTree loop, its plain decoding and the SGLang worker all choose by it, so both
    sides of a lossless comparison pick alike."""
    if sampling is None:
        return logits.argmax(-1).view(positions.shape)
    return sample_targets(logits, positions, *sampling.astuple())


@dataclass
class SamplingParams:
    """Per-request sampling parameters of one batch, as the op reads them (every field [B], on one device)."""

    temperatures: torch.Tensor  # float32; 0: greedy
    top_ks: torch.Tensor        # int32 or int64; <= 0 or >= V: off
    top_ps: torch.Tensor        # float32; 1: off
    min_ps: torch.Tensor        # float32; 0: off
    seeds: torch.Tensor         # int64

    @classmethod
    def of(cls, requests: list[dict], device="cpu") -> "SamplingParams":
        """From per-request dicts with any of temperature (default 0: greedy), top_k, top_p, min_p, seed (host
        work, once per batch)."""
        def column(name, default, dtype):
            return torch.tensor([r.get(name, default) for r in requests], dtype=dtype, device=device)
        return cls(column("temperature", 0.0, torch.float32), column("top_k", TOP_K_OFF, torch.int32),
                   column("top_p", 1.0, torch.float32), column("min_p", 0.0, torch.float32),
                   column("seed", 0, torch.int64))

    @classmethod
    def from_sglang(cls, sampling_info, seeds: torch.Tensor | None = None) -> "SamplingParams":
        """From SGLang's SamplingBatchInfo, no copy and no host sync. seeds: [B] int64, by default
        `sampling_info.sampling_seed` (set when SGLang runs deterministic inference)."""
        seeds = sampling_info.sampling_seed if seeds is None else seeds
        assert seeds is not None, "SamplingParams.from_sglang: SGLang sets no sampling_seed here; pass seeds"
        return cls(sampling_info.temperatures, sampling_info.top_ks, sampling_info.top_ps, sampling_info.min_ps, seeds)

    def astuple(self) -> tuple[torch.Tensor, ...]:
        """(temperatures, top_ks, top_ps, min_ps, seeds): sample_targets' trailing arguments."""
        return tuple(getattr(self, f.name) for f in fields(self))

    def clone(self) -> "SamplingParams":
        return SamplingParams(*(t.clone() for t in self.astuple()))

    def to(self, device) -> "SamplingParams":
        return SamplingParams(*(t.to(device) for t in self.astuple()))


@torch.library.register_fake("kdtree::ddtree_sample_targets")
def _ddtree_sample_targets_fake(logits, positions, temperatures, top_ks, top_ps, min_ps, seeds):
    torch._check(logits.dim() == 2 and positions.dim() == 2,
                 lambda: "ddtree_sample_targets: logits must be [B*T, V] and positions [B, T]")
    return positions.new_empty(positions.shape, dtype=torch.int64)
