// Launch of one tree-verify kernel configuration: grid from the device, workspace from the shapes.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "fp8_path.h"
#include "heuristics.h"
#include "split_counters.h"
#include "tile_configs.h"
#include "launch_class.h"
#include "smem_optin.cuh"
#include "tree_verify_families.h"

namespace kdtree::cuda {

// The persistent grids of configuration C on a device: every CTA that fits at once, and where C may launch in
// clusters of two (kClusterPairs), every cluster that fits at once.
struct PersistentGrids {
  int ctas;
  int in_clusters;  // CTAs; 0 where C does not launch in clusters
};

// The launch configuration of C's kernel on `grid` CTAs with `attrs` (the occupancy query's and the launch's).
template <class C>
cudaLaunchConfig_t kernel_config(int grid, cudaLaunchAttribute* attrs, int num_attrs, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(C::kThreads);
  config.dynamicSmemBytes = C::kSmemBytes;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = num_attrs;
  return config;
}

// Clusters of C::kClusterSize CTAs along the grid.
template <class C>
cudaLaunchAttribute cluster_attribute() {
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = C::kClusterSize;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  return cluster;
}

// The shared memory a block of the launch's class may have on `device`: its class's limit, and the device's own.
inline size_t class_smem_limit(int device, ArchClass cls) {
  return std::min(limits_of(cls).smem_per_block,
                  static_cast<size_t>(at::cuda::getDeviceProperties(device)->sharedMemPerBlockOptin));
}

// The name of the GPU a launch runs as, for messages: "NVIDIA H200 (sm_90)", or with an emulated class
// "NVIDIA H200 (sm_90) emulating the 99 KB class".
inline std::string launch_gpu_name(int device, ArchClass cls) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  std::string name = std::string(prop->name) + " (sm_" + std::to_string(prop->major) + std::to_string(prop->minor) + ")";
  if (cls != arch_class_of(prop->major, prop->minor, prop->sharedMemPerBlockOptin))
    name += std::string(" emulating the ") + limits_of(cls).name + " class";
  return name;
}

// Why configuration C cannot launch on `device` as class `cls` ("" when it can): this build holds no kernel image
// for the device's architecture, or C needs more shared memory than a block of the class may have there. The
// launch's check and the kernel-support answer (has_kernel_for) both take it, so what is advertised is what launches.
template <class C>
std::string launch_blocker(int device, ArchClass cls) {
  const std::string gpu = launch_gpu_name(device, cls);
  const std::string config = std::string(C::kWgmma ? "wgmma" : "mma.sync") + " configuration for head dims " +
                             std::to_string(C::kDqk) + "/" + std::to_string(C::kDv) +
                             (C::kFp8Overlap ? " over an fp8 KV cache (overlap path)"
                              : C::kFp8Cache ? " over an fp8 KV cache" : "");
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  cudaFuncAttributes attributes;
  const cudaError_t status = cudaFuncGetAttributes(&attributes, tree_verify_attention_kernel<C>);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // a missing image is not a sticky error: clear it so later calls do not see it
    if (status == cudaErrorNoKernelImageForDevice || status == cudaErrorInvalidDeviceFunction)
      return "this build has no kernel image of the " + config + " for " + gpu + " (" + cudaGetErrorString(status) +
             "); rebuild with KDTREE_OPS_CUDA_ARCHS naming it";
    return "the " + config + " cannot be queried on " + gpu + ": " + cudaGetErrorString(status);
  }
  const size_t need = C::kSmemBytes + attributes.sharedSizeBytes, limit = class_smem_limit(device, cls);
  if (need > limit)
    return "the " + config + " needs " + std::to_string(need) + " bytes of shared memory per block; " + gpu +
           " allows " + std::to_string(limit);
  return "";
}

// Found once per device and class, with the kernel's dynamic shared-memory limit raised at the same time (to the
// class's limit: under emulation the driver then refuses any launch past it), so a launch makes no attribute or
// occupancy calls. The CTAs an SM holds are also capped by the class's shared memory and threads per SM (the H200
// has more of both than an emulated class). No CTA waits for another outside its cluster, whose CTAs the hardware
// runs together.
template <class C>
PersistentGrids persistent_grids(int device, const cudaDeviceProp& prop, ArchClass cls) {
  static std::array<std::array<std::atomic<PersistentGrids>, kArchClasses>, 64> cached{};  // ctas 0: not yet known
  TORCH_CHECK(device >= 0 && device < static_cast<int>(cached.size()), "tree_verify_attention: device index ",
              device, " out of range");
  std::atomic<PersistentGrids>& slot = cached[device][static_cast<int>(cls)];
  PersistentGrids grids = slot.load(std::memory_order_acquire);
  if (grids.ctas != 0) return grids;
  constexpr auto kernel = tree_verify_attention_kernel<C>;
  const std::string blocker = launch_blocker<C>(device, cls);
  TORCH_CHECK(blocker.empty(), "tree_verify_attention: ", blocker);
  allow_dynamic_smem<kernel>(device, C::kSmemBytes, "tree_verify_attention", "the kernel's tiles",
                             class_smem_limit(device, cls));
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, C::kThreads, C::kSmemBytes));
  const ArchLimits& limits = limits_of(cls);
  per_sm = std::min({per_sm, static_cast<int>(limits.smem_per_sm / (C::kSmemBytes + 1024)),
                     limits.threads_per_sm / C::kThreads});
  grids.ctas = per_sm * prop.multiProcessorCount;
  TORCH_CHECK(grids.ctas > 0, "tree_verify_attention: the kernel for head dims ", C::kDqk, "/", C::kDv,
              " does not fit on ", launch_gpu_name(device, cls));
  grids.in_clusters = 0;
  if constexpr (C::kClusterSize > 1) {
    cudaLaunchAttribute cluster = cluster_attribute<C>();
    const cudaLaunchConfig_t config =
        kernel_config<C>(grids.ctas / C::kClusterSize * C::kClusterSize, &cluster, 1, nullptr);
    int clusters = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    grids.in_clusters = clusters * C::kClusterSize;
  }
  slot.store(grids, std::memory_order_release);
  return grids;
}

template <class C>
void launch_tree_verify(TreeVerifyParams p, const at::Tensor& q, ArchClass cls) {
  if constexpr (C::kFp8Overlap) {  // its tiles hold the stored keys: k_scale goes into the score scale
    p.sm_scale *= p.k_scale;       // (tree_verify_fp8_scales.cuh; v_scale goes into O in the kernel)
    p.scale_log2 *= p.k_scale;
  }
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.get_device());
  // A persistent grid: its size depends on the device and the shapes only, never on the lengths of a batch.
  const PersistentGrids grids = persistent_grids<C>(q.get_device(), *prop, cls);
  // The row tiles of the N tokens as one request: as many as equal trees make where T * G fills whole tiles.
  const int64_t even_row_tiles = static_cast<int64_t>(p.num_kv_heads) *
                                 ((static_cast<int64_t>(p.num_tokens) * p.group + C::kBlockM - 1) / C::kBlockM);
  p.cluster_pairs = use_cluster_pairs(even_row_tiles, grids.in_clusters);  // heuristics.h
  const int grid = p.cluster_pairs ? grids.in_clusters : grids.ctas;

  // Row tiles: sum over requests of Hkv * ceil(T_b * G / BLOCK_M) <= Hkv * (ceil(N * G / BLOCK_M) + B).
  const int64_t row_tiles = even_row_tiles + static_cast<int64_t>(p.num_kv_heads) * p.batch;
  // Pieces: sum over row tiles of max(1, floor(n_tiles * grid / units)) <= grid + row tiles.
  const int64_t slots = grid + row_tiles;
  TORCH_CHECK(slots <= INT32_MAX, "tree_verify_attention: ", row_tiles, " row tiles: too many for the work split, ",
              "which indexes row tiles (and the MLA kernel its pieces) in 32 bits");
  // One allocation per call from the caching allocator (graph-pool aware): partial outputs (in T) and their
  // log-sum-exps, each CTA's schedule, then the arrival counters of each row tile's slices. Only the counters
  // need zeros, from a kernel of their own each call, where a persistent buffer would be an untracked live
  // allocation in a captured graph's pool. Sizes in floats; every part starts on a 16-byte boundary (BLOCK_M
  // is a multiple of 32).
  const int64_t partial_floats = slots * C::kBlockM * (C::kDv / 2 + 1);
  const int64_t schedule_floats = static_cast<int64_t>(grid) * kScheduleArrays * (p.batch + 1) * 2;  // 2 floats a word
  const int64_t counters = row_tiles * TreeVerifyCta<C>::kSlices;
  at::Tensor workspace = at::empty({partial_floats + schedule_floats + counters}, q.options().dtype(at::kFloat));
  float* base = workspace.data_ptr<float>();
  p.partial_out = base;
  p.partial_lse = base + slots * C::kBlockM * C::kDv / 2;
  p.schedule = reinterpret_cast<long long*>(base + partial_floats);
  p.row_tile_counters = reinterpret_cast<int*>(base + partial_floats + schedule_floats);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  zero_split_counters(p.row_tile_counters, counters, stream);
  p.min_units_per_cta = kMinUnitsPerCta;

  // Launched while the zeroing runs where the class can (programmatic dependent launch): the kernel waits for it
  // before its first arrival. Everything else it reads was written before the zeroing kernel started.
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1] = cluster_attribute<C>();
  const bool programmatic = limits_of(cls).programmatic_launch && prop->major >= 9;
  const cudaLaunchConfig_t config =
      kernel_config<C>(grid, attrs, !programmatic ? 0 : p.cluster_pairs ? 2 : 1, stream);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, tree_verify_attention_kernel<C>, p));
}

// The wgmma kernels run where the class has them (sm_90a) unless KDTREE_OPS_PORTABLE_MMA=1 asks for the portable
// mma.sync path there (the GPU tests run both; prefers_wgmma, heuristics.h). Read at each launch: a host-side
// getenv, no device work.
inline bool use_wgmma(ArchClass cls) {
  if (!prefers_wgmma(cls)) return false;
  const char* portable = std::getenv("KDTREE_OPS_PORTABLE_MMA");
  return portable == nullptr || portable[0] == '\0' || portable[0] == '0';
}

// Calls visit(std::type_identity<Config>{}) with the configuration family F takes for a call: the class's portable
// one, or on the wgmma path the wide or narrow one (use_narrow_wgmma, heuristics.h: short trees, a function of the
// shapes, so one captured graph always takes the same kernel); bf16 or fp16; over a cache of q's dtype, or fp8 by
// the widen path (the configuration's WithFp8Cache) or the overlap path (the family's Fp8 twin, tile_configs.h).
template <class F, class Visit>
auto visit_family_config(ArchClass cls, bool wgmma, bool narrow, bool bf16, bool fp8, Fp8Path path, Visit&& visit) {
  auto pick = [&]<template <typename> class Config, template <typename> class Overlap>() {
    auto with = [&]<typename T>() {
      if (!fp8) return visit(std::type_identity<Config<T>>{});
      if (path == Fp8Path::kOverlap) return visit(std::type_identity<Overlap<T>>{});
      return visit(std::type_identity<typename Config<T>::WithFp8Cache>{});
    };
    return bf16 ? with.template operator()<__nv_bfloat16>() : with.template operator()<__half>();
  };
  if (wgmma) return narrow ? pick.template operator()<F::template SmWgmmaNarrow, F::template SmWgmmaNarrowFp8>()
                           : pick.template operator()<F::template SmWgmma, F::template SmWgmmaFp8>();
  switch (cls) {
    case ArchClass::kSm80: return pick.template operator()<F::template Sm80Portable, F::template Sm80PortableFp8>();
    case ArchClass::k99KB: return pick.template operator()<F::template Kb99Portable, F::template Kb99PortableFp8>();
    default: return pick.template operator()<F::template Sm90aPortable, F::template Sm90aPortableFp8>();
  }
}

// Launches family F for a validated call (bf16 or fp16 by q's dtype; `fp8`: the caches are fp8).
template <class F>
void launch_tree_verify_family(const TreeVerifyParams& p, const at::Tensor& q, bool fp8) {
  const ArchClass cls = launch_class(q.get_device());
  const Fp8Path path = fp8 && p.fp8_overlap ? Fp8Path::kOverlap : Fp8Path::kWiden;  // tree_verify_attention.cu
  visit_family_config<F>(cls, use_wgmma(cls), use_narrow_wgmma(p.num_tokens, p.group, p.batch),
                         q.scalar_type() == at::kBFloat16, fp8, path,
                         [&](auto config) { launch_tree_verify<typename decltype(config)::type>(p, q, cls); });
}

// launch_tree_verify_family's blocker: why some configuration it may choose on `device` cannot launch there
// ("" when every one can). Each family's translation unit exports it (tree_verify_families.h).
template <class F>
std::string family_blocker(int device, bool bf16, bool fp8) {
  const ArchClass cls = launch_class(device);
  auto blocker = [&](bool narrow) {
    const Fp8Path path = fp8 ? fp8_path() : Fp8Path::kWiden;
    return visit_family_config<F>(cls, use_wgmma(cls), narrow, bf16, fp8, path, [&](auto config) {
      return launch_blocker<typename decltype(config)::type>(device, cls);
    });
  };
  const std::string wide = blocker(false);
  return !wide.empty() || !use_wgmma(cls) ? wide : blocker(true);
}

}  // namespace kdtree::cuda
