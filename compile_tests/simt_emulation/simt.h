// A host emulation of the CUDA features the level-synchronous tree build uses (csrc/cuda/ddtree_build_levels.cu),
// so that its kernel source runs on a machine without a GPU (compile_tests/test_ddtree_levels_emulated.py): one
// std::thread per CUDA thread, one block at a time; __syncthreads is a block barrier; a warp intrinsic is an
// exchange between two barriers of the warp's 32 threads, and throws on a partial mask, so a kernel that calls one
// from a diverged warp hangs or fails here instead of passing. Built with -fsanitize=thread, a read of shared
// memory that no barrier orders after its write is reported (racecheck's question). Not modelled: timing, memory
// coalescing, bank conflicts, anything past what the kernel uses.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__
#define __shared__ static  // one block at a time: a function-local static is the block's shared variable

struct EmulatedDim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmulatedDim3 threadIdx, blockIdx;

namespace simt {

struct Warp {
  std::barrier<> barrier{32};
  uint64_t slot[32];
};

struct Block {
  std::unique_ptr<std::barrier<>> barrier;
  std::vector<std::unique_ptr<Warp>> warps;
};

inline Block block;

inline Warp& warp() { return *block.warps[threadIdx.x / 32]; }

inline void check_full(unsigned mask) {
  if (mask != 0xffffffffu) throw std::runtime_error("a warp intrinsic with a partial mask");
}

// Every lane's `mine`, after all 32 lanes gave theirs.
inline void gather(uint64_t mine, uint64_t* all) {
  Warp& w = warp();
  w.slot[threadIdx.x & 31] = mine;
  w.barrier.arrive_and_wait();
  std::memcpy(all, w.slot, sizeof(w.slot));
  w.barrier.arrive_and_wait();
}

template <typename T>
uint64_t bits_of(T v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}

template <typename T>
T from_lane(T v, int source) {
  uint64_t all[32];
  gather(bits_of(v), all);
  T r;
  std::memcpy(&r, &all[source & 31], sizeof(T));
  return r;
}

// Runs kernel() for `blocks` blocks of `threads` threads (a multiple of 32), one block after the other.
template <typename F>
void launch(int blocks, int threads, F kernel) {
  for (int b = 0; b < blocks; ++b) {
    block.barrier = std::make_unique<std::barrier<>>(threads);
    block.warps.clear();
    for (int w = 0; w < threads / 32; ++w) block.warps.push_back(std::make_unique<Warp>());
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([=] {
        threadIdx.x = t;
        blockIdx.x = b;
        kernel();
      });
    for (std::thread& thread : pool) thread.join();
  }
}

}  // namespace simt

inline void __syncthreads() { simt::block.barrier->arrive_and_wait(); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int source) {
  simt::check_full(mask);
  return simt::from_lane(v, source);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, int delta) {
  simt::check_full(mask);
  const int lane = threadIdx.x & 31;
  return simt::from_lane(v, lane >= delta ? lane - delta : lane);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  simt::check_full(mask);
  return simt::from_lane(v, (threadIdx.x & 31) ^ lane_mask);
}
inline unsigned __match_any_sync(unsigned mask, int v) {
  simt::check_full(mask);
  uint64_t all[32];
  simt::gather(static_cast<uint32_t>(v), all);
  unsigned peers = 0;
  for (int i = 0; i < 32; ++i) peers |= (all[i] == static_cast<uint32_t>(v)) << i;
  return peers;
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  simt::check_full(mask);
  uint64_t all[32];
  simt::gather(v, all);
  return static_cast<unsigned>(*std::max_element(all, all + 32));
}
inline int __ffs(unsigned v) { return v ? __builtin_ctz(v) + 1 : 0; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline float __fadd_rn(float a, float b) {
  volatile float sum = a + b;  // one rounded float32 addition, as on the device
  return sum;
}
inline unsigned atomicAdd(uint32_t* address, unsigned v) { return std::atomic_ref<uint32_t>(*address).fetch_add(v); }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline uint64_t min(uint64_t a, uint64_t b) { return a < b ? a : b; }
inline uint64_t max(uint64_t a, uint64_t b) { return a > b ? a : b; }
