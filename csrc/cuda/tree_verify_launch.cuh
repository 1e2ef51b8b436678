// Launch of one tree-verify kernel configuration: grid from the device, workspace from the shapes.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <array>
#include <atomic>

#include "tile_configs.h"

namespace kdtree::cuda {

// CTAs of configuration C that fit on one SM of `device`. Found once per device, with the kernel's
// dynamic shared-memory limit raised to the device's opt-in maximum at the same time, so a launch makes no
// attribute or occupancy calls. Counted at the smallest schedule (one request): a larger batch only adds
// 16 bytes of schedule per request, and the grid needs no co-residency (no CTA waits for another).
template <class C>
int ctas_per_sm(int device, const cudaDeviceProp& prop) {
  static std::array<std::atomic<int>, 64> cached{};  // 0: not yet known
  TORCH_CHECK(device >= 0 && device < static_cast<int>(cached.size()), "tree_verify_attention: device index ",
              device, " out of range");
  int ctas = cached[device].load(std::memory_order_relaxed);
  if (ctas == 0) {
    auto* kernel = tree_verify_attention_kernel<C>;
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(prop.sharedMemPerBlockOptin)));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, C::kThreads, C::smem_bytes(1)));
    TORCH_CHECK(ctas > 0, "tree_verify_attention: the kernel for head dims ", C::kDqk, "/", C::kDv,
                " does not fit on this GPU");
    cached[device].store(ctas, std::memory_order_relaxed);
  }
  return ctas;
}

template <class C>
void launch_tree_verify(TreeVerifyParams p, const at::Tensor& q) {
  const size_t smem = C::smem_bytes(p.batch);
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.get_device());
  TORCH_CHECK(smem <= prop->sharedMemPerBlockOptin, "tree_verify_attention: a batch of ", p.batch,
              " requests needs ", smem, " bytes of shared memory with head dims ", C::kDqk, "/", C::kDv,
              "; this GPU allows ", prop->sharedMemPerBlockOptin, " per block");
  // A persistent grid: its size depends on the device only, never on the lengths of a batch.
  const int grid = prop->multiProcessorCount * ctas_per_sm<C>(q.get_device(), *prop);

  // Row tiles: sum over requests of Hkv * ceil(T_b * G / BLOCK_M) <= Hkv * (ceil(N * G / BLOCK_M) + B).
  const int64_t row_tiles =
      static_cast<int64_t>(p.num_kv_heads) *
      ((static_cast<int64_t>(p.num_tokens) * p.group + C::kBlockM - 1) / C::kBlockM + p.batch);
  // Pieces: sum over row tiles of max(1, floor(n_tiles * grid / units)) <= grid + row tiles.
  const int64_t slots = grid + row_tiles;
  // One allocation per call from the caching allocator (graph-pool aware): partial outputs and their
  // log-sum-exp, then one arrival counter per row tile. Only the counters need zeros: a memset node, where a
  // persistent buffer would be an untracked live allocation in a captured graph's pool.
  const int64_t floats = slots * C::kBlockM * (C::kDv + 1);
  at::Tensor workspace = at::empty({floats + row_tiles}, q.options().dtype(at::kFloat));
  p.partial_out = workspace.data_ptr<float>();
  p.partial_lse = p.partial_out + slots * C::kBlockM * C::kDv;
  p.row_tile_counters = reinterpret_cast<int*>(p.partial_out + floats);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaMemsetAsync(p.row_tile_counters, 0, row_tiles * sizeof(int), stream));
  p.min_units_per_cta = kMinUnitsPerCta;

  tree_verify_attention_kernel<C><<<grid, C::kThreads, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// bf16 or fp16 instance of a head-dim family.
template <template <typename> class Config>
void launch_tree_verify_family(const TreeVerifyParams& p, const at::Tensor& q) {
  if (q.scalar_type() == at::kBFloat16) launch_tree_verify<Config<__nv_bfloat16>>(p, q);
  else launch_tree_verify<Config<__half>>(p, q);
}

// One per translation unit (tree_verify_<family>.cu), so the families compile in parallel.
void tree_verify_hd64(const TreeVerifyParams& p, const at::Tensor& q);
void tree_verify_hd128(const TreeVerifyParams& p, const at::Tensor& q);
void tree_verify_hd256(const TreeVerifyParams& p, const at::Tensor& q);
void tree_verify_mla(const TreeVerifyParams& p, const at::Tensor& q);

}  // namespace kdtree::cuda
