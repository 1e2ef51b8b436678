// The tree-verify kernel entry: each CTA builds the work split's schedule and runs its share of pieces.
// The algorithm is described in tree_verify_cta.cuh; the CTA's member functions are in the headers below.
#pragma once

#include <type_traits>

#include "tree_verify_fp8_ring.cuh"
#include "tree_verify_fp8_scales.cuh"
#include "tree_verify_gemm.cuh"
#include "tree_verify_loads.cuh"
#include "tree_verify_mainloop.cuh"
#include "tree_verify_mainloop_fp8.cuh"
#include "tree_verify_mainloop_overlapped.cuh"
#include "tree_verify_mainloop_paired.cuh"
#include "tree_verify_softmax.cuh"
#include "tree_verify_stores.cuh"

namespace kdtree::cuda {

// The CTA's share of the work split: its pieces, one segment each. A warp-specialized CTA runs the same loop
// of pieces on both sides: the gathering warpgroup copies each segment's K/V tiles (produce_tiles), the math
// warps compute and store it (run_segment); a CTA barrier separates segments (the merge of a split row tile
// borrows the K/V buffers).
template <class C>
__device__ void run_tree_verify(const TreeVerifyParams& p, char* smem) {
  const Schedule sched = build_schedule<C::kThreads, C::kBlockM, C::kBlockN>(p);
  zero_padding_rows<typename C::T>(p, C::kDv);  // after the schedule: qo_indptr is then in cache

  // The piece indices' width is a register-allocation choice, measured (examples/TUNING.md): in 32 bits ptxas keeps
  // the piece loop's control in warp-uniform registers, which frees the paired kernel's math warps of spills
  // but slows GQA's loops. 32 bits hold them: they number at most grid + row tiles, which the host checks.
  using PieceIndex = std::conditional_t<C::kPairedTiles, int, long long>;
  const PieceIndex pieces_total = static_cast<PieceIndex>(sched.pieces);
  const PieceIndex per_cta = (pieces_total + gridDim.x - 1) / gridDim.x;
  const PieceIndex q_begin = blockIdx.x * per_cta;
  const PieceIndex q_end = min(q_begin + per_cta, pieces_total);
  if (q_begin >= q_end) return;

  TreeVerifyCta<C> cta(p, smem);
  cta.init_pipeline();
  // Calls segment(const Segment&) for each piece.
  auto for_each_piece = [&](auto&& segment) {
    int b = find_request(sched.piece_start, p.batch, q_begin);
    int tiles_before = 0;
    for (PieceIndex q = q_begin; q < q_end; ++q) {
      while (sched.piece_start[b + 1] <= q) ++b;
      const RequestInfo r = request_info<C::kBlockM, C::kBlockN>(p, b);
      const PieceSplit cut = sched.cut[b];
      const int splits = cut.pieces, chunk = cut.chunk;
      const PieceIndex local = q - static_cast<PieceIndex>(sched.piece_start[b]);
      const int rt = static_cast<int>(local / splits);  // row tile within the request: (head, m tile)
      const int split = static_cast<int>(local % splits);
      const int kt0 = split * chunk, kt1 = min(r.n_tiles, kt0 + chunk);  // kt0 < n_tiles unless n_tiles = 0
      // With one piece per CTA (piece q on CTA q), a row tile of two pieces starting on an even CTA has them on
      // the two CTAs of one cluster (ranks 0 and 1), at the same time.
      const bool cluster_pair =
          C::kClusterPairs && p.cluster_pairs && per_cta == 1 && splits == 2 && split == (blockIdx.x & 1);
      __syncthreads();  // the previous segment is done with shared memory
      segment(Segment{r, rt / r.m_tiles, rt % r.m_tiles, kt0, kt1, static_cast<int>(sched.tile_start[b] + rt),
                      q - split, splits, split, tiles_before, cluster_pair});
      tiles_before += C::turn_tiles(kt1 - kt0);
    }
  };
  if constexpr (C::kLoadThreads > 0) {
    if (threadIdx.x >= C::kMathThreads) {
      release_registers<C::kLoadRegs>();
      for_each_piece([&](const Segment& sg) { cta.produce_tiles(sg); });
      return;
    }
    claim_registers<C::kMathRegs>();
    cta.first_tensor_turn();
  }
  for_each_piece([&](const Segment& sg) { cta.run_segment(sg); });
}

// Whether the architecture being compiled could launch C: its blocks' shared-memory limit (a configuration of another
// class compiles to a trap there, so a build of several targets carries only the machine code each target can run;
// the sm_90a build keeps every class's portable configuration, which KDTREE_OPS_EMULATE_ARCH runs on the H200).
template <class C>
constexpr bool fits_compiled_arch() {
#if defined(__CUDA_ARCH__)
  constexpr size_t limit = __CUDA_ARCH__ == 800 ? 166912
                           : __CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 890 || __CUDA_ARCH__ >= 1200 ? 101376
                                                                                                     : 232448;
  return C::kSmemBytes <= limit;
#else
  return true;
#endif
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kCtasPerSm)
    tree_verify_attention_kernel(const __grid_constant__ TreeVerifyParams p) {
  if constexpr ((C::kWgmma && !KDTREE_HAS_WGMMA) || !fits_compiled_arch<C>()) {
    __trap();  // a configuration the compiled architecture cannot run: the host never launches it there
  } else {
    extern __shared__ __align__(16) char smem_raw[];
    char* smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);  // the swizzle's period
    run_tree_verify<C>(p, smem);
  }
}

}  // namespace kdtree::cuda
