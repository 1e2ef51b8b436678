// The tile loop that waits for each GEMM where it is issued (run_tiles, one KV tile per compute_tile): the
// portable mma.sync path, and on wgmma Dv 256 (O leaves no registers for a second P tile) and MLA's key split,
// whose P goes through shared memory. The math warps load their own tiles (cp.async, STAGES deep, a CTA
// barrier per tile).
#pragma once

#include "tree_verify_cta.cuh"

namespace kdtree::cuda {

// The KV tiles of a segment, each GEMM waited for where it is issued: STAGES-deep cp.async of whole K/V tiles,
// one CTA barrier per tile (the portable path, and MLA, whose P goes through shared memory).
template <class C>
__device__ inline void TreeVerifyCta<C>::run_tiles(const RequestInfo& r, int h, int m0, int kt0, int kt1,
                                                   float (&o)[NO][4], float (&m_run)[2], float (&l_run)[2],
                                                   const uint32_t* const (&mask_row)[2]) {
  // Row pointers of the first STAGES tiles; later ones are found one iteration ahead.
  stage_first_rows(r, h, kt0, kt1, C::kStages);
  __syncthreads();
  load_q(r, h, m0);
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (kt0 + s < kt1) load_kv(s, v_from_k(r, kt0 + s));
    cp_async_commit();
  }

  for (int kt = kt0; kt < kt1; ++kt) {
    const int stage = (kt - kt0) % C::kStages;
    cp_async_wait<C::kStages - 2>();
    if constexpr (C::kFp8Widen) {  // each thread widens the fp8 rows it copied (fp8_cache.cuh)
      const T* const* k_rows = sKRow + stage * C::kBlockN;
      widen_rows<C::kBlockN, C::kChunksQK, C::kMathThreads>([&](int row) { return k_rows[row]; },
                                                            sK + stage * (C::kBlockN * C::kDqk), tid, p.k_scale);
      if constexpr (C::kVTile) {
        const T* const* v_rows = sVRow + stage * C::kBlockN;
        if (!v_from_k(r, kt))
          widen_rows<C::kBlockN, C::kChunksV, C::kMathThreads>([&](int row) { return v_rows[row]; },
                                                               sV + stage * (C::kBlockN * C::kDv), tid, p.v_scale);
      }
    }
    if constexpr (C::kWgmma) fence_proxy_async();  // wgmma reads the landed tile through the async proxy
    __syncthreads();  // tile kt landed (and widened) for everyone; everyone is done with tile kt - 1
    {
      const int next = kt + C::kStages - 1;
      if (next < kt1) load_kv((next - kt0) % C::kStages, v_from_k(r, next));
      cp_async_commit();
    }
    // The rows of tile kt + STAGES go where tile kt's were (its loads are issued); stored after the compute,
    // so the index read is in flight meanwhile.
    const int ahead = kt + C::kStages;
    KeyRows ahead_rows{nullptr, nullptr};
    if (tid < C::kBlockN && ahead < kt1) ahead_rows = key_rows(r, h, ahead * C::kBlockN + tid);
    compute_tile(r, h, kt, stage, o, m_run, l_run, mask_row);
    if (tid < C::kBlockN) stage_rows(stage * C::kBlockN + tid, ahead_rows);
  }
  cp_async_wait<0>();
}

// One KV tile with each GEMM waited for where it is issued (run_tiles).
template <class C>
template <class During>
__device__ inline void TreeVerifyCta<C>::compute_tile(const RequestInfo& r, int h, int kt, int stage, float (&o)[NO][4],
                                                      float (&m_run)[2], float (&l_run)[2],
                                                      const uint32_t* const (&mask_row)[2], During&& during) {
  stage = __shfl_sync(0xffffffffu, stage, 0);  // warp-uniform for the compiler (see wg)
  const bool masked = tile_masked(r, kt);
  const T* k_tile = sK + stage * (C::kBlockN * C::kDqk);
  const bool v_k = v_from_k(r, kt);
  // Same swizzle either way: V is K's first columns.
  const T* v_tile = v_k || !C::kVTile ? k_tile : sV + stage * (C::kBlockN * C::kDv);

  uint64_t vis[2][kVisWords];
  const bool warp_sees = masked ? tile_visibility(r, kt, mask_row, vis) : true;
  // A fully masked tree tile costs a warp no tensor-core work on the mma.sync path; wgmma is issued by the
  // whole warpgroup, so there every warp computes (the mask then hides what it must).
  const bool skip_tile = !C::kWgmma && !warp_sees;

  float s[NS][4];
#pragma unroll
  for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
  if constexpr (C::kWgmma) {
    issue_qk(k_tile, s);
    during(0);
    wgmma_wait<0>();
  } else if (!skip_tile) {
#pragma unroll
    for (int kk = 0; kk < C::kDqk / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, sQ + swizzle(wm * 16 + (lane & 15), kk * 2 + (lane >> 4), C::kBlockM) * 8);
#pragma unroll
      for (int nj = 0; nj < NS / 2; ++nj) {
        uint32_t b[4];
        const int key = wn * C::kKeysPerWarp + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(b, k_tile + swizzle(key, kk * 2 + ((lane >> 3) & 1), C::kBlockN) * 8);
        mma_16816<T>(s[2 * nj], a, b[0], b[1]);
        mma_16816<T>(s[2 * nj + 1], a, b[2], b[3]);
      }
      if constexpr (NS % 2 == 1) {  // a last single n-tile of 8 keys (8 keys a warp: the 99 KB class's MLA)
        uint32_t b[2];
        const int key = wn * C::kKeysPerWarp + (NS - 1) * 8 + (lane & 7);
        ldmatrix_x2(b, k_tile + swizzle(key, kk * 2 + ((lane >> 3) & 1), C::kBlockN) * 8);
        mma_16816<T>(s[NS - 1], a, b[0], b[1]);
      }
    }
  }
  if constexpr (!C::kWgmma) during(0);

  float corrections[2];
  const bool rescale = softmax_tile(r, kt, masked, warp_sees, vis, s, m_run, l_run, corrections);
  rescale_o(o, corrections, rescale);

  if constexpr (C::kWarpsN == 1) {
    if constexpr (!C::kVTile)
      if (!v_k) load_v_over_k(r, h, kt, sK + stage * (C::kBlockN * C::kDqk));
    if (skip_tile) {  // P is all zeros
      during(1);
      return;
    }
    uint32_t a[C::kBlockN / 16][4];
    p_fragments(s, a);
    if constexpr (C::kWgmma) {
      issue_pv_regs(a, v_tile, o);
      during(1);
      wgmma_wait<0>();
    } else {
#pragma unroll
      for (int kk = 0; kk < C::kBlockN / 16; ++kk) pv_step(a[kk], v_tile, kk, o);
      during(1);
    }
  } else {
    // Share P: the PV phase needs every key of the row group, the S phase split them across warps.
    store_p(s, sP, wn * C::kKeysPerWarp);
    if constexpr (C::kWgmma) fence_proxy_async();  // wgmma reads P through the async proxy
    __syncthreads();
    if constexpr (!C::kVTile)
      if (!v_k) load_v_over_k(r, h, kt, sK + stage * (C::kBlockN * C::kDqk));
    if constexpr (C::kWgmma) {
      issue_pv_smem(sP, v_tile, o);
      during(1);
      wgmma_wait<0>();
    } else {
#pragma unroll
      for (int kk = 0; kk < C::kBlockN / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, sP + swizzle(wm * 16 + (lane & 15), kk * 2 + (lane >> 4), C::kBlockM) * 8);
        pv_step(a, v_tile, kk, o);
      }
      during(1);
    }
  }
}

}  // namespace kdtree::cuda
