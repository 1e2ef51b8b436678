// Compile-time shape of one tree-verify kernel: tile sizes, warp layout, GEMM path, shared-memory plan.
// The instances and the measurements that chose them: tile_configs.h.
#pragma once

#include <cstddef>

namespace kdtree::cuda {

template <typename T_, int kDqk_, int kDv_, int kBlockM_, int kBlockN_, int kWarpsN_, int kStages_,
          bool kWgmma_ = false, bool kVTile_ = true>
struct TreeVerifyConfig {
  using T = T_;
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarpsN = kWarpsN_, kStages = kStages_;
  static constexpr bool kWgmma = kWgmma_;
  // Without V tiles (shared memory too small), V comes from the K tile: MLA's latent cache, and for draft
  // keys whose V does not alias K, a reload over the K tile after S (load_v_over_k).
  static constexpr bool kVTile = kVTile_;
  // wgmma with P in registers: the PV GEMM of one tile runs on the tensor cores during the next tile's softmax
  // (run_tiles_overlapped). K then leads V by a tile, and the K/V row pointers take a third slot. Not for
  // Dv = 256: O's 128 fp32 registers per thread leave too few for two P tiles (ptxas spilled 316 bytes).
  static constexpr bool kOverlapPv = kWgmma && kWarpsN_ == 1 && kVTile && kDv_ <= 128;
  static constexpr int kRowSlots = kOverlapPv ? 3 : kStages_;
  static constexpr int kWarpsM = kBlockM / 16;  // a warp owns 16 rows (mma.sync M; a quarter of wgmma M)
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kKeysPerWarp = kBlockN / kWarpsN;  // S phase
  static constexpr int kDvPerWarp = kDv / kWarpsN;        // PV phase
  static constexpr int kChunksQK = kDqk / 8, kChunksV = kDv / 8;
  static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0 && kBlockN <= kThreads, "tile shape");
  static_assert(kWarpsN == 1 || kBlockN <= 64, "the P exchange holds 64 keys");
  static_assert(kWarpsM % 4 == 0, "whole warpgroups of 16-row warps");
  static_assert(kKeysPerWarp % 16 == 0 && kDvPerWarp % 16 == 0 && kDqk % 64 == 0 && kDv % 64 == 0, "warp split");

  static constexpr int kQBytes = kBlockM * kDqk * 2;
  static constexpr int kKBytes = kBlockN * kDqk * 2;
  static constexpr int kVBytes = kVTile ? kBlockN * kDv * 2 : 0;
  static constexpr int kPBytes = kWarpsN > 1 ? kBlockM * ((kBlockN + 63) / 64 * 64) * 2 : 0;  // swizzled blocks
  static constexpr int kRedBytes = kWarpsN * kBlockM * 4;
  static constexpr int kSrcBytes = kRowSlots * kBlockN * 8 * (kVTile ? 2 : 1);  // K (and V) row pointers
  static constexpr int kFixedSmem = kQBytes + kStages * (kKBytes + kVBytes) + kPBytes + kRedBytes + kSrcBytes + 16;
  // Plus the slack that puts the tiles on a 1024-byte boundary (the swizzle pattern's period).
  static constexpr size_t kSmemBytes = kFixedSmem + 1024;
};

}  // namespace kdtree::cuda
