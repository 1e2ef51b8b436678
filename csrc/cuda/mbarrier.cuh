// Shared-memory barriers of sm_90 (mbarrier) and the register split of a warp-specialized CTA (setmaxnreg):
// the hand-off between the warpgroup that gathers K/V tiles and the warpgroups that compute on them.
// A barrier completes a phase when `count` threads have arrived; waiting names the parity of the phase to wait
// for, so a loop over tiles t waits for parity (t / stages) & 1 and never re-initializes.
#pragma once

#include <cstdint>

#include "wgmma.cuh"

namespace kdtree::cuda {

#if KDTREE_HAS_WGMMA
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Release: this thread's earlier writes (and, after fence_proxy_async, its async-proxy view) happen before
// the phase completes for any waiter.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Acquire: returns once the phase of this parity has completed. kCluster: at cluster scope, for a phase that
// arrivals from another CTA of the cluster complete (cluster.cuh).
#define KDTREE_MBARRIER_WAIT_LOOP(scope)                                         \
  "{\n.reg .pred done;\nwait_%=:\n"                                              \
  "mbarrier.try_wait.parity.acquire." scope ".shared::cta.b64 done, [%0], %1;\n" \
  "@!done bra wait_%=;\n}\n"
template <bool kCluster = false>
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  if constexpr (kCluster)
    asm volatile(KDTREE_MBARRIER_WAIT_LOOP("cluster") ::"r"(smem_addr(bar)), "r"(parity) : "memory");
  else
    asm volatile(KDTREE_MBARRIER_WAIT_LOOP("cta") ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}
#undef KDTREE_MBARRIER_WAIT_LOOP
// This warpgroup's registers per thread from here on (a multiple of 8 in [24, 256]), below / above what the
// launch gave; every warp of the warpgroup executes it. Growing waits until others have released enough.
template <int kRegs>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
#else
__device__ __forceinline__ void mbarrier_init(uint64_t*, int) {}
__device__ __forceinline__ void mbarrier_arrive(uint64_t*) {}
template <bool kCluster = false>
__device__ __forceinline__ void mbarrier_wait(uint64_t*, uint32_t) {}
template <int kRegs>
__device__ __forceinline__ void release_registers() {}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {}
#endif

// Barrier `id` (1..15; 0 is __syncthreads) over kThreads threads, whole warps: wait for the others, or only
// count this warp's arrival (a producer handing a turn to the warps that sync on it).
template <int kThreads>
__device__ __forceinline__ void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
template <int kThreads>
__device__ __forceinline__ void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

}  // namespace kdtree::cuda
