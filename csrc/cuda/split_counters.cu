// The arrival counters of the work split start each call at zero: a small kernel zeroes them just before the
// verify kernel, and lets it launch at once (programmatic dependent launch, sm_90 and later). The verify
// kernel waits for it only before its first arrival (wait_for_zeroed_counters), so the zeroing and the gap
// between two launches hide behind its schedule and first tiles. (A memset node in its place cost 1.2 to
// 2.8 us per call.)
#include "split_counters.h"

#include <c10/cuda/CUDAException.h>

#include <algorithm>

namespace kdtree::cuda {
namespace {

__global__ void zero_split_counters_kernel(int* counters, int64_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // the verify kernel may launch now
#endif
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    counters[i] = 0;
}

}  // namespace

void zero_split_counters(int* counters, int64_t count, cudaStream_t stream) {
  constexpr int kThreads = 256, kMostBlocks = 32;
  const int blocks = static_cast<int>(std::clamp<int64_t>((count + kThreads - 1) / kThreads, 1, kMostBlocks));
  zero_split_counters_kernel<<<blocks, kThreads, 0, stream>>>(counters, count);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace kdtree::cuda
