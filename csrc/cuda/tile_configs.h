// Tile shapes of the tree-verify kernel, TreeVerifyConfig<T, Dqk, Dv, BLOCK_M, BLOCK_N, WARPS_N, STAGES, WGMMA,
// V_TILE, PAIRED_TILES, FP8 (the cache's path: tree_verify_config.h)>: a portable mma.sync configuration and sm_90a
// wgmma ones per head-dim family, and their fp8 overlap path's twins. A line each
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

// The fp8 overlap path's configurations (tree_verify_config.h, kFp8Overlap) where the same tiles with their landing
// ring (two fp8 tiles a side) do not fit the class, or spill: fewer keys a tile. Not yet measured (examples/TUNING.md,
// "fp8 KV caches").
// 99 KB class, Dqk 128: 64 x 32 tiles, 67,856 B (64 x 64: 118,032).
template <typename T>
using Hd128Kb99Fp8 = TreeVerifyConfig<T, 128, 128, 64, 32, 1, 2, false, true, false, kFp8OverlapMode>;
// Portable Dqk 256, every class: 64 x 16 tiles, 83,728 B (64 x 32: 133,392, over the 99 KB class; on sm_80 and
// sm_90a its tile loop spilled 80 bytes, the next tile's conversion on top of O's 128 registers).
template <typename T>
using Hd256PortableFp8 = TreeVerifyConfig<T, 256, 256, 64, 16, 1, 2, false, true, false, kFp8OverlapMode>;
// Portable MLA on sm_90a: sm_80's 64 x 32 tiles without V tiles (V from the K tile), 194,576 B (with V tiles:
// 293,392).
template <typename T>
using MlaPortableFp8 = TreeVerifyConfig<T, 576, 512, 64, 32, 2, 2, false, false, false, kFp8OverlapMode>;
// MLA on sm_80 and the 99 KB class: 32 x 16 tiles in two T stages (the bytes of the 99 KB configuration's three:
// two T tiles and two fp8 ones), 97,808 B. sm_80's 64-row tiles with 16 keys would fit (139,024 B), but their staged
// output (64 KiB) would not fit the K buffers, where the epilogue puts it.
template <typename T>
using Mla99KbFp8 = TreeVerifyConfig<T, 576, 512, 32, 16, 2, 2, false, false, false, kFp8OverlapMode>;
// wgmma Dqk 256: 32-key tiles, 166,416 B (128 x 64: 265,744); narrow 64 x 32.
template <typename T>
using Hd256WgmmaFp8 = TreeVerifyConfig<T, 256, 256, 128, 32, 1, 2, true, true, false, kFp8OverlapMode>;
template <typename T>
using Hd256WgmmaNarrowFp8 = TreeVerifyConfig<T, 256, 256, 64, 32, 1, 2, true, true, false, kFp8OverlapMode>;
// wgmma MLA, key split: 32-key tiles (S at N = 16 a warpgroup), 194,576 B (64 x 64: 264,720).
template <typename T>
using MlaWgmmaKeySplitFp8 = TreeVerifyConfig<T, 576, 512, 64, 32, 2, 2, true, false, false, kFp8OverlapMode>;

// A family's configurations: the portable one per architecture class and the wgmma ones of sm_90a (arch_classes.h),
// and each one's twin over the fp8 overlap path (the same tiles with the landing ring, unless a family names another).
template <template <typename> class Portable90, template <typename> class Portable80,
          template <typename> class Portable99, template <typename> class Wgmma, template <typename> class WgmmaNarrow>
struct FamilyConfigs {
  template <typename T> using Sm90aPortable = Portable90<T>;
  template <typename T> using Sm80Portable = Portable80<T>;
  template <typename T> using Kb99Portable = Portable99<T>;
  template <typename T> using SmWgmma = Wgmma<T>;
  template <typename T> using SmWgmmaNarrow = WgmmaNarrow<T>;
  template <typename T> using Sm90aPortableFp8 = typename Portable90<T>::WithFp8Overlap;
  template <typename T> using Sm80PortableFp8 = typename Portable80<T>::WithFp8Overlap;
  template <typename T> using Kb99PortableFp8 = typename Portable99<T>::WithFp8Overlap;
  template <typename T> using SmWgmmaFp8 = typename Wgmma<T>::WithFp8Overlap;
  template <typename T> using SmWgmmaNarrowFp8 = typename WgmmaNarrow<T>::WithFp8Overlap;
};
using Hd64Family = FamilyConfigs<Hd64Config, Hd64Config, Hd64Config, Hd64Wgmma, Hd64WgmmaNarrow>;
struct Hd128Family : FamilyConfigs<Hd128Config, Hd128Config, Hd128Config, Hd128Wgmma, Hd128WgmmaNarrow> {
  template <typename T> using Kb99PortableFp8 = Hd128Kb99Fp8<T>;
};
struct Hd256Family : FamilyConfigs<Hd256Config, Hd256Config, Hd256Config, Hd256Wgmma, Hd256WgmmaNarrow> {
  template <typename T> using Sm90aPortableFp8 = Hd256PortableFp8<T>;
  template <typename T> using Sm80PortableFp8 = Hd256PortableFp8<T>;
  template <typename T> using Kb99PortableFp8 = Hd256PortableFp8<T>;
  template <typename T> using SmWgmmaFp8 = Hd256WgmmaFp8<T>;
  template <typename T> using SmWgmmaNarrowFp8 = Hd256WgmmaNarrowFp8<T>;
};
// The paired MLA kernel keeps the widening on both paths: its two 72 KiB T tiles and Q leave no room for a landing
// ring, and a converter cannot lower its shared-memory traffic, which bounds it (examples/TUNING.md, "fp8 KV caches":
// the register-side design that would).
struct MlaPairedFamily : FamilyConfigs<MlaConfig, MlaSm80Config, Mla99KbConfig, MlaWgmma, MlaWgmma> {
  template <typename T> using Sm90aPortableFp8 = MlaPortableFp8<T>;
  template <typename T> using Sm80PortableFp8 = Mla99KbFp8<T>;
  template <typename T> using Kb99PortableFp8 = Mla99KbFp8<T>;
  template <typename T> using SmWgmmaFp8 = typename MlaWgmma<T>::WithFp8Cache;
  template <typename T> using SmWgmmaNarrowFp8 = typename MlaWgmma<T>::WithFp8Cache;
};
struct MlaKeySplitFamily : FamilyConfigs<MlaConfig, MlaSm80Config, Mla99KbConfig, MlaWgmmaKeySplit, MlaWgmmaKeySplit> {
  template <typename T> using Sm90aPortableFp8 = MlaPortableFp8<T>;
  template <typename T> using Sm80PortableFp8 = Mla99KbFp8<T>;
  template <typename T> using Kb99PortableFp8 = Mla99KbFp8<T>;
  template <typename T> using SmWgmmaFp8 = MlaWgmmaKeySplitFp8<T>;
  template <typename T> using SmWgmmaNarrowFp8 = MlaWgmmaKeySplitFp8<T>;
};

// The static proof that every configuration fits the class it is built for (the kernel's static shared memory is
// none: everything is the dynamic kSmemBytes; the launch checks the total again on the device).
template <class F>
constexpr bool family_fits() {
  using T = __nv_bfloat16;
  auto fits = [](size_t bytes, ArchClass cls) { return bytes <= limits_of(cls).smem_per_block; };
  // Two CTAs an SM (the narrow wgmma tiles): each has half of the SM's shared memory, less the driver's 1 KB a block.
  auto fits_two = [](size_t bytes) { return bytes <= (limits_of(ArchClass::kSm90a).smem_per_sm - 2048) / 2; };
  auto fits_wgmma = [&](size_t bytes, int ctas_per_sm) {
    return fits(bytes, ArchClass::kSm90a) && (ctas_per_sm == 1 || fits_two(bytes));
  };
  using W = typename F::template SmWgmma<T>;
  using WN = typename F::template SmWgmmaNarrow<T>;
  using WF = typename F::template SmWgmmaFp8<T>;
  using WNF = typename F::template SmWgmmaNarrowFp8<T>;
  return fits_wgmma(W::kSmemBytes, W::kCtasPerSm) && fits_wgmma(WN::kSmemBytes, WN::kCtasPerSm) &&
         fits_wgmma(WF::kSmemBytes, WF::kCtasPerSm) && fits_wgmma(WNF::kSmemBytes, WNF::kCtasPerSm) &&
         fits(F::template Sm90aPortable<T>::kSmemBytes, ArchClass::kSm90a) &&
         fits(F::template Sm90aPortable<T>::kSmemBytes, ArchClass::kSm100) &&
         fits(F::template Sm80Portable<T>::kSmemBytes, ArchClass::kSm80) &&
         fits(F::template Kb99Portable<T>::kSmemBytes, ArchClass::k99KB) &&
         fits(F::template Sm90aPortableFp8<T>::kSmemBytes, ArchClass::kSm90a) &&
         fits(F::template Sm90aPortableFp8<T>::kSmemBytes, ArchClass::kSm100) &&
         fits(F::template Sm80PortableFp8<T>::kSmemBytes, ArchClass::kSm80) &&
         fits(F::template Kb99PortableFp8<T>::kSmemBytes, ArchClass::k99KB);
}
static_assert(family_fits<Hd64Family>(), "hd64: a configuration exceeds its class's shared memory");
static_assert(family_fits<Hd128Family>(), "hd128: a configuration exceeds its class's shared memory");
static_assert(family_fits<Hd256Family>(), "hd256: a configuration exceeds its class's shared memory");
static_assert(family_fits<MlaPairedFamily>() && family_fits<MlaKeySplitFamily>(),
              "mla: a configuration exceeds its class's shared memory");
// The widen path widens in place: the same shared memory as the T cache's configuration.
static_assert(Mla99KbConfig<__half>::WithFp8Cache::kSmemBytes == Mla99KbConfig<__half>::kSmemBytes, "fp8 tiles");
// The overlap path keeps two CTAs an SM where the T cache's configuration has them (the narrow wgmma tiles).
static_assert(Hd128WgmmaNarrow<__half>::WithFp8Overlap::kCtasPerSm == 2, "two CTAs an SM");

}  // namespace kdtree::cuda
