// Clusters of CTAs on sm_90 (distributed shared memory): a CTA reads the shared memory of another CTA of its
// cluster and arrives on that CTA's barriers. The two pieces of a row tile that run on the two CTAs of a
// cluster merge this way (merge_pair in tree_verify_stores.cuh).
#pragma once

#include <cstdint>

#include "wgmma.cuh"

namespace kdtree::cuda {

#if KDTREE_HAS_WGMMA
// Where `local` (this CTA's shared memory) is in CTA `rank` of the cluster, as a shared::cluster address.
__device__ __forceinline__ uint32_t cluster_addr(const void* local, uint32_t rank) {
  uint32_t addr;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(addr) : "r"(smem_addr(local)), "r"(rank));
  return addr;
}
__device__ __forceinline__ uint4 load_cluster_16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ float load_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
// Release at cluster scope: this thread's earlier writes (and, through a CTA barrier before it, its CTA's)
// happen before the phase of the other CTA's barrier completes, for a waiter in mbarrier_wait<true>.
__device__ __forceinline__ void mbarrier_arrive_remote(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The cluster barrier in two halves: every thread arrives once its CTA's barriers are initialized (after
// fence_barrier_init), and a thread waits before its first arrival on another CTA's barrier. Threads that have
// exited count as arrived.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Relaxed: what the arrival publishes, the barrier inits, fence_barrier_init has released.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }
#else
__device__ __forceinline__ uint32_t cluster_addr(const void*, uint32_t) { return 0; }
__device__ __forceinline__ uint4 load_cluster_16(uint32_t) { return make_uint4(0, 0, 0, 0); }
__device__ __forceinline__ float load_cluster_f32(uint32_t) { return 0.f; }
__device__ __forceinline__ void mbarrier_arrive_remote(uint32_t) {}
__device__ __forceinline__ void fence_barrier_init() {}
__device__ __forceinline__ void cluster_arrive() {}
__device__ __forceinline__ void cluster_wait() {}
#endif

}  // namespace kdtree::cuda
