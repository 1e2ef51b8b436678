// Tile shapes and split heuristics of the tree-verify kernel, one line per head-dim family.
// TreeVerifyConfig<T, Dqk, Dv, BLOCK_M, BLOCK_N, WARPS_N, M_TILES_PER_WARP, STAGES>.
#pragma once

#include "tree_verify_kernel.cuh"

namespace kdtree::cuda {

// GQA/MHA. BLOCK_M = 64 packed rows (4 warps x 16): a DDTree tree of 16..64 tokens x 4 heads fills one or a few
// row tiles without padding waste; 2 stages of 64-key K and V tiles. Dqk 256 halves BLOCK_N to hold the
// 16 x 256 fp32 accumulators of each warp in registers (128 per thread).
template <typename T> using Hd64Config = TreeVerifyConfig<T, 64, 64, 64, 64, 1, 1, 2>;
template <typename T> using Hd128Config = TreeVerifyConfig<T, 128, 128, 64, 64, 1, 1, 2>;
template <typename T> using Hd256Config = TreeVerifyConfig<T, 256, 256, 64, 32, 1, 1, 2>;

// MLA (absorbed: Hkv = 1, Dqk = 576, Dv = 512). The 64 x 512 output does not fit 4 warps' registers, so 8 warps
// split it (WARPS_N = 2: each warp 16 rows x 256 columns = 128 fp32 per thread) and the 32-key tile's scores.
// Shared memory: Q 72 KiB + 2 x (K 36 KiB + V 32 KiB) = 208 KiB of the 227 KiB an H200 CTA may use.
template <typename T> using MlaConfig = TreeVerifyConfig<T, 576, 512, 64, 32, 2, 1, 2>;

// A CTA takes at least this many KV tiles: a split piece costs a fp32 partial write and read (BLOCK_M x Dv x 8
// bytes, about two KV tiles of traffic), so pieces shorter than this cost more than the parallelism gains.
constexpr int kMinUnitsPerCta = 4;

}  // namespace kdtree::cuda
