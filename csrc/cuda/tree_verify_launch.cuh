// Launch of one tree-verify kernel configuration: grid from the device, workspace from the shapes.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <string>

#include "heuristics.h"
#include "split_counters.h"
#include "tile_configs.h"
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

// Why configuration C cannot launch on `device` ("" when it can): this build holds no kernel image for the
// device's architecture, or C needs more shared memory than a block may have there. The launch's check and the
// kernel-support answer (has_kernel_for) both take it, so what is advertised is what launches.
template <class C>
std::string launch_blocker(int device) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  const std::string gpu = std::string(prop->name) + " (sm_" + std::to_string(prop->major) + std::to_string(prop->minor) + ")";
  const std::string config = std::string(C::kWgmma ? "wgmma" : "mma.sync") + " configuration for head dims " +
                             std::to_string(C::kDqk) + "/" + std::to_string(C::kDv);
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
  const size_t need = C::kSmemBytes + attributes.sharedSizeBytes;
  if (need > prop->sharedMemPerBlockOptin)
    return "the " + config + " needs " + std::to_string(need) + " bytes of shared memory per block; " + gpu +
           " allows " + std::to_string(prop->sharedMemPerBlockOptin);
  return "";
}

// Found once per device, with the kernel's dynamic shared-memory limit raised to what it needs at the same time,
// so a launch makes no attribute or occupancy calls. No CTA waits for another outside its cluster, whose CTAs
// the hardware runs together.
template <class C>
PersistentGrids persistent_grids(int device, const cudaDeviceProp& prop) {
  static std::array<std::atomic<PersistentGrids>, 64> cached{};  // ctas 0: not yet known
  TORCH_CHECK(device >= 0 && device < static_cast<int>(cached.size()), "tree_verify_attention: device index ",
              device, " out of range");
  PersistentGrids grids = cached[device].load(std::memory_order_acquire);
  if (grids.ctas != 0) return grids;
  auto* kernel = tree_verify_attention_kernel<C>;
  const std::string blocker = launch_blocker<C>(device);
  TORCH_CHECK(blocker.empty(), "tree_verify_attention: ", blocker);
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(C::kSmemBytes)));
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, C::kThreads, C::kSmemBytes));
  grids.ctas = per_sm * prop.multiProcessorCount;
  TORCH_CHECK(grids.ctas > 0, "tree_verify_attention: the kernel for head dims ", C::kDqk, "/", C::kDv,
              " does not fit on this GPU");
  grids.in_clusters = 0;
  if constexpr (C::kClusterSize > 1) {
    cudaLaunchAttribute cluster = cluster_attribute<C>();
    const cudaLaunchConfig_t config =
        kernel_config<C>(grids.ctas / C::kClusterSize * C::kClusterSize, &cluster, 1, nullptr);
    int clusters = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    grids.in_clusters = clusters * C::kClusterSize;
  }
  cached[device].store(grids, std::memory_order_release);
  return grids;
}

template <class C>
void launch_tree_verify(TreeVerifyParams p, const at::Tensor& q) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.get_device());
  // A persistent grid: its size depends on the device and the shapes only, never on the lengths of a batch.
  const PersistentGrids grids = persistent_grids<C>(q.get_device(), *prop);
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
  // is a multiple of 64).
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

  // Launched while the zeroing runs where the device can (sm_90 and later): the kernel waits for it before
  // its first arrival. Everything else it reads was written before the zeroing kernel started.
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1] = cluster_attribute<C>();
  const cudaLaunchConfig_t config =
      kernel_config<C>(grid, attrs, prop->major < 9 ? 0 : p.cluster_pairs ? 2 : 1, stream);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, tree_verify_attention_kernel<C>, p));
}

// The sm_90a wgmma kernels run on Hopper (sm_90) unless KDTREE_OPS_PORTABLE_MMA=1 asks for the portable
// mma.sync path there (the GPU tests run both; prefers_wgmma, heuristics.h). Read at each launch: a host-side
// getenv, no device work.
inline bool use_wgmma(int device) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  if (!prefers_wgmma(*prop)) return false;
  const char* portable = std::getenv("KDTREE_OPS_PORTABLE_MMA");
  return portable == nullptr || portable[0] == '\0' || portable[0] == '0';
}
inline bool use_wgmma(const at::Tensor& q) { return use_wgmma(q.get_device()); }

// bf16 or fp16 instance of a head-dim family, on the wgmma or the portable path. On the wgmma path, batches
// of short trees (at most 64 packed rows per request on average: a function of the shapes, so one captured
// graph always takes the same kernel) take the narrow configuration (use_narrow_wgmma, heuristics.h).
template <template <typename> class Portable, template <typename> class Wgmma,
          template <typename> class WgmmaNarrow = Wgmma>
void launch_tree_verify_family(const TreeVerifyParams& p, const at::Tensor& q) {
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  if (!use_wgmma(q)) {
    if (bf16) launch_tree_verify<Portable<__nv_bfloat16>>(p, q);
    else launch_tree_verify<Portable<__half>>(p, q);
  } else if (use_narrow_wgmma(p.num_tokens, p.group, p.batch)) {
    if (bf16) launch_tree_verify<WgmmaNarrow<__nv_bfloat16>>(p, q);
    else launch_tree_verify<WgmmaNarrow<__half>>(p, q);
  } else {
    if (bf16) launch_tree_verify<Wgmma<__nv_bfloat16>>(p, q);
    else launch_tree_verify<Wgmma<__half>>(p, q);
  }
}

// launch_tree_verify_family's blocker: why some configuration it may choose on `device` cannot launch there
// ("" when every one can). Each family's translation unit exports it (tree_verify_families.h).
template <template <typename> class Portable, template <typename> class Wgmma,
          template <typename> class WgmmaNarrow = Wgmma>
std::string family_blocker(int device, bool bf16) {
  auto first = [](std::string a, std::string b) { return a.empty() ? b : a; };
  if (!use_wgmma(device))
    return bf16 ? launch_blocker<Portable<__nv_bfloat16>>(device) : launch_blocker<Portable<__half>>(device);
  if (bf16)
    return first(launch_blocker<Wgmma<__nv_bfloat16>>(device), launch_blocker<WgmmaNarrow<__nv_bfloat16>>(device));
  return first(launch_blocker<Wgmma<__half>>(device), launch_blocker<WgmmaNarrow<__half>>(device));
}

}  // namespace kdtree::cuda
