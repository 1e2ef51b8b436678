// The online softmax of the tree-verify CTA, shared by every tile loop: the tree mask's visibility of a tile,
// scores into the log2 domain (scale, logit cap, mask), the rows' reference maxima and sums, and the rescale
// of O when a reference moves.
#pragma once

#include "tree_verify_cta.cuh"

namespace kdtree::cuda {

// Visibility of this warp's keys of tile kt (64-column windows from its first key) for each of this thread's
// rows. Returns whether the warp's rows see anything there.
template <class C>
__device__ inline bool TreeVerifyCta<C>::tile_visibility(const RequestInfo& r, int kt,
                                                         const uint32_t* const (&mask_row)[2],
                                                         uint64_t (&vis)[2][kVisWords]) const {
  const int key0 = kt * C::kBlockN + (C::kPairedTiles ? 0 : wn * C::kKeysPerWarp);
  bool any = false;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int w = 0; w < kVisWords; ++w) {
      const uint64_t bits = mask_row[half] == nullptr ? 0ull
                                                      : visible_columns(mask_row[half], p.mask_words,
                                                                        key0 + 64 * w, r.prefix_len, r.kv_len);
      vis[half][w] = bits;
      any |= (C::kKeysPerWarp >= 64 ? bits : (bits & ((1ull << C::kKeysPerWarp) - 1))) != 0;
    }
  return __any_sync(0xffffffffu, any);
}

// Scores of tile kt (s) into unnormalized probabilities: into the log2 domain, the tree mask (on masked
// tiles: `vis`, nothing where the warp sees nothing), and the online-softmax update of the rows' reference
// maxima and sums. `corrections` rescale what O accumulated; returns whether any reference of the warp moved (or, over
// an fp8 cache on the overlap path, O takes v_scale here).
template <class C>
__device__ inline bool TreeVerifyCta<C>::softmax_tile(const RequestInfo& r, int kt, bool masked, bool warp_sees,
                                                      const uint64_t (&vis)[2][kVisWords], float (&s)[NS][4],
                                                      float (&m_run)[2], float (&l_run)[2], float (&corrections)[2]) {
  if constexpr (C::kFp8Overlap)  // draft columns over an fp8 cache whose k_scale is in the score scale
    if (masked) unscale_draft_scores(r, kt, s);
  const float score_scale = scale_and_mask(masked, warp_sees, vis, s);
  float tile_max[2];
  row_max(s, tile_max);
  if constexpr (C::kWarpsN > 1) across_warps(tile_max, -INFINITY, [](float a, float b) { return fmaxf(a, b); });
  float m_new[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) m_new[half] = raised_reference(m_run[half], tile_max[half] * score_scale);
  float sums[2];
  probabilities(score_scale, m_new, s, sums);
  bool rescale = move_reference(m_new, sums, m_run, l_run, corrections);
  if constexpr (C::kFp8Overlap)  // v_scale on the first tile with draft rows (tree_verify_fp8_scales.cuh)
    if (masked) rescale |= scale_cache_columns(r, kt, s, corrections);
  return rescale;
}

// Scores into the log2 domain and the tree mask. Returns the scale still to apply: a positive scale is
// folded into the exponent's FMA instead (the max commutes with it), one instruction per score. Uniform
// branches: each variant is one tight loop.
template <class C>
__device__ inline float TreeVerifyCta<C>::scale_and_mask(bool masked, bool warp_sees,
                                                         const uint64_t (&vis)[2][kVisWords], float (&s)[NS][4]) {
  float score_scale = 1.f;
  if (p.logit_cap > 0.f) {
    const float inner = p.sm_scale / p.logit_cap, outer = p.logit_cap * 1.4426950408889634f;
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = outer * tanhf(s[n][e] * inner);
  } else if (p.scale_log2 > 0.f) {
    score_scale = p.scale_log2;
  } else {
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= p.scale_log2;
  }
  if (masked) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // Bit (n % 8) * 8 + e of mine[n / 8] is this thread's key n * 8 + 2 * (lane % 4) + e of the warp.
      uint64_t mine[kVisWords];
#pragma unroll
      for (int w = 0; w < kVisWords; ++w) mine[w] = warp_sees ? vis[half][w] >> (2 * (lane & 3)) : 0ull;
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (!((mine[n / 8] >> ((n % 8) * 8 + e)) & 1ull)) s[n][2 * half + e] = -INFINITY;
    }
  }
  return score_scale;
}

// The maximum of each of this thread's two rows over the warp's keys of the tile (its quad's).
template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::row_max(const float (&s)[NS][4], float (&tile_max)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    tile_max[half] = mx;
  }
}

// A row's reference maximum moves only when the tile's (m_tile, log2 units) exceeds it by more than 8:
// probabilities up to 2^8 lose nothing in T or in the fp32 sums, and most tiles then rescale nothing.
template <class C>
__device__ __forceinline__ float TreeVerifyCta<C>::raised_reference(float m_ref, float m_tile) {
  return m_tile > m_ref + 8.f ? m_tile : m_ref;
}

// The running reference maxima m_run move to m_new (>= m_run): the sums l_run follow and take `sums`
// (probabilities against m_new); `corrections` rescale what O accumulated. Returns whether any moved.
template <class C>
__device__ __forceinline__ bool TreeVerifyCta<C>::move_reference(const float (&m_new)[2], const float (&sums)[2],
                                                                 float (&m_run)[2], float (&l_run)[2],
                                                                 float (&corrections)[2]) {
  bool rescale = false;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    corrections[half] = fast_exp2(m_run[half] - usable(m_new[half]));  // 0 while m_run saw nothing: zeros
    m_run[half] = m_new[half];
    l_run[half] = l_run[half] * corrections[half] + sums[half];
    rescale |= corrections[half] != 1.f;
  }
  return rescale;
}

// s into probabilities against the reference maxima m_new (a row with nothing visible yet: zeros, no NaN),
// and each row's sum over this thread's columns.
template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::probabilities(float score_scale, const float (&m_new)[2],
                                                                float (&s)[NS][4], float (&sums)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float m_use = usable(m_new[half]);
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = fast_exp2(fmaf(s[n][2 * half + e], score_scale, -m_use));
        s[n][2 * half + e] = pv;
        sum += pv;
      }
    sums[half] = sum;
  }
}

// A reference maximum to subtract: a row with nothing visible yet (-inf) uses 0, so its zeros stay zeros
// and nothing turns NaN.
template <class C>
__device__ __forceinline__ float TreeVerifyCta<C>::usable(float m) {
  return m == -INFINITY ? 0.f : m;
}

// Once the reference maxima settle, most tiles move none of them: the warp then skips rescaling O.
template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::rescale_o(float (&o)[NO][4], const float (&corrections)[2],
                                                            bool rescale) {
  if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        o[n][2 * half] *= corrections[half];
        o[n][2 * half + 1] *= corrections[half];
      }
  }
}

}  // namespace kdtree::cuda
