// The tile loop of the configurations whose math warps load their own tiles (run_tiles: the portable mma.sync path,
// wgmma Dqk 256 and MLA's key split) over the fp8 overlap path (tree_verify_config.h): each tile lands in the fp8
// landing ring two tiles ahead, and the math warps convert tile kt + 1 into the other T stage while the tensor cores
// compute tile kt's GEMMs (S's while the K tile converts, PV's while the V tile does). The widen path instead widens
// each tile in place between its landing and the barrier the GEMMs wait for, with no math to hide behind.
#pragma once

#include "tree_verify_fp8_ring.cuh"
#include "tree_verify_mainloop.cuh"

namespace kdtree::cuda {

// The KV tiles of a segment over the fp8 overlap path. Tile kt (the segment's i-th, i = kt - kt0) uses T stage i % 2,
// landing slot i % 2 and row-pointer slot i % 2. Each iteration, after the barrier that made tile kt's T stage whole:
// the copies of tile kt + 2 go into landing slot i % 2 (tile kt's, converted before that barrier), one group; the
// wait for all but that group finds tile kt + 1's copies landed; compute_tile(kt) converts tile kt + 1 into T stage
// 1 - i % 2 (read last by tile kt - 1, before the barrier) during its GEMMs; the row pointers of tile kt + 3 go into
// slot 1 - i % 2 (read by tile kt + 1's copies, an iteration ago). Each thread converts the chunks it copied, so no
// barrier separates landing and conversion; the barrier that ends the iteration hands the converted tile to all.
template <class C>
__device__ inline void TreeVerifyCta<C>::run_tiles_fp8(const RequestInfo& r, int h, int m0, int kt0, int kt1,
                                                       float (&o)[NO][4], float (&m_run)[2], float (&l_run)[2],
                                                       const uint32_t* const (&mask_row)[2]) {
  static_assert(C::kFp8Overlap && C::kLoadThreads == 0 && C::kStages == 2, "the math warps' landing ring");
  constexpr int kKTile = C::kBlockN * C::kDqk, kVTileElems = C::kBlockN * C::kDv;
  auto issue = [&](int kt) {  // tile kt's copies into the ring; a group either way
    if (kt < kt1) {
      const int slot = (kt - kt0) % 2;
      land_fp8_tile<C::kDqk, C::kMathThreads>(sKRow + slot * C::kBlockN, sLandK + slot * C::kLandTileK, tid);
      if constexpr (C::kVTile)
        if (!v_from_k(r, kt))
          land_fp8_tile<C::kDv, C::kMathThreads>(sVRow + slot * C::kBlockN, sLandV + slot * C::kLandTileV, tid);
    }
    cp_async_commit();
  };
  auto convert = [&](int kt, bool v) {  // tile kt's K (v: V) from the ring into its T stage, this thread's chunks
    if (kt >= kt1) return;
    const int slot = (kt - kt0) % 2;
    if (!v) {
      convert_fp8_tile<C::kDqk, C::kMathThreads, false>(r, h, kt, sLandK + slot * C::kLandTileK, sK + slot * kKTile,
                                                        tid);
    } else if constexpr (C::kVTile) {
      if (!v_from_k(r, kt))
        convert_fp8_tile<C::kDv, C::kMathThreads, true>(r, h, kt, sLandV + slot * C::kLandTileV,
                                                        sV + slot * kVTileElems, tid);
    }
  };
  auto ahead_rows = [&](int kt) {  // this thread's key of tile kt (threads below BLOCK_N), nullptr past kt1
    return tid < C::kBlockN && kt < kt1 ? key_rows(r, h, kt * C::kBlockN + tid) : KeyRows{nullptr, nullptr};
  };

  stage_first_rows(r, h, kt0, kt1, 2);  // tiles kt0 and kt0 + 1
  __syncthreads();
  load_q(r, h, m0);
  issue(kt0);  // with Q's copies
  issue(kt0 + 1);
  const KeyRows rows2 = ahead_rows(kt0 + 2);
  __syncthreads();  // every copy of tile kt0 has read its row pointers: slot 0 takes tile kt0 + 2's
  if (tid < C::kBlockN) stage_rows(tid, rows2);
  cp_async_wait<1>();  // Q and tile kt0
  convert(kt0, false);
  convert(kt0, true);
  if constexpr (C::kWgmma) fence_proxy_async();  // wgmma reads Q and the converted tile through the async proxy
  __syncthreads();

  for (int kt = kt0; kt < kt1; ++kt) {
    const int stage = (kt - kt0) % 2;
    issue(kt + 2);
    cp_async_wait<1>();  // this thread's copies of tile kt + 1
    const KeyRows rows3 = ahead_rows(kt + 3);  // in flight during the GEMMs
    compute_tile(r, h, kt, stage, o, m_run, l_run, mask_row, [&](int phase) { convert(kt + 1, phase == 1); });
    if (tid < C::kBlockN) stage_rows((1 - stage) * C::kBlockN + tid, rows3);
    if constexpr (C::kWgmma) fence_proxy_async();
    __syncthreads();  // tile kt + 1 converted, its rows staged; every warp is done with tile kt's stage and slots
  }
  cp_async_wait<0>();
}

}  // namespace kdtree::cuda
