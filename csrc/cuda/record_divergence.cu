// CUDA impl of record_divergence (schema in csrc/ops.cpp): accumulates, on the device and in one launch,
//   stats[0] = max(stats[0], max |out - ref| over the finite elements of out)
//   stats[1] += number of non-finite elements of out
//   stats[2] += 1
// so SGLang's validate mode can compare two kernels inside a captured graph and read the stats after it.
// As on the CPU, a NaN difference (finite out, NaN ref) never replaces the running max (fmaxf drops NaN).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "record_divergence_args.h"

namespace kdtree {
namespace {

constexpr int kThreads = 256;

// atomicMax for non-negative floats: their IEEE bit patterns order like signed ints. stats[0] starts at
// 0 (or any earlier max), so every value compared here is >= 0.
__device__ __forceinline__ void atomic_max_nonneg(float* address, float value) {
  atomicMax(reinterpret_cast<int*>(address), __float_as_int(value));
}

template <typename OutT, typename RefT>
__global__ void record_divergence_kernel(const OutT* __restrict__ out,  // [numel]
                                         const RefT* __restrict__ ref,  // [numel]
                                         float* __restrict__ stats,     // [3]
                                         int64_t numel) {
  float max_diff = 0.f;
  float non_finite = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel; i += stride) {
    const float o = static_cast<float>(out[i]);
    if (!isfinite(o)) {
      non_finite += 1.f;
      continue;
    }
    max_diff = fmaxf(max_diff, fabsf(o - static_cast<float>(ref[i])));
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    max_diff = fmaxf(max_diff, __shfl_xor_sync(0xffffffffu, max_diff, offset));
    non_finite += __shfl_xor_sync(0xffffffffu, non_finite, offset);
  }
  __shared__ float warp_max[kThreads / 32];
  __shared__ float warp_count[kThreads / 32];
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    warp_max[warp] = max_diff;
    warp_count[warp] = non_finite;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      max_diff = fmaxf(max_diff, warp_max[w]);
      non_finite += warp_count[w];
    }
    atomic_max_nonneg(&stats[0], max_diff);
    if (non_finite > 0.f) atomicAdd(&stats[1], non_finite);
    if (blockIdx.x == 0) atomicAdd(&stats[2], 1.f);
  }
}

void record_divergence_cuda(const at::Tensor& out,    // [*] floating
                            const at::Tensor& ref,    // [*] floating, shape of out
                            at::Tensor stats) {          // [3] float32, updated in place
  check_record_divergence_args(out, ref, stats);
  TORCH_CHECK(stats.is_contiguous(), "record_divergence: stats must be contiguous (it is updated in place on the "
              "device)");

  const c10::cuda::CUDAGuard guard(out.device());
  // Usually no-ops; a strided input gets a copy on the same stream (graph-safe: the caching allocator).
  const at::Tensor o = out.contiguous();
  const at::Tensor r = ref.contiguous();
  const int64_t numel = o.numel();
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  // At least one block even for empty tensors: the call counter still advances.
  const int64_t blocks = std::clamp<int64_t>((numel + kThreads * 4 - 1) / (kThreads * 4), 1, 4 * sms);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, o.scalar_type(), "record_divergence_out", [&] {
    using OutT = scalar_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, r.scalar_type(), "record_divergence_ref", [&] {
      record_divergence_kernel<OutT, scalar_t><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          o.data_ptr<OutT>(), r.data_ptr<scalar_t>(), stats.data_ptr<float>(), numel);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(kdtree, CUDA, m) {
  m.impl("record_divergence", &record_divergence_cuda);
}

}  // namespace kdtree
