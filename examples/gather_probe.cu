// Gather probe: how fast the SMs gather the benchmark's K/V rows when nothing else runs. It copies the K/V
// tiles of workloads G2, G5 and M2 (DESIGN.md) in the tree-verify kernel's pattern: the pieces of its work split
// (one per CTA), 16-byte cp.async copies of rows found through random slots into 128-byte-swizzled tiles,
// eight threads per row, row pointers read a tile ahead, two groups of 64 threads with one tile in flight
// each (G2, G5: the K tiles and the V tiles, as the GQA kernel; M2: the even and the odd 64-key tiles of the latent
// cache, as the MLA kernel gathered them before its 128 gatherers became one stream). The time is a floor for the
// kernels' loads alone. For G2 and G5 it also times two tiles in flight per group, for M2 one TMA box per (row,
// 128-byte chunk), the only way TMA (which has no gather on sm_90) can fill the same tiles.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a examples/gather_probe.cu -o gather_probe && ./gather_probe
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "../csrc/cuda/mbarrier.cuh"  // the kernel's copy, swizzle and barrier primitives

using namespace kdtree::cuda;

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    const cudaError_t e = (x);                                                                     \
    if (e != cudaSuccess) {                                                                        \
      std::printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));                       \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

constexpr int kGroupThreads = 64;  // a copier group, as in the kernel's gathering warpgroup

// What one CTA gathers: `tiles` tiles of kTileRows keys for each group. Group g's tile t holds keys
// key0 + (t * step + g * offset) * kTileRows + row of cache `base[g]`; key k is slot slots[k], whose row is at
// base[g] + slot * slot_bytes + head * head_bytes. CTA i runs head i / heads_div and key0 = (i % pieces) * piece_keys.
struct Pattern {
  const char* base[2];
  const int* slots;
  long long slot_bytes, head_bytes;
  int heads_div, pieces, piece_keys, tiles, step, offset;
};

// Each group keeps kInFlight tiles in flight (its own copies, waited for by each thread: the kernel's gatherers
// keep one).
template <int kRowBytes, int kTileRows, int kInFlight = 1>
__global__ void __launch_bounds__(2 * kGroupThreads) gather_cp_async(const Pattern pat, int* sink) {
  constexpr int kChunks = kRowBytes / 16, kRowsEach = kTileRows * 8 / kGroupThreads;
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  const int g = threadIdx.x / kGroupThreads, c = threadIdx.x % kGroupThreads, q = c % 8;
  const int head = blockIdx.x / pat.heads_div, key0 = (blockIdx.x % pat.pieces) * pat.piece_keys;
  auto rows_of = [&](int t, const char* (&rows)[kRowsEach]) {
    const int first = key0 + (t * pat.step + g * pat.offset) * kTileRows;
#pragma unroll
    for (int e = 0; e < kRowsEach; ++e)
      rows[e] = pat.base[g] + pat.slots[first + c / 8 + e * (kGroupThreads / 8)] * pat.slot_bytes +
                head * pat.head_bytes;
  };
  const char* next[kRowsEach];
  rows_of(0, next);
  for (int t = 0; t < pat.tiles; ++t) {
    char* tile = smem + (g * kInFlight + t % kInFlight) * kTileRows * kRowBytes;
#pragma unroll
    for (int e = 0; e < kRowsEach; ++e) {
      const int row = c / 8 + e * (kGroupThreads / 8);
#pragma unroll
      for (int chunk = q; chunk < kChunks; chunk += 8)  // swizzled 64-column blocks, as the kernel's tiles
        cp_async_16(tile + swizzle(row, chunk, kTileRows) * 16, next[e] + chunk * 16, true);
    }
    cp_async_commit();
    if (t + 1 < pat.tiles) rows_of(t + 1, next);
    cp_async_wait<kInFlight - 1>();
  }
  cp_async_wait<0>();
  if (threadIdx.x == 0 && smem[7] == 123) *sink = 1;  // keeps the copies observable
}

// The same tiles through TMA: thread c of a group issues the boxes of its rows, {64 elements, 1 row} each, and
// the group's tile is counted on an mbarrier. The 128-byte swizzle of TMA follows the shared-memory address, so
// a box at row r's address lands swizzled as the kernel's tiles are.
template <int kRowBytes, int kTileRows>
__global__ void __launch_bounds__(2 * kGroupThreads)
    gather_tma(const Pattern pat, const __grid_constant__ CUtensorMap map, int* sink) {
  constexpr int kChunks128 = kRowBytes / 128;
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  const int g = threadIdx.x / kGroupThreads, c = threadIdx.x % kGroupThreads;
  const int key0 = (blockIdx.x % pat.pieces) * pat.piece_keys;
  char* tile = smem + g * kTileRows * kRowBytes;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 2 * kTileRows * kRowBytes) + g;
  if (c == 0) mbarrier_init(bar, 1);
  __syncthreads();
  for (int t = 0; t < pat.tiles; ++t) {
    if (c == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
                   "r"(kTileRows * kRowBytes) : "memory");
    const int first = key0 + (t * pat.step + g * pat.offset) * kTileRows;
    for (int i = c; i < kTileRows * kChunks128; i += kGroupThreads) {
      const int row = i / kChunks128, block = i % kChunks128;
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
          ::"r"(smem_addr(tile + block * kTileRows * 128 + row * 128)), "l"(&map), "r"(block * 64),
          "r"(pat.slots[first + row]), "r"(smem_addr(bar)) : "memory");
    }
    mbarrier_wait(bar, t & 1);
  }
  if (threadIdx.x == 0 && tile[7] == 123) *sink = 1;
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// Best of 10 launches on `ctas` CTAs, each after writing a buffer larger than L2 (so K/V come from HBM, as in
// the benchmark's rotated input sets). Prints the time and the rates.
template <typename Launch>
void report(const char* name, int ctas, double bytes, Launch launch) {
  static char* flush = nullptr;
  constexpr size_t kFlush = size_t(256) << 20;
  if (flush == nullptr) CHECK(cudaMalloc(&flush, kFlush));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  float best = 1e30f;
  for (int rep = 0; rep < 10; ++rep) {
    CHECK(cudaMemsetAsync(flush, rep, kFlush));
    CHECK(cudaEventRecord(start));
    launch();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, ms);
  }
  CHECK(cudaGetLastError());
  std::printf("%-58s %7.1f us  %6.1f MB  %5.2f TB/s  %5.1f GB/s per SM\n", name, best * 1e3, bytes / 1e6,
              bytes / best / 1e9, bytes / best / 1e6 / ctas);
}

int main() {
  int* sink;
  CHECK(cudaMalloc(&sink, sizeof(int)));
  const int keys = 32768, pool = 2 * keys;  // slots drawn from a pool twice the need, as the benchmark does
  std::vector<int> perm(pool);
  for (int i = 0; i < pool; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), std::mt19937(1));
  int* slots;
  CHECK(cudaMalloc(&slots, keys * sizeof(int)));
  CHECK(cudaMemcpy(slots, perm.data(), keys * sizeof(int), cudaMemcpyHostToDevice));

  // GQA, 8 KV heads of 128 dims, K tiles by group 0 and V tiles by group 1, 128 CTAs. G2: 2 row tiles x 8 pieces
  // per head, each CTA 32 tiles of 128 keys (from HBM; the other row tile finds them in L2). G5: 8 row tiles x 2
  // pieces per head, each CTA 33 tiles (the keys of 8192 + 256 tokens, read by 8 CTAs each: mostly L2).
  {
    char *k, *v;
    const size_t bytes = size_t(pool) * 8 * 256;
    CHECK(cudaMalloc(&k, bytes));
    CHECK(cudaMalloc(&v, bytes));
    CHECK(cudaMemset(k, 1, bytes));
    CHECK(cudaMemset(v, 2, bytes));
    const Pattern g2{{k, v}, slots, 8 * 256, 256, 16, 8, keys / 8, 32, 1, 0};
    const Pattern g5{{k, v}, slots, 8 * 256, 256, 16, 2, 33 * 128, 33, 1, 0};
    auto one = gather_cp_async<256, 128, 1>;
    auto two = gather_cp_async<256, 128, 2>;
    const int smem = 2 * 2 * 128 * 256 + 1024;
    CHECK(cudaFuncSetAttribute(one, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncSetAttribute(two, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    report("G2 K and V tiles, cp.async (the kernel's gather)", 128, 128.0 * 2 * 32 * 128 * 256,
           [&] { one<<<128, 2 * kGroupThreads, smem>>>(g2, sink); });
    report("G2 the same, two tiles in flight per group", 128, 128.0 * 2 * 32 * 128 * 256,
           [&] { two<<<128, 2 * kGroupThreads, smem>>>(g2, sink); });
    report("G5 K and V tiles, cp.async (the kernel's gather)", 128, 128.0 * 2 * 33 * 128 * 256,
           [&] { one<<<128, 2 * kGroupThreads, smem>>>(g5, sink); });
    report("G5 the same, two tiles in flight per group", 128, 128.0 * 2 * 33 * 128 * 256,
           [&] { two<<<128, 2 * kGroupThreads, smem>>>(g5, sink); });
    CHECK(cudaFree(k));
    CHECK(cudaFree(v));
  }

  // M2: one latent head of 576 dims; 16 row tiles x 8 pieces = 128 CTAs, each 64 tiles of 64 keys, the even
  // ones by group 0 and the odd ones by group 1.
  {
    char* kv;
    const size_t bytes = size_t(pool) * 1152;
    CHECK(cudaMalloc(&kv, bytes));
    CHECK(cudaMemset(kv, 3, bytes));
    const Pattern pat{{kv, kv}, slots, 1152, 0, 1, 8, keys / 8, 32, 2, 1};
    const double moved = 128.0 * 64 * 64 * 1152;
    const int smem = 2 * 64 * 1152 + 1024 + 16;
    auto cp_kernel = gather_cp_async<1152, 64>;
    CHECK(cudaFuncSetAttribute(cp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    report("M2 latent tiles, cp.async (two groups of 64)", 128, moved,
           [&] { cp_kernel<<<128, 2 * kGroupThreads, smem>>>(pat, sink); });

    EncodeTiled encode = nullptr;
    cudaDriverEntryPointQueryResult found;
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000,
                                           cudaEnableDefault, &found));
    CUtensorMap map;
    const cuuint64_t dims[2] = {576, cuuint64_t(pool)}, strides[1] = {1152};
    const cuuint32_t box[2] = {64, 1}, elem_strides[2] = {1, 1};
    if (found != cudaDriverEntryPointSuccess ||
        encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kv, dims, strides, box, elem_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      std::printf("M2 TMA boxes: no tensor map\n");
    } else {
      auto tma_kernel = gather_tma<1152, 64>;
      CHECK(cudaFuncSetAttribute(tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      report("M2 latent tiles, a TMA box per (row, 128-byte chunk)", 128, moved,
             [&] { tma_kernel<<<128, 2 * kGroupThreads, smem>>>(pat, map, sink); });
    }
    CHECK(cudaFree(kv));
  }
  return 0;
}
