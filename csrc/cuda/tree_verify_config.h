// Compile-time shape of one tree-verify kernel: tile sizes, warp layout, GEMM path, shared-memory plan.
// The instances: tile_configs.h; the measurements that chose them: examples/TUNING.md.
#pragma once

#include <cstddef>

namespace kdtree::cuda {

// How a configuration reads its KV cache (kFp8_): a cache of q's dtype (0), or an fp8 cache (e4m3 or e5m2, chosen at
// run time) by one of two paths, which KDTREE_OPS_FP8_PATH chooses at each call (tree_verify_launch.cuh):
//   widen (1):   cache rows land as bytes in the T tiles and are widened in place, times their scale, rounded to T,
//                before the barrier that hands a tile to the math (tree_verify_loads.cuh);
//   overlap (2): cache rows land in a ring of fp8 tiles of their own, and are converted exactly (unscaled) into the
//                T tiles off the math's path: by the gathering warpgroup while the math warps compute (GQA on wgmma),
//                or by the math warps for the next tile while the current tile's GEMMs run (tree_verify_fp8_ring.cuh);
//                k_scale is folded into the score scale and v_scale into O (tree_verify_fp8_scales.cuh).
// Draft rows (k_draft/v_draft) stay T, unscaled, on both.
constexpr int kFp8WidenMode = 1, kFp8OverlapMode = 2;

template <typename T_, int kDqk_, int kDv_, int kBlockM_, int kBlockN_, int kWarpsN_, int kStages_,
          bool kWgmma_ = false, bool kVTile_ = true, bool kPairedTiles_ = false, int kFp8_ = 0>
struct TreeVerifyConfig {
  using T = T_;
  static constexpr bool kFp8Cache = kFp8_ != 0;
  static constexpr bool kFp8Widen = kFp8_ == kFp8WidenMode;
  static constexpr bool kFp8Overlap = kFp8_ == kFp8OverlapMode;
  // The same tiles over an fp8 KV cache, by either path.
  using WithFp8Cache = TreeVerifyConfig<T_, kDqk_, kDv_, kBlockM_, kBlockN_, kWarpsN_, kStages_, kWgmma_, kVTile_,
                                        kPairedTiles_, kFp8WidenMode>;
  using WithFp8Overlap = TreeVerifyConfig<T_, kDqk_, kDv_, kBlockM_, kBlockN_, kWarpsN_, kStages_, kWgmma_, kVTile_,
                                          kPairedTiles_, kFp8OverlapMode>;
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarpsN = kWarpsN_, kStages = kStages_;
  static constexpr bool kWgmma = kWgmma_;
  // Without V tiles (shared memory too small), V comes from the K tile: MLA's latent cache, and for draft
  // keys whose V does not alias K, a reload over the K tile after S (load_v_over_k).
  static constexpr bool kVTile = kVTile_;
  // wgmma with P in registers: the PV GEMM of one tile runs on the tensor cores during the next tile's softmax,
  // and a warpgroup of its own gathers the K/V tiles (run_tiles_overlapped, produce_tiles). Not for Dv = 256:
  // O's 128 fp32 registers per thread leave too few for two P tiles (ptxas spilled 316 bytes).
  static constexpr bool kOverlapPv = kWgmma && kWarpsN_ == 1 && kVTile && kDv_ <= 128;
  // wgmma, two warpgroups on the same rows (MLA): they take the KV tiles in turns, each computing S and the
  // softmax of its own tiles, and split O's columns; P goes to the other warpgroup through the tile's last
  // 64 columns (past Dv: the PV GEMMs do not read them), and a warpgroup of its own gathers the tiles
  // (run_tiles_paired). V must be K's first Dv columns.
  static constexpr bool kPairedTiles = kPairedTiles_;
  static constexpr int kTileStep = kPairedTiles ? 2 : 1;
  // The tiles a segment of `tiles` KV tiles runs: whole turns (with paired tiles, a missing last B is zeros).
  __host__ __device__ static constexpr int turn_tiles(int tiles) {
    return (tiles + kTileStep - 1) / kTileStep * kTileStep;
  }
  static constexpr int kWarpsM = kBlockM / 16;  // a warp owns 16 rows (mma.sync M; a quarter of wgmma M)
  // Warps come in groups that share one key/column split: a warpgroup of four (wgmma's unit), or on the mma.sync
  // path with fewer row warps (32-row tiles), those.
  static constexpr int kWarpsPerGroup = kWgmma || kWarpsM >= 4 ? 4 : kWarpsM;
  static constexpr int kMathThreads = 32 * kWarpsM * kWarpsN;  // the warps that compute (threads 0 ..)
  static constexpr int kLoadThreads = kOverlapPv || kPairedTiles ? 128 : 0;  // the gathering warpgroup
  static constexpr int kThreads = kMathThreads + kLoadThreads;
  // Warp-specialized CTAs split the registers: the gatherers release all but kLoadRegs, the math warps take
  // them. One CTA per SM, or two where a single math warpgroup's shared memory allows (the narrow tiles).
  // setmaxnreg moves registers within what the launch gave the CTA: kThreads x the per-thread count that
  // __launch_bounds__ allows (a multiple of 8), e.g. 384 x 168 = 64512, not the SM's 65536. A claim beyond it
  // never returns.
  static constexpr int kCtasPerSm = kLoadThreads > 0 && kMathThreads == 128 ? 2 : 1;
  static constexpr int kCtaRegs = 65536 / kCtasPerSm / kThreads / 8 * 8 * kThreads;
  // The gatherers' copy loops spilled at 40 (examples/TUNING.md); fp8 rows, widened after they land, take more. The
  // overlap path's copies and conversions fit 56 (ptxas, hd128: 48 spilled in the conversion loop; 64 and 72 leave
  // the math warps 216, which spilled 8 bytes more in their per-piece code).
  static constexpr int kLoadRegs = kFp8Widen ? 72 : 56;
  static constexpr int kMathRegs = (kCtaRegs - kLoadThreads * kLoadRegs) / kMathThreads / 8 * 8;
  // Wide warp-specialized CTAs (one per SM, P in registers) may launch in clusters of two (where the shapes make
  // row tiles of two pieces, tree_verify_launch.cuh): a row tile whose two pieces run on the two CTAs of a
  // cluster merges them through distributed shared memory, with no workspace round trip (merge_pair).
  static constexpr bool kClusterPairs = kOverlapPv && kCtasPerSm == 1;
  static constexpr int kClusterSize = kClusterPairs ? 2 : 1;
  static constexpr int kKeysPerWarp = kPairedTiles ? kBlockN : kBlockN / kWarpsN;  // S phase
  static constexpr int kDvPerWarp = kDv / kWarpsN;        // PV phase
  static constexpr int kChunksQK = kDqk / 8, kChunksV = kDv / 8;
  static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0 && kBlockN <= kMathThreads, "tile shape");
  static_assert(kLoadThreads == 0 || (kBlockN <= kLoadThreads && kMathRegs <= 256 &&
                                      kMathThreads * kMathRegs + kLoadThreads * kLoadRegs <= kCtaRegs),
                "gathering warpgroup");
  static_assert(kWarpsN == 1 || kBlockN <= 64, "the P exchange holds 64 keys");
  static_assert(kWarpsM % kWarpsPerGroup == 0 && (kWarpsPerGroup == 4 || !kWgmma), "whole groups of 16-row warps");
  static_assert(!kPairedTiles || (kWgmma && kWarpsN == 2 && kWarpsM == 4 && !kVTile && kBlockN == 64 &&
                                  kDqk - kDv == 64 && kStages == 2),
                "paired tiles: two warpgroups on 64 rows, 64-key tiles in two buffers, P in the columns past Dv");
  static_assert(!kFp8Overlap ||
                    (!kPairedTiles && kStages == 2 && (!kOverlapPv || (kDqk == kDv && kBlockM == kBlockN))),
                "fp8 overlap: two T tiles a side (the landing ring's schedule); the paired MLA kernel keeps the "
                "widening; the first PV GEMM of a segment reads the Q tile as its zero-multiplied V");
  // A warp's keys are whole mma.sync n-tiles (8), pairs of them on wgmma.
  static_assert(kKeysPerWarp % (kWgmma ? 16 : 8) == 0 && kDvPerWarp % 16 == 0 && kDqk % 64 == 0 && kDv % 64 == 0,
                "warp split");

  static constexpr int kQBytes = kBlockM * kDqk * 2;
  static constexpr int kKBytes = kBlockN * kDqk * 2;
  static constexpr int kVBytes = kVTile ? kBlockN * kDv * 2 : 0;
  static constexpr int kPBytes = kWarpsN > 1 && !kPairedTiles ? kBlockM * ((kBlockN + 63) / 64 * 64) * 2 : 0;
  // Zeros that the first PV GEMM of a segment multiplies (run_tiles_overlapped). Not over the fp8 overlap path,
  // whose landing ring needs the room: there that GEMM multiplies the zero P by the Q tile.
  static constexpr int kZeroBytes = kOverlapPv && !kFp8Overlap ? kBlockN * kDv * 2 : 0;
  static constexpr int kRedBytes = kWarpsN * kBlockM * 4;
  // Full and empty barriers of the K and V buffers (warp-specialized CTAs), and the two of a cluster pair's merge.
  static constexpr int kBarrierBytes = kLoadThreads > 0 ? (4 * kStages + (kClusterPairs ? 2 : 0)) * 8 : 0;
  // K (and V) row pointers, a slot per buffer
  static constexpr int kSrcBytes = kStages * kBlockN * 8 * (kVTile ? 2 : 1);
  // The fp8 overlap path's landing ring: fp8 K (and V) tiles, a byte a value, kLandStagesK (V) deep. Two of each
  // where the class's shared memory allows (a tile's copies in flight while the one before it is converted); the
  // wgmma GQA configurations of head dim 128 keep one V tile (V(t) is multiplied a tile after K(t), so its ring
  // has a tile more of slack): two of each would pass sm_90a's 232,448 B (wide) or the 115,712 B a CTA may have
  // with two CTAs an SM (narrow) by 1.7 KB.
  static constexpr int kLandTileK = kBlockN * kDqk, kLandTileV = kVTile ? kBlockN * kDv : 0;
  static constexpr int kLandStagesK = kFp8Overlap ? 2 : 0;
  static constexpr int kLandStagesV = !kFp8Overlap || !kVTile ? 0 : kOverlapPv && kDv >= 128 ? 1 : 2;
  static constexpr int kLandBytes = kLandStagesK * kLandTileK + kLandStagesV * kLandTileV;
  static constexpr int kFixedSmem = kQBytes + kStages * (kKBytes + kVBytes) + kLandBytes + kZeroBytes + kPBytes +
                                    kRedBytes + kBarrierBytes + kSrcBytes + 16;
  // Plus the slack that puts the tiles on a 1024-byte boundary (the swizzle pattern's period).
  static constexpr size_t kSmemBytes = kFixedSmem + 1024;
};

}  // namespace kdtree::cuda
