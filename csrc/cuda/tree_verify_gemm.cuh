// The two GEMMs of the tree-verify CTA, S = Q Kᵀ and O += P V, as the tile loops issue them: wgmma (sm_90a)
// with descriptors stepped by constants, or mma.sync m16n8k16 from ldmatrix fragments (pv_step; S's mma.sync
// loop is in compute_tile); and P into the PV GEMM's A operand, in registers or in shared memory.
#pragma once

#include "tree_verify_cta.cuh"

namespace kdtree::cuda {

// P as A fragments of the PV GEMM: the S accumulator layout, rounded to T.
template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::p_fragments(const float (&s)[NS][4],
                                                              uint32_t (&a)[C::kBlockN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < C::kBlockN / 16; ++kk) {
    a[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// This warp's P (s, its keys from column key0) into p_tile: BLOCK_M rows, swizzled K-major like Q (the A
// operand of issue_pv_smem).
template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::store_p(const float (&s)[NS][4], T* p_tile, int key0) {
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = wm * 16 + (lane >> 2) + 8 * half;
      const int col = key0 + n * 8 + 2 * (lane & 3);
      *reinterpret_cast<uint32_t*>(p_tile + swizzle(row, col / 8, C::kBlockM) * 8 + col % 8) =
          pack2<T>(s[n][2 * half], s[n][2 * half + 1]);
    }
}

// S = Q Kᵀ: Q and K both K-major (rows of Dqk). Overwrites s.
template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::issue_qk(const T* k_tile, float (&s)[NS][4]) {
  const uint64_t q_desc = smem_desc(sQ + wg_row0 * 64, 16, kGroupBytes);
  const uint64_t k_desc = smem_desc(k_tile + (C::kPairedTiles ? 0 : wg_n) * C::kKeysPerWarp * 64, 16, kGroupBytes);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < C::kDqk / 16; ++kk)
    Wgmma<C::kKeysPerWarp>::template ss<kBf16, 0>(&s[0][0], q_desc + k_major_step(kk, C::kBlockM),
                                                  k_desc + k_major_step(kk, C::kBlockN), kk > 0);
  wgmma_commit();
}

// V as the N-major B operand: this warpgroup's Dv columns (64-column blocks C::kBlockN rows apart), 16 keys
// (2 groups of 8 rows) per k-slice.
template <class C>
__device__ __forceinline__ uint64_t TreeVerifyCta<C>::v_desc(const T* v_tile) const {
  return smem_desc(v_tile + (wg_n * C::kDvPerWarp / 64) * C::kBlockN * 64, C::kBlockN * 128, kGroupBytes);
}

// O += P V with P in registers (WARPS_N = 1).
template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::issue_pv_regs(const uint32_t (&a)[C::kBlockN / 16][4],
                                                                const T* v_tile, float (&o)[NO][4]) {
  // Warp-uniform for the compiler (see wg). Without it, ptxas may keep the descriptor of this loop-carried
  // pointer in ordinary registers and move it to uniform ones before each wgmma (G2 91 -> 94, G5 85 -> 88 us
  // after an unrelated change to load_q).
  const uint64_t desc = __shfl_sync(0xffffffffu, v_desc(v_tile), 0);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < C::kBlockN / 16; ++kk)
    Wgmma<C::kDvPerWarp>::template rs<kBf16, 1>(&o[0][0], a[kk], desc + v_step(kk), 1);
  wgmma_commit();
}

// O += P V with P shared through shared memory (WARPS_N > 1; p_tile: BLOCK_M rows, K-major like Q).
template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::issue_pv_smem(const T* p_tile, const T* v_tile, float (&o)[NO][4]) {
  const uint64_t p_desc = smem_desc(p_tile + wg_row0 * 64, 16, kGroupBytes);
  const uint64_t desc = v_desc(v_tile);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < C::kBlockN / 16; ++kk)
    Wgmma<C::kDvPerWarp>::template ss<kBf16, 1>(&o[0][0], p_desc + k_major_step(kk, C::kBlockM),
                                                desc + v_step(kk), 1);
  wgmma_commit();
}

// O[:, this warp's Dv columns] += P[:, keys kk*16 .. +16] V[keys, columns].
template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::pv_step(const uint32_t (&a)[4], const T* v_tile, int kk,
                                                          float (&o)[NO][4]) {
#pragma unroll
  for (int nd = 0; nd < NO / 2; ++nd) {
    uint32_t b[4];
    const int key = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
    const int chunk = (wn * C::kDvPerWarp + nd * 16) / 8 + (lane >> 4);
    ldmatrix_x4_trans(b, v_tile + swizzle(key, chunk, C::kBlockN) * 8);
    mma_16816<T>(o[2 * nd], a, b[0], b[1]);
    mma_16816<T>(o[2 * nd + 1], a, b[2], b[3]);
  }
}

}  // namespace kdtree::cuda
