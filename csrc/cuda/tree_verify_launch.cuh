// Launch of one tree-verify kernel configuration: grid from the device, workspace from the shapes.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <array>
#include <atomic>
#include <cstdlib>

#include "split_counters.h"
#include "tile_configs.h"

namespace kdtree::cuda {

// CTAs of configuration C that fit on one SM of `device`. Found once per device, with the kernel's dynamic
// shared-memory limit raised to what it needs at the same time, so a launch makes no attribute or occupancy
// calls. The grid needs no co-residency (no CTA waits for another).
template <class C>
int ctas_per_sm(int device, const cudaDeviceProp& prop) {
  static std::array<std::atomic<int>, 64> cached{};  // 0: not yet known
  TORCH_CHECK(device >= 0 && device < static_cast<int>(cached.size()), "tree_verify_attention: device index ",
              device, " out of range");
  int ctas = cached[device].load(std::memory_order_relaxed);
  if (ctas == 0) {
    auto* kernel = tree_verify_attention_kernel<C>;
    cudaFuncAttributes attributes;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    TORCH_CHECK(C::kSmemBytes + attributes.sharedSizeBytes <= prop.sharedMemPerBlockOptin,
                "tree_verify_attention: the kernel for head dims ", C::kDqk, "/", C::kDv, " needs ",
                C::kSmemBytes + attributes.sharedSizeBytes, " bytes of shared memory; this GPU allows ",
                prop.sharedMemPerBlockOptin, " per block");
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(C::kSmemBytes)));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, C::kThreads, C::kSmemBytes));
    TORCH_CHECK(ctas > 0, "tree_verify_attention: the kernel for head dims ", C::kDqk, "/", C::kDv,
                " does not fit on this GPU");
    cached[device].store(ctas, std::memory_order_relaxed);
  }
  return ctas;
}

template <class C>
void launch_tree_verify(TreeVerifyParams p, const at::Tensor& q) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.get_device());
  // A persistent grid: its size depends on the device only, never on the lengths of a batch.
  const int grid = prop->multiProcessorCount * ctas_per_sm<C>(q.get_device(), *prop);

  // Row tiles: sum over requests of Hkv * ceil(T_b * G / BLOCK_M) <= Hkv * (ceil(N * G / BLOCK_M) + B).
  const int64_t row_tiles =
      static_cast<int64_t>(p.num_kv_heads) *
      ((static_cast<int64_t>(p.num_tokens) * p.group + C::kBlockM - 1) / C::kBlockM + p.batch);
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
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(C::kThreads);
  config.dynamicSmemBytes = C::kSmemBytes;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = prop->major >= 9 ? 1 : 0;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, tree_verify_attention_kernel<C>, p));
}

// The sm_90a wgmma kernels run on Hopper (sm_90) unless KDTREE_OPS_PORTABLE_MMA=1 asks for the portable
// mma.sync path there (the GPU tests run both). Read at each launch: a host-side getenv, no device work.
inline bool use_wgmma(const at::Tensor& q) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.get_device());
  if (prop->major != 9 || prop->minor != 0) return false;
  const char* portable = std::getenv("KDTREE_OPS_PORTABLE_MMA");
  return portable == nullptr || portable[0] == '\0' || portable[0] == '0';
}

// bf16 or fp16 instance of a head-dim family, on the wgmma or the portable path. On the wgmma path, batches
// of short trees (at most 64 packed rows per request on average: a function of the shapes, so one captured
// graph always takes the same kernel) take the narrow configuration.
template <template <typename> class Portable, template <typename> class Wgmma,
          template <typename> class WgmmaNarrow = Wgmma>
void launch_tree_verify_family(const TreeVerifyParams& p, const at::Tensor& q) {
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  if (!use_wgmma(q)) {
    if (bf16) launch_tree_verify<Portable<__nv_bfloat16>>(p, q);
    else launch_tree_verify<Portable<__half>>(p, q);
  } else if (static_cast<int64_t>(p.num_tokens) * p.group <= 64ll * p.batch) {
    if (bf16) launch_tree_verify<WgmmaNarrow<__nv_bfloat16>>(p, q);
    else launch_tree_verify<WgmmaNarrow<__half>>(p, q);
  } else {
    if (bf16) launch_tree_verify<Wgmma<__nv_bfloat16>>(p, q);
    else launch_tree_verify<Wgmma<__half>>(p, q);
  }
}

// One per translation unit (tree_verify_<family>.cu), so the families compile in parallel.
void tree_verify_hd64(const TreeVerifyParams& p, const at::Tensor& q);
void tree_verify_hd128(const TreeVerifyParams& p, const at::Tensor& q);
void tree_verify_hd256(const TreeVerifyParams& p, const at::Tensor& q);
void tree_verify_mla(const TreeVerifyParams& p, const at::Tensor& q);

}  // namespace kdtree::cuda
