// The tile loop of the wgmma path with P in registers (GQA/MHA, Dv <= 128): the PV GEMM of one tile runs on
// the tensor cores during the next tile's softmax, while a gathering warpgroup fills the K/V buffers
// (produce_tiles, tree_verify_loads.cuh) and the two math warpgroups take turns at the tensor cores.
#pragma once

#include "tree_verify_cta.cuh"

namespace kdtree::cuda {

// The KV tiles of a segment on the wgmma path with P in registers, on the math warps. S of tile kt and then
// O += P V of tile kt - 1 are issued together; the softmax of tile kt runs on the CUDA cores while the
// tensor cores still compute that PV GEMM, and O is rescaled after it. The gathering warpgroup fills the
// K and V buffers (produce_tiles): tile t of the CTA (t = tiles_before + kt - kt0) is in buffer t % STAGES
// of each, signalled on full_k / full_v and handed back on empty_k / empty_v once read (K right after its S
// GEMM, so its copies for a later tile start while the softmax runs).
template <class C>
__device__ inline void TreeVerifyCta<C>::run_tiles_overlapped(const RequestInfo& r, int h, int m0, int kt0, int kt1,
                                                              int tiles_before,
                                                              float (&o)[NO][4], float (&m_run)[2], float (&l_run)[2],
                                                              const uint32_t* const (&mask_row)[2]) {
  constexpr int kKTile = C::kBlockN * C::kDqk, kVTileElems = C::kBlockN * C::kDv;
  // The first PV GEMM ("tile kt0 - 1") multiplies zero P by the zero tile: every iteration then issues the
  // same GEMMs (a wgmma behind a branch makes ptxas serialize them all).
  uint32_t p_prev[C::kBlockN / 16][4];  // P of tile kt - 1 (A fragments): its PV GEMM reads them
#pragma unroll
  for (int kk = 0; kk < C::kBlockN / 16; ++kk) p_prev[kk][0] = p_prev[kk][1] = p_prev[kk][2] = p_prev[kk][3] = 0;
  load_q_landed(r, h, m0);

  // Without a zero tile (the fp8 overlap path, whose landing ring takes its room) that GEMM multiplies the zero P by
  // the Q tile, which has V's shape here (BLOCK_M = BLOCK_N, Dqk = Dv) and finite values (padding rows are zeros): the
  // same +0 accumulators, and the K and V buffers go back to the gatherers as before.
  static_assert(C::kZeroBytes > 0 || (C::kBlockM == C::kBlockN && C::kDqk == C::kDv), "Q as the zero-multiplied V");
  const T* v_prev = C::kZeroBytes > 0 ? sZero : sQ;
  for (int kt = kt0; kt < kt1; ++kt) {
    // Warp-uniform for the compiler (see wg): the GEMMs' descriptors then step in uniform registers.
    const int t = __shfl_sync(0xffffffffu, tiles_before + kt - kt0, 0), buf = t % C::kStages;
    uint64_t vis[2][kVisWords];
    const bool masked = tile_masked(r, kt);
    const bool warp_sees = masked ? tile_visibility(r, kt, mask_row, vis) : true;
    const int prev = (t + C::kStages - 1) % C::kStages;  // buffer of tile t - 1
    mbarrier_wait(full_k + buf, phase_parity(t));
    if (kt > kt0) mbarrier_wait(full_v + prev, phase_parity(t - 1));
    float s[NS][4];
    take_tensor_turn();
    issue_qk(sK + buf * kKTile, s);
    issue_pv_regs(p_prev, v_prev, o);
    pass_tensor_turn();

    wgmma_wait<1>();  // S of tile kt
    fence_registers<NS * 4>(&s[0][0]);
    mbarrier_arrive(empty_k + buf);  // K of tile kt is read: its buffer may take the next
    float corrections[2];
    const bool rescale = softmax_tile(r, kt, masked, warp_sees, vis, s, m_run, l_run, corrections);
    // ptxas hoists a wait above independent arithmetic, which would leave no softmax to overlap the PV GEMM
    // with: a barrier that reduces the row sums (every probability) keeps the softmax before the wait.
    barrier_after(l_run[0] + l_run[1]);
    wgmma_wait<0>();
    fence_registers<NO * 4>(&o[0][0]);
    fence_registers<C::kBlockN / 16 * 4>(&p_prev[0][0]);
    if (kt > kt0) mbarrier_arrive(empty_v + prev);
    p_fragments(s, p_prev);  // packed in place once the PV GEMM that read the previous P is done
    rescale_o(o, corrections, rescale);
    v_prev = sV + buf * kVTileElems;
  }
  // PV of the last tile (of zeros by zeros in an empty segment).
  const int t_last = tiles_before + kt1 - 1 - kt0;
  if (kt1 > kt0) mbarrier_wait(full_v + t_last % C::kStages, phase_parity(t_last));
  take_tensor_turn();
  issue_pv_regs(p_prev, v_prev, o);
  pass_tensor_turn();
  wgmma_wait<0>();
  fence_registers<NO * 4>(&o[0][0]);
  if (kt1 > kt0) mbarrier_arrive(empty_v + t_last % C::kStages);
}

}  // namespace kdtree::cuda
