// Tile shapes of the tree-verify kernel, TreeVerifyConfig<T, Dqk, Dv, BLOCK_M, BLOCK_N, WARPS_N, STAGES, WGMMA,
// V_TILE, PAIRED_TILES>: a portable mma.sync configuration and sm_90a wgmma ones per head-dim family. A line each
// names the measurement that chose it; the runs, the shared-memory budgets and the shapes tried instead are in
// examples/TUNING.md ("The tile configurations"). Which one a launch takes: heuristics.h.
#pragma once

#include "tree_verify_kernel.cuh"

namespace kdtree::cuda {

// Portable GQA/MHA: 64-row tiles (a 16..64-token tree x 4 heads, little padding), 64-key tiles, 2 stages (G2 280 us).
template <typename T> using Hd64Config = TreeVerifyConfig<T, 64, 64, 64, 64, 1, 2>;
template <typename T> using Hd128Config = TreeVerifyConfig<T, 128, 128, 64, 64, 1, 2>;
// Dqk 256 halves BLOCK_N: each warp's 16 x 256 fp32 accumulators take 128 registers a thread.
template <typename T> using Hd256Config = TreeVerifyConfig<T, 256, 256, 64, 32, 1, 2>;

// Portable MLA: 8 warps split the 64 x 512 output (WARPS_N 2) in 208 of the 227 KiB of shared memory (M2 732 us).
template <typename T> using MlaConfig = TreeVerifyConfig<T, 576, 512, 64, 32, 2, 2>;

// wgmma GQA/MHA: 128-row, 128-key tiles, S at N = 128, P in registers (64-row tiles: G2 163 us, 128 x 64: 184).
template <typename T> using Hd64Wgmma = TreeVerifyConfig<T, 64, 64, 128, 128, 1, 2, true>;
template <typename T> using Hd128Wgmma = TreeVerifyConfig<T, 128, 128, 128, 128, 1, 2, true>;
// Dqk 256: 64-key tiles so the 64 x 256 fp32 accumulators fit; not overlapped (two P tiles spilled 316 bytes).
template <typename T> using Hd256Wgmma = TreeVerifyConfig<T, 256, 256, 128, 64, 1, 2, true>;
// Short trees (at most 64 packed rows a request): one warpgroup, 64-row tiles, two CTAs an SM (G4 159 -> 103 us).
template <typename T> using Hd64WgmmaNarrow = TreeVerifyConfig<T, 64, 64, 64, 64, 1, 2, true>;
template <typename T> using Hd128WgmmaNarrow = TreeVerifyConfig<T, 128, 128, 64, 64, 1, 2, true>;
template <typename T> using Hd256WgmmaNarrow = TreeVerifyConfig<T, 256, 256, 64, 64, 1, 2, true>;
// wgmma MLA, V apart from K: two warpgroups split S's 64 keys and O's 512 columns, no V tiles (M5 366 us).
template <typename T> using MlaWgmmaKeySplit = TreeVerifyConfig<T, 576, 512, 64, 64, 2, 2, true, false>;
// wgmma MLA, V in K: the warpgroups take the 64-key tiles in turns, S at N = 64, one gathers (M5 366 -> 313 us).
template <typename T> using MlaWgmma = TreeVerifyConfig<T, 576, 512, 64, 64, 2, 2, true, false, true>;

}  // namespace kdtree::cuda
