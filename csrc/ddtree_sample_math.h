// The arithmetic of ddtree_sample_targets, in one place for the CPU and CUDA implementations (and mirrored op for op
// by the torch reference, kdtree_ops/ddtree/sampling_reference.py), so that both devices draw the same token:
//
//   - the noise: SGLang's murmur_hash32(seed, position, vocab id) (sglang/kernels/ops/sampling/murmur_hash.py, the
//     hash its seeded sampler `multinomial_with_seed` uses), turned into a Gumbel variate g = -log(-log u),
//     u = hash / (2^32 - 1), -log u clamped to >= 2^-32 as SGLang clamps it;
//   - log and exp of our own, from float32 additions, subtractions, multiplications and divisions only. Those four
//     are correctly rounded on both devices (no fast-math anywhere in the build), so each result is the same bits on
//     both. The device versions call the _rn intrinsics, which nvcc never fuses into an FMA (it would fuse a * b + c
//     written out: --fmad is on by default), and every host operation is its own expression, so no compiler
//     contracts it either. libm's and CUDA's logf/expf are accurate but not correctly rounded, and not alike.
//   - probability masses as integers: e = exp(z - z_max) in [0, 1] counts floor(e * 2^31) units, so a sum of masses
//     is the same in any order (the CPU's loop, the GPU's atomics and tree reductions).
// The filters (SGLang's order and semantics) are in sample_filters below; the kept set and the draw are described in
// kdtree_ops/ddtree/sampling.py.
#pragma once

#include <cstdint>
#include <cstring>

#include "ddtree_order.h"  // KDTREE_HD, ddtree_score_key (order-preserving float key; -0 and +0 share one)

namespace kdtree::sample {

// ---- float32 operations, each correctly rounded, never contracted ------------------------------------------------
KDTREE_HD float f_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KDTREE_HD float f_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
KDTREE_HD float f_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KDTREE_HD float f_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
KDTREE_HD float u32_to_float(uint32_t x) {  // round to nearest
#if defined(__CUDA_ARCH__)
  return __uint2float_rn(x);
#else
  return static_cast<float>(x);
#endif
}
KDTREE_HD uint32_t float_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}
KDTREE_HD float bits_float(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// ---- SGLang's murmur_hash32 of (seed, position, vocab id) --------------------------------------------------------
KDTREE_HD uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }
KDTREE_HD uint32_t murmur3_mix(uint32_t h, uint32_t k) {
  k *= 0xCC9E2D51u;
  k = rotl32(k, 15);
  k *= 0x1B873593u;
  h ^= k;
  h = rotl32(h, 13);
  return h * 5u + 0xE6546B64u;
}
KDTREE_HD uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}
// seed: the request's int64 seed as its two's-complement bits; position: its low 32 bits (SGLang's casts).
KDTREE_HD uint32_t noise_hash(uint64_t seed, uint32_t position, uint32_t vocab_id) {
  uint32_t h = 0;
  h = murmur3_mix(h, static_cast<uint32_t>(seed));
  h = murmur3_mix(h, static_cast<uint32_t>(seed >> 32));
  h = murmur3_mix(h, position);
  h = murmur3_mix(h, vocab_id);
  return fmix32(h ^ 16u);
}

// ---- log and exp from the four operations ------------------------------------------------------------------------
// log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1]: FreeBSD's logf kernel (s = f / (2 + f), a degree-8 polynomial in
// s, error below 2^-34 before rounding).
constexpr float kLg1 = 0x1.555554p-1f, kLg2 = 0x1.999c26p-2f, kLg3 = 0x1.23d3dcp-2f, kLg4 = 0x1.f13c4cp-3f;
KDTREE_HD float log1p_reduced(float f) {
  const float s = f_div(f, f_add(2.0f, f));
  const float z = f_mul(s, s);
  const float w = f_mul(z, z);
  const float t1 = f_mul(w, f_add(kLg2, f_mul(w, kLg4)));
  const float t2 = f_mul(z, f_add(kLg1, f_mul(w, kLg3)));
  const float hfsq = f_mul(f_mul(0.5f, f), f);
  return f_sub(f, f_sub(hfsq, f_mul(s, f_add(hfsq, f_add(t2, t1)))));
}
// ln 2 split so that k * hi is exact for |k| < 2^7 (hi has 17 significant bits).
constexpr float kLn2HiLog = 0x1.62e3p-1f, kLn2LoLog = 0x1.2fefa2p-17f;
// log x for a normal, positive, finite x: x = 2^k m with m in [sqrt(1/2), sqrt(2)), log x = k ln 2 + log(1 + (m - 1)).
KDTREE_HD float log_positive(float x) {
  const uint32_t bits = float_bits(x);
  int k = static_cast<int>(bits >> 23) - 127;
  uint32_t mantissa = bits & 0x7FFFFFu;
  uint32_t m_bits = mantissa | 0x3F800000u;  // m in [1, 2)
  if (mantissa > 0x3504F3u) {                // m > sqrt(2): use m / 2 in [sqrt(1/2), 1)
    m_bits = mantissa | 0x3F000000u;
    k += 1;
  }
  const float f = f_sub(bits_float(m_bits), 1.0f);  // exact
  const float kf = static_cast<float>(k);
  return f_add(f_mul(kf, kLn2HiLog), f_add(log1p_reduced(f), f_mul(kf, kLn2LoLog)));
}

// ln 2 split so that k * hi is exact for |k| < 2^9 (hi has 15 significant bits).
constexpr float kLn2HiExp = 0x1.62e4p-1f, kLn2LoExp = 0x1.7f7d1cp-20f, kInvLn2 = 0x1.715476p+0f;
// e^d for d <= 0, 0 for d < -87 (and NaN): the result stays a normal float32 (no subnormal: a CPU with flush-to-zero
// set, torch.set_flush_denormal, would round those differently). d = k ln 2 + r, |r| <= ln 2 / 2, e^r by its Taylor
// polynomial of degree 7 (truncation below 2^-27), times 2^k from the exponent bits.
KDTREE_HD float exp_nonpositive(float d) {
  if (!(d >= -87.0f)) return 0.0f;
  const int k = static_cast<int>(f_sub(f_mul(d, kInvLn2), 0.5f));  // truncation of t - 1/2, t <= 0: t rounded
  const float kf = static_cast<float>(k);
  const float r = f_sub(f_sub(d, f_mul(kf, kLn2HiExp)), f_mul(kf, kLn2LoExp));
  float p = 0x1.a01a02p-13f;  // 1/7!
  p = f_add(0x1.6c16c2p-10f, f_mul(r, p));
  p = f_add(0x1.111112p-7f, f_mul(r, p));
  p = f_add(0x1.555556p-5f, f_mul(r, p));
  p = f_add(0x1.555556p-3f, f_mul(r, p));
  p = f_add(0.5f, f_mul(r, p));
  p = f_add(1.0f, f_mul(r, p));
  p = f_add(1.0f, f_mul(r, p));  // d = 0: exactly 1
  return f_mul(p, bits_float(static_cast<uint32_t>(k + 127) << 23));
}

// ---- the noise ---------------------------------------------------------------------------------------------------
// Every value gumbel_from_hash returns is below this (its largest is 32 ln 2 = 22.1807, at the 2^-32 clamp): a token
// with z + kGumbelMax below a drawn score cannot win, and needs no noise.
constexpr float kGumbelMax = 22.5f;
constexpr float kTwoPowMinus32 = 0x1p-32f;

// g = -log(-log u), u = h / (2^32 - 1), -log u clamped to >= 2^-32 (SGLang's clamp; h = 0 gives SGLang's value for
// -log u = DBL_MAX, -709.78). -log u is computed where it keeps its precision: as log(2^32 / h) for u < 3/4 and as
// -log(1 - a), a = (2^32 - 1 - h) 2^-32 = 1 - u (to 2^-32), for u >= 3/4.
KDTREE_HD float gumbel_from_hash(uint32_t h) {
  if (h == 0u) return -0x1.62e43p+9f;
  float e;
  if (h < 0xC0000000u) {
    e = log_positive(f_div(4294967296.0f, u32_to_float(h)));  // 2^32 / h in (4/3, 2^32]
  } else {
    const float a = f_mul(u32_to_float(0xFFFFFFFFu - h), kTwoPowMinus32);  // in [0, 1/4]
    e = -log1p_reduced(-a);
  }
  if (!(e >= kTwoPowMinus32)) e = kTwoPowMinus32;
  return -log_positive(e);
}

KDTREE_HD float gumbel_noise(uint64_t seed, uint32_t position, uint32_t vocab_id) {
  return gumbel_from_hash(noise_hash(seed, position, vocab_id));
}

// ---- the filters -------------------------------------------------------------------------------------------------
// One request's parameters as the draw reads them. SGLang's conventions: temperature 0 (or <= 0, NaN) is greedy, a
// plain argmax of the logits; top_k <= 0 or >= V is off (SGLang's "all" is 2^30); top_p >= 1 is off; min_p <= 0 is
// off. Greedy requests in SGLang arrive as temperature 1, top_k 1: the same argmax through the top-k rule.
struct SampleFilters {
  bool greedy;
  bool top_k, top_p, min_p;  // which filters are on
  uint64_t rank_limit;       // top_k when on, else V: a token is kept only if its rank is below it
  float top_p_value, min_p_value;
};

KDTREE_HD SampleFilters sample_filters(float temperature, int64_t top_k, float top_p, float min_p, int64_t vocab) {
  SampleFilters f;
  f.greedy = !(temperature > 0.0f);
  f.top_k = top_k > 0 && top_k < vocab;
  f.top_p = top_p < 1.0f;  // NaN: off
  f.min_p = min_p > 0.0f;  // NaN: off
  f.rank_limit = static_cast<uint64_t>(f.top_k ? top_k : vocab);
  f.top_p_value = top_p;
  f.min_p_value = min_p;
  return f;
}

// The scaled logit z = logit / temperature (the logit itself for greedy rows), SGLang's logits.div_(temperatures).
KDTREE_HD float scaled_logit(float logit, float temperature, bool greedy) {
  return greedy ? logit : f_div(logit, temperature);
}

// Rank order: descending z, ties to the smaller vocab id (a stable descending sort). Keys are distinct per row.
KDTREE_HD uint64_t rank_key(float z, uint32_t vocab_id, uint32_t vocab) {
  return (static_cast<uint64_t>(ddtree_score_key(z)) << 32) | (vocab - 1u - vocab_id);
}
KDTREE_HD uint32_t rank_key_id(uint64_t key, uint32_t vocab) { return vocab - 1u - static_cast<uint32_t>(key); }

// A token's probability relative to the most likely one, e = exp(z - z_max), and its mass in units of 2^-31 of it.
KDTREE_HD float relative_prob(float z, float z_max) { return exp_nonpositive(f_sub(z, z_max)); }
KDTREE_HD uint32_t mass_units(float e) {  // e in [0, 1]: floor(e 2^31) <= 2^31, exact scaling, then truncation
#if defined(__CUDA_ARCH__)
  return __float2uint_rz(f_mul(e, 0x1p31f));
#else
  return static_cast<uint32_t>(f_mul(e, 0x1p31f));
#endif
}
// Top-p keeps a token while the mass ranked before it is at most top_p times the row's total; never below 0, so
// the most likely token always stays. Masses below 2^53 (V <= 2^22) are exact doubles; the product rounds once.
KDTREE_HD double top_p_limit(float top_p, uint64_t total_mass) {
  const double limit = static_cast<double>(top_p) * static_cast<double>(total_mass);
  return limit > 0.0 ? limit : 0.0;
}

// Can a token of scaled logit z still beat `bound`, the drawn score of a token already known to be kept? Float
// addition is monotone, so z + g <= z + kGumbelMax < bound for every noise g when this says no.
KDTREE_HD bool may_win(float z, float bound) { return f_add(z, kGumbelMax) >= bound; }

// The draw's order: a larger noisy score z + g wins, ties to the smaller vocab id.
KDTREE_HD uint64_t draw_key(float score, uint32_t vocab_id, uint32_t vocab) { return rank_key(score, vocab_id, vocab); }

}  // namespace kdtree::sample
