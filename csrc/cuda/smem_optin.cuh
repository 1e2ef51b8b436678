// The one way a kernel here opts in to more than 48 KB of dynamic shared memory: raised per device, only upward
// (a lower request never shrinks what another call or thread needs), under a lock (several host threads may launch
// at once), and checked with the kernel's static shared memory counted.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <mutex>

namespace kdtree::cuda {

// Allows kKernel `bytes` of dynamic shared memory on `device`, or fails naming `op` and `what` needs it. After the
// first call per (kernel, device) with a given size or less, a host-side atomic read: no CUDA call.
// `limit`: the per-block limit to hold the launch to (default: the device's opt-in maximum; an emulated
// architecture class passes its own, smaller one).
template <auto kKernel>
void allow_dynamic_smem(int device, size_t bytes, const char* op, const char* what, size_t limit = 0) {
  static std::array<std::atomic<int>, 64> allowed{};  // bytes the attribute allows now, per device (0: default)
  static std::array<std::atomic<int>, 64> static_bytes{};  // the kernel's static shared memory + 1 (0: not read)
  static std::mutex lock;
  TORCH_CHECK(device >= 0 && device < static_cast<int>(allowed.size()), op, ": device index ", device, " out of range");
  if (static_cast<size_t>(allowed[device].load(std::memory_order_acquire)) >= bytes) return;
  const std::lock_guard<std::mutex> guard(lock);
  if (static_bytes[device].load() == 0) {
    cudaFuncAttributes attributes;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kKernel));
    static_bytes[device].store(static_cast<int>(attributes.sharedSizeBytes) + 1);
  }
  const size_t fixed = static_cast<size_t>(static_bytes[device].load() - 1);
  const size_t optin = at::cuda::getDeviceProperties(device)->sharedMemPerBlockOptin;
  const size_t cap = limit == 0 ? optin : std::min(limit, optin);
  TORCH_CHECK(bytes + fixed <= cap, op, ": ", what, " needs ", bytes + fixed, " bytes of shared memory per block (",
              fixed, " of them static); this GPU", limit == 0 ? "" : "'s emulated class", " allows ", cap);
  // Blocks get 48 KB in all without opting in; past that, raise the attribute to everything the cap allows, once.
  const size_t granted = bytes + fixed <= 48 * 1024 ? 48 * 1024 - fixed : cap - fixed;
  if (granted > 48 * 1024 - fixed)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(granted)));
  if (static_cast<size_t>(allowed[device].load()) < granted)
    allowed[device].store(static_cast<int>(granted), std::memory_order_release);
}

}  // namespace kdtree::cuda
