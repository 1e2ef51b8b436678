// Block-wide building blocks of one-CTA algorithms (the level-synchronous tree build, ddtree_build_levels.cu): an
// exclusive scan, a warp-aggregated histogram add, a bitonic sort of 64-bit keys. Every call is made by all threads
// of the block with block-uniform arguments. Device code only, no runtime headers: the host emulation of
// compile_tests/simt_emulation includes it as it is.
#pragma once

#include <cstdint>

namespace kdtree::cuda {

constexpr unsigned kBlockFullWarp = 0xffffffffu;

// Exclusive prefix sums of one int per thread, in thread order. Two buffers of warp totals in turn, so back-to-back
// scans need one barrier each: a thread writes a buffer again only after the next scan's barrier, which every thread
// reaches after its reads of the previous one.
template <int kThreads>
struct BlockScan {
  static constexpr int kWarps = kThreads / 32;
  static_assert(kThreads % 32 == 0 && kWarps <= 32, "one warp scans the warp totals");
  int (*sums)[32];  // [2][32] in shared memory
  int parity = 0;   // block-uniform: every thread makes the same calls

  // *total: the block's sum.
  __device__ int exclusive(int value, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inclusive = value;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(kBlockFullWarp, inclusive, o);
      if (lane >= o) inclusive += v;
    }
    int* warp_sums = sums[parity];
    parity ^= 1;
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    int w = lane < kWarps ? warp_sums[lane] : 0;
#pragma unroll
    for (int o = 1; o < kWarps; o <<= 1) {
      const int v = __shfl_up_sync(kBlockFullWarp, w, o);
      if (lane >= o) w += v;
    }
    *total = __shfl_sync(kBlockFullWarp, w, kWarps - 1);
    const int before = __shfl_sync(kBlockFullWarp, w, warp == 0 ? 0 : warp - 1);
    return (warp == 0 ? 0 : before) + inclusive - value;
  }
};

// hist[bin] += 1 for one bin (-1: none) per lane of a converged warp, one shared-memory atomic per distinct bin:
// skewed keys put most lanes in a few bins, where per-lane atomics would serialize.
__device__ inline void block_hist_add(uint32_t* hist, int bin) {
  const unsigned peers = __match_any_sync(kBlockFullWarp, bin);
  if (bin >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}

// Sorts keys[0, count) ascending in place; keys holds max(2 * kThreads, P) entries, P the power of two >= count
// (scratch past count). Distinct keys, so stability does not arise. Up to kThreads keys, one a thread: strides
// < 32 by shuffles, the rest through shared memory; more keys: compare-exchange pairs in shared memory.
template <int kThreads>
__device__ void block_bitonic_sort(uint64_t* keys, int count) {
  int size = 1;
  while (size < count) size <<= 1;
  __syncthreads();  // the keys are written
  if (size <= kThreads) {
    const int i = threadIdx.x;
    uint64_t v = i < count ? keys[i] : ~0ull;  // padding sorts last
    int exchange = 0;
    for (int block = 2; block <= size; block <<= 1) {
      for (int stride = block >> 1; stride > 0; stride >>= 1) {
        uint64_t other;
        if (stride >= 32) {  // two buffers in turn: one barrier a stage
          uint64_t* x = keys + exchange * kThreads;
          exchange ^= 1;
          x[i] = v;
          __syncthreads();
          other = x[i ^ stride];
        } else {
          other = __shfl_xor_sync(kBlockFullWarp, v, stride);
        }
        v = ((i & stride) == 0) == ((i & block) == 0) ? min(v, other) : max(v, other);
      }
    }
    __syncthreads();  // every exchange read
    if (i < count) keys[i] = v;
  } else {
    for (int i = count + threadIdx.x; i < size; i += kThreads) keys[i] = ~0ull;
    __syncthreads();
    for (int block = 2; block <= size; block <<= 1) {
      for (int stride = block >> 1; stride > 0; stride >>= 1) {
        for (int q = threadIdx.x; q < size / 2; q += kThreads) {
          const int i = (q & ~(stride - 1)) << 1 | (q & (stride - 1)), j = i + stride;
          const uint64_t a = keys[i], b = keys[j];
          if ((a > b) == ((i & block) == 0)) {
            keys[i] = b;
            keys[j] = a;
          }
        }
        __syncthreads();
      }
    }
  }
  __syncthreads();
}

}  // namespace kdtree::cuda
