// Launch of one tree-verify kernel configuration: grid from the device, workspace from the shapes.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "tile_configs.h"

namespace kdtree::cuda {

template <class C>
void launch_tree_verify(TreeVerifyParams p, const at::Tensor& q) {
  auto* kernel = tree_verify_attention_kernel<C>;
  const size_t smem = C::smem_bytes(p.batch);
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.get_device());
  TORCH_CHECK(smem <= prop->sharedMemPerBlockOptin, "tree_verify_attention: a batch of ", p.batch,
              " requests needs ", smem, " bytes of shared memory with head dims ", C::kDqk, "/", C::kDv,
              "; this GPU allows ", prop->sharedMemPerBlockOptin, " per block");
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  int blocks_per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, C::kThreads, smem));
  TORCH_CHECK(blocks_per_sm > 0, "tree_verify_attention: the kernel for head dims ", C::kDqk, "/", C::kDv,
              " does not fit on this GPU");
  // A persistent grid: its size depends on the device only, never on the lengths of a batch.
  const int grid = prop->multiProcessorCount * blocks_per_sm;

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

  kernel<<<grid, C::kThreads, smem, stream>>>(p);
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
