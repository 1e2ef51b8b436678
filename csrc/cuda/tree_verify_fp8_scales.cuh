// The fp8 overlap path's scales (tree_verify_config.h, kFp8Overlap). Its T tiles hold the cache's stored values exactly
// (fp8_cache.cuh), so the scales are applied in fp32 where they cost least, as FlashInfer's and FA3's fp8 kernels do:
//   - k_scale in the score scale: the host launches these configurations with sm_scale (and its log2 form) times
//     k_scale (launch_tree_verify), so a cache key's score is (q . k) sm_scale k_scale with no extra instruction;
//   - v_scale in O: O accumulates P times the stored values, and is multiplied by v_scale once, after the segment's
//     last tile (fold_v_scale).
// Draft rows of k_draft/v_draft (q's dtype, unscaled) are the exception, on a request's last tiles only: their scores
// are divided by k_scale before the score scale (unscale_draft_scores); on the request's first tile with draft rows,
// the P of its cache columns is multiplied by v_scale and O so far likewise (scale_cache_columns), so that from there
// on O holds the dequantized sum and fold_v_scale leaves it. Both are fp32 operations on scores and probabilities,
// never a rounding of a stored value: the overlap path's error is at most the widen path's, which rounds every
// dequantized value to T.
#pragma once

#include <climits>

#include "tree_verify_cta.cuh"

namespace kdtree::cuda {

// The first KV tile of request r that holds draft rows of k_draft/v_draft (q's dtype); INT_MAX where none does
// (draft K/V in the cache, or no draft token). Every tile from it to the request's last holds some.
template <class C>
__device__ __forceinline__ int TreeVerifyCta<C>::first_draft_tile(const RequestInfo& r) const {
  return p.k_draft != nullptr && r.prefix_len < r.kv_len ? r.prefix_len / C::kBlockN : INT_MAX;
}

// Scores of tile kt's draft columns (keys >= prefix_len) divided by k_scale, which the score scale then multiplies
// back. This thread's scores: s[n][2 half + e] is key key0 + 8 n + 2 (lane % 4) + e of the tile's keys for this warp.
template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::unscale_draft_scores(const RequestInfo& r, int kt,
                                                                       float (&s)[NS][4]) const {
  if (kt < first_draft_tile(r)) return;
  const float inverse = 1.f / p.k_scale;
  const int key0 = kt * C::kBlockN + (C::kPairedTiles ? 0 : wn * C::kKeysPerWarp) + 2 * (lane & 3);
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (key0 + 8 * n + e >= r.prefix_len) {
        s[n][e] *= inverse;
        s[n][2 + e] *= inverse;
      }
}

// On the request's first tile with draft rows, after its probabilities and the rows' sums: the P of its cache columns
// times v_scale, and O's corrections likewise (O holds the stored values' sum until here). Returns whether O must be
// rescaled.
template <class C>
__device__ __forceinline__ bool TreeVerifyCta<C>::scale_cache_columns(const RequestInfo& r, int kt, float (&s)[NS][4],
                                                                      float (&corrections)[2]) const {
  if (kt != first_draft_tile(r)) return false;
  const float v_scale = p.v_scale;
  const int key0 = kt * C::kBlockN + (C::kPairedTiles ? 0 : wn * C::kKeysPerWarp) + 2 * (lane & 3);
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (key0 + 8 * n + e < r.prefix_len) {
        s[n][e] *= v_scale;
        s[n][2 + e] *= v_scale;
      }
  corrections[0] *= v_scale;
  corrections[1] *= v_scale;
  return true;
}

// After a segment's last tile kt1 - 1: O times v_scale, unless the segment reached the request's draft rows (then
// scale_cache_columns has applied it).
template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::fold_v_scale(const RequestInfo& r, int kt1, float (&o)[NO][4]) const {
  if (kt1 > first_draft_tile(r)) return;
  const float v_scale = p.v_scale;
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] *= v_scale;
}

}  // namespace kdtree::cuda
