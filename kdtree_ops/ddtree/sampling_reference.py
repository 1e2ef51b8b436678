"""The sampled draw of ddtree_sample_targets in plain torch, operation for operation (csrc/ddtree_sample_math.h), so
the op's CPU and CUDA results can be compared with it bit for bit; and the pieces the losslessness tests recombine
into deliberately wrong variants (compile_tests/test_ddtree_sampling_lossless.py).

Every float32 step is one torch operation between float32 tensors (a single correctly rounded result, as in the
op). One trap: `scalar / tensor` is computed by torch as reciprocal-then-multiply (two roundings), so divisions here
always divide a tensor by a tensor or by a scalar. The kept set is found over the whole vocabulary by a stable sort
(the op finds the same prefix among the tokens that can win, by a sort on the CPU and a radix select on CUDA).
"""

from __future__ import annotations

import torch

__all__ = ["noise_hash", "gumbel_from_hash", "gumbel_noise", "exp_nonpositive", "scaled_logits", "kept_mask",
           "draw", "sample_targets_reference"]

_M32 = 0xFFFFFFFF
GUMBEL_MAX = 22.5  # kGumbelMax: above every noise value


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2^32 for int64 a, c in [0, 2^32): two 16-bit halves of c keep every product below 2^48."""
    return (a * (c & 0xFFFF) + (((a * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) & _M32) | (x >> (32 - r))


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _mul32(k, 0xCC9E2D51)
    k = _rotl32(k, 15)
    k = _mul32(k, 0x1B873593)
    h = _rotl32(h ^ k, 13)
    return (_mul32(h, 5) + 0xE6546B64) & _M32


def noise_hash(seeds: torch.Tensor, positions: torch.Tensor, vocab_ids: torch.Tensor) -> torch.Tensor:
    """SGLang's murmur_hash32 of broadcastable int64 seeds, positions (low 32 bits) and vocab ids: int64 values in
    [0, 2^32)."""
    seeds, positions, vocab_ids = torch.broadcast_tensors(seeds.long(), positions.long(), vocab_ids.long())
    h = torch.zeros_like(seeds)
    h = _mix(h, seeds & _M32)
    h = _mix(h, (seeds >> 32) & _M32)  # arithmetic shift, then the low 32 bits: the unsigned high word
    h = _mix(h, positions & _M32)
    h = _mix(h, vocab_ids & _M32)
    h = h ^ 16
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


_LG1, _LG2, _LG3, _LG4 = (float.fromhex(x) for x in ("0x1.555554p-1", "0x1.999c26p-2", "0x1.23d3dcp-2",
                                                      "0x1.f13c4cp-3"))
_LN2_HI_LOG, _LN2_LO_LOG = float.fromhex("0x1.62e3p-1"), float.fromhex("0x1.2fefa2p-17")
_LN2_HI_EXP, _LN2_LO_EXP = float.fromhex("0x1.62e4p-1"), float.fromhex("0x1.7f7d1cp-20")
_INV_LN2 = float.fromhex("0x1.715476p+0")
_EXP_TAYLOR = [float.fromhex(x) for x in ("0x1.a01a02p-13", "0x1.6c16c2p-10", "0x1.111112p-7", "0x1.555556p-5",
                                          "0x1.555556p-3")] + [0.5, 1.0, 1.0]


def _log1p_reduced(f: torch.Tensor) -> torch.Tensor:
    s = f / (f + 2.0)
    z = s * s
    w = z * z
    t1 = w * (w * _LG4 + _LG2)
    t2 = z * (w * _LG3 + _LG1)
    hfsq = (f * 0.5) * f
    return f - (hfsq - s * (hfsq + (t2 + t1)))


def _log_positive(x: torch.Tensor) -> torch.Tensor:
    bits = x.view(torch.int32).long()
    mantissa = bits & 0x7FFFFF
    big = mantissa > 0x3504F3
    k = (bits >> 23) - 127 + big.long()
    m = (mantissa | torch.where(big, 0x3F000000, 0x3F800000)).to(torch.int32).view(torch.float32)
    kf = k.float()
    return kf * _LN2_HI_LOG + (_log1p_reduced(m - 1.0) + kf * _LN2_LO_LOG)


def exp_nonpositive(d: torch.Tensor) -> torch.Tensor:
    """e^d for float32 d <= 0, 0 below -87 (and for NaN)."""
    valid = d >= -87.0
    d = torch.where(valid, d, torch.zeros_like(d))
    k = (d * _INV_LN2 - 0.5).to(torch.int32)  # truncation
    kf = k.float()
    r = (d - kf * _LN2_HI_EXP) - kf * _LN2_LO_EXP
    p = torch.full_like(r, _EXP_TAYLOR[0])
    for c in _EXP_TAYLOR[1:]:
        p = r * p + c
    scale = ((k + 127) << 23).view(torch.float32)
    return torch.where(valid, p * scale, torch.zeros_like(p))


def gumbel_from_hash(h: torch.Tensor) -> torch.Tensor:
    """float32 g = -log(-log u), u = h / (2^32 - 1), -log u >= 2^-32 (int64 h in [0, 2^32))."""
    low = h < 0xC0000000
    hf = h.clamp_min(1).float()
    e_low = _log_positive(torch.div(torch.full_like(hf, 4294967296.0), hf))
    a = ((_M32 - h).clamp_min(0)).float() * float.fromhex("0x1p-32")
    e_high = -_log1p_reduced(-torch.where(low, torch.zeros_like(a), a))
    e = torch.where(low, e_low, e_high)
    e = torch.where(e >= float.fromhex("0x1p-32"), e, torch.full_like(e, float.fromhex("0x1p-32")))
    g = -_log_positive(e)
    return torch.where(h == 0, torch.full_like(g, float.fromhex("-0x1.62e43p+9")), g)


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, V] float32 noise of rows with seeds [R] and positions [R]."""
    ids = torch.arange(vocab, device=seeds.device)
    return gumbel_from_hash(noise_hash(seeds[:, None], positions[:, None], ids[None, :]))


def _order_key(x: torch.Tensor) -> torch.Tensor:
    """ddtree_score_key as int64: order-preserving, -0 and +0 equal."""
    bits = x.view(torch.int32).long() & _M32
    bits = torch.where(bits == 0x80000000, 0, bits)
    return torch.where(bits >= 0x80000000, _M32 - bits, bits | 0x80000000)


def _greedy(temperatures: torch.Tensor) -> torch.Tensor:
    return ~(temperatures > 0)


def scaled_logits(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """[R, V] float32 z = logits / temperature per row (temperatures [R]); greedy rows keep their logits."""
    logits = logits.float()
    greedy = _greedy(temperatures)
    safe = torch.where(greedy, torch.ones_like(temperatures), temperatures)
    return torch.where(greedy[:, None], logits, logits / safe[:, None])


def kept_mask(z: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, min_ps: torch.Tensor) -> torch.Tensor:
    """[R, V] bool: SGLang's kept set of each row of scaled logits z (the op's rules: joint top-k and top-p over the
    full softmax, ranks by descending z with ties to the smaller id, min-p against p_max, rank 0 always kept)."""
    rows, vocab = z.shape
    order = torch.sort(_order_key(z), dim=1, descending=True, stable=True).indices    # rank -> vocab id
    z_top = z.gather(1, order[:, :1])
    e = exp_nonpositive(z - z_top)
    mass = (e * float.fromhex("0x1p31")).to(torch.int64)
    mass_sorted = mass.gather(1, order)
    before = mass_sorted.cumsum(1) - mass_sorted                                       # exact integers
    top_k_on = (top_ks > 0) & (top_ks < vocab)
    top_p_on = top_ps < 1
    limit = (top_ps.double() * mass.sum(1).double()).clamp_min(0)
    ranks = torch.arange(vocab, device=z.device)
    keep_sorted = torch.where(top_k_on[:, None], ranks[None, :] < top_ks[:, None].long(), True)
    keep_sorted &= torch.where(top_p_on[:, None], before.double() <= limit[:, None], True)
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    min_p_on = min_ps > 0
    keep &= torch.where(min_p_on[:, None], e >= min_ps[:, None], True)
    return keep.scatter(1, order[:, :1], True)


def draw(z: torch.Tensor, keep: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """[R] int64: the kept token with the largest z + noise, ties to the smaller id."""
    vocab = z.shape[1]
    key = _order_key(z + noise) * (1 << 22) + (vocab - 1 - torch.arange(vocab, device=z.device))
    return torch.where(keep, key, torch.full_like(key, -1)).argmax(1)


def sample_targets_reference(logits: torch.Tensor, positions: torch.Tensor, temperatures: torch.Tensor,
                             top_ks: torch.Tensor, top_ps: torch.Tensor, min_ps: torch.Tensor,
                             seeds: torch.Tensor) -> torch.Tensor:
    """ddtree_sample_targets; same arguments and result (kdtree_ops.ddtree.sampling.sample_targets)."""
    batch, nodes = positions.shape
    per_row = lambda t: t.reshape(batch).repeat_interleave(nodes)  # noqa: E731  [B] -> [B*T]
    temperatures, top_ks, top_ps, min_ps, seeds = map(per_row, (temperatures, top_ks, top_ps, min_ps, seeds))
    z = scaled_logits(logits, temperatures)
    greedy_token = draw(z, torch.ones_like(z, dtype=torch.bool), torch.zeros_like(z))
    sampled = draw(z, kept_mask(z, top_ks, top_ps, min_ps), gumbel_noise(seeds, positions.reshape(-1), z.shape[1]))
    return torch.where(_greedy(temperatures), greedy_token, sampled).view(batch, nodes)
