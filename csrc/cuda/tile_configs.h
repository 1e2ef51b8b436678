// Tile shapes of the tree-verify kernel, TreeVerifyConfig<T, Dqk, Dv, BLOCK_M, BLOCK_N, WARPS_N, STAGES, WGMMA,
// V_TILE, PAIRED_TILES>: a portable mma.sync configuration and sm_90a wgmma ones per head-dim family. A line each
// names the measurement that chose it; the runs, the shared-memory budgets and the shapes tried instead are in
// examples/TUNING.md ("The tile configurations"). Which one a launch takes: heuristics.h.
#pragma once

#include "launch_class.h"
#include "tree_verify_kernel.cuh"

namespace kdtree::cuda {

// Portable GQA/MHA: 64-row tiles (a 16..64-token tree x 4 heads, little padding), 64-key tiles, 2 stages (G2 280 us).
template <typename T> using Hd64Config = TreeVerifyConfig<T, 64, 64, 64, 64, 1, 2>;
template <typename T> using Hd128Config = TreeVerifyConfig<T, 128, 128, 64, 64, 1, 2>;
// Dqk 256 halves BLOCK_N: each warp's 16 x 256 fp32 accumulators take 128 registers a thread.
template <typename T> using Hd256Config = TreeVerifyConfig<T, 256, 256, 64, 32, 1, 2>;

// Portable MLA: 8 warps split the 64 x 512 output (WARPS_N 2) in 208 of the 227 KiB of shared memory (M2 732 us).
template <typename T> using MlaConfig = TreeVerifyConfig<T, 576, 512, 64, 32, 2, 2>;
// sm_80 MLA: the same tiles with V read from the K tile (no V tiles; a separate draft V over K): 157,712 of
// 166,912 B. Not yet measured (examples/TUNING.md, "The architecture classes").
template <typename T> using MlaSm80Config = TreeVerifyConfig<T, 576, 512, 64, 32, 2, 2, false, false>;
// 99 KB class MLA: 32-row tiles (two row warps, two column warps: 256 of O's columns each), 16-key tiles (8 keys a
// warp in S), three stages, V from K: 97,936 of 101,376 B. Not yet measured (examples/TUNING.md).
template <typename T> using Mla99KbConfig = TreeVerifyConfig<T, 576, 512, 32, 16, 2, 3, false, false>;

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

// A family's configurations: the portable one per architecture class and the wgmma ones of sm_90a (arch_classes.h).
template <template <typename> class Portable90, template <typename> class Portable80,
          template <typename> class Portable99, template <typename> class Wgmma, template <typename> class WgmmaNarrow>
struct FamilyConfigs {
  template <typename T> using Sm90aPortable = Portable90<T>;
  template <typename T> using Sm80Portable = Portable80<T>;
  template <typename T> using Kb99Portable = Portable99<T>;
  template <typename T> using SmWgmma = Wgmma<T>;
  template <typename T> using SmWgmmaNarrow = WgmmaNarrow<T>;
};
using Hd64Family = FamilyConfigs<Hd64Config, Hd64Config, Hd64Config, Hd64Wgmma, Hd64WgmmaNarrow>;
using Hd128Family = FamilyConfigs<Hd128Config, Hd128Config, Hd128Config, Hd128Wgmma, Hd128WgmmaNarrow>;
using Hd256Family = FamilyConfigs<Hd256Config, Hd256Config, Hd256Config, Hd256Wgmma, Hd256WgmmaNarrow>;
using MlaPairedFamily = FamilyConfigs<MlaConfig, MlaSm80Config, Mla99KbConfig, MlaWgmma, MlaWgmma>;
using MlaKeySplitFamily = FamilyConfigs<MlaConfig, MlaSm80Config, Mla99KbConfig, MlaWgmmaKeySplit, MlaWgmmaKeySplit>;

// The static proof that every configuration fits the class it is built for (the kernel's static shared memory is
// none: everything is the dynamic kSmemBytes; the launch checks the total again on the device).
template <class F>
constexpr bool family_fits() {
  using T = __nv_bfloat16;
  return F::template SmWgmma<T>::kSmemBytes <= limits_of(ArchClass::kSm90a).smem_per_block &&
         F::template SmWgmmaNarrow<T>::kSmemBytes <= limits_of(ArchClass::kSm90a).smem_per_block &&
         F::template Sm90aPortable<T>::kSmemBytes <= limits_of(ArchClass::kSm90a).smem_per_block &&
         F::template Sm90aPortable<T>::kSmemBytes <= limits_of(ArchClass::kSm100).smem_per_block &&
         F::template Sm80Portable<T>::kSmemBytes <= limits_of(ArchClass::kSm80).smem_per_block &&
         F::template Kb99Portable<T>::kSmemBytes <= limits_of(ArchClass::k99KB).smem_per_block;
}
static_assert(family_fits<Hd64Family>(), "hd64: a configuration exceeds its class's shared memory");
static_assert(family_fits<Hd128Family>(), "hd128: a configuration exceeds its class's shared memory");
static_assert(family_fits<Hd256Family>(), "hd256: a configuration exceeds its class's shared memory");
static_assert(family_fits<MlaPairedFamily>() && family_fits<MlaKeySplitFamily>(),
              "mla: a configuration exceeds its class's shared memory");
// fp8 caches widen in place: the same shared memory as the T cache's configuration.
static_assert(Mla99KbConfig<__half>::WithFp8Cache::kSmemBytes == Mla99KbConfig<__half>::kSmemBytes, "fp8 tiles");

}  // namespace kdtree::cuda
