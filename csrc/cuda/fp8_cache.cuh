// fp8 KV-cache rows in the tree-verify kernel (e4m3 or e5m2, chosen at run time; DESIGN.md, "fp8 KV caches").
//
// A cache row lands in shared memory as bytes, eight to each 16-byte chunk of the tile (an 8-byte cp.async into the
// chunk's first half, so the whole tile is in flight at once as with a T cache), and after it has landed the thread
// that copied a chunk widens it in place: eight fp8 values times the cache's scale, rounded to T, fill the chunk.
// The tile then holds exactly what a T cache of the dequantized values would, and the GEMMs, the softmax and the
// swizzle are unchanged. No extra shared memory, and the math never sees fp8 (draft rows, in q's dtype and unscaled,
// are copied as before).
//
// Row sources are tagged: an fp8 row's byte address with bit 0 set (T rows are 16-byte aligned, so the bit is free),
// so one staged pointer per key says both where the row is and how to copy it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "mma.cuh"

namespace kdtree::cuda {

// 8-byte global -> shared copy (the first half of a 16-byte chunk).
__device__ __forceinline__ void cp_async_8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}

template <typename T>
__device__ __forceinline__ const T* tag_fp8_row(const void* bytes) {
  return reinterpret_cast<const T*>(reinterpret_cast<uintptr_t>(bytes) | 1u);
}
template <typename T>
__device__ __forceinline__ bool is_fp8_row(const T* row) {
  return (reinterpret_cast<uintptr_t>(row) & 1u) != 0;
}
template <typename T>
__device__ __forceinline__ const uint8_t* fp8_row_bytes(const T* row) {
  return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(row) & ~uintptr_t{1});
}

// The chunk at `chunk` (16 bytes, its first 8 the landed fp8 values) widened in place to 8 values of T, each the
// stored value times `scale` (exact in fp32: an fp8 value has at most 4 significant bits), rounded once.
template <typename T>
__device__ __forceinline__ void widen_fp8_chunk(T* chunk, bool e5m2, float scale) {
  const uint2 raw = *reinterpret_cast<const uint2*>(chunk);
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const uint32_t words[2] = {raw.x, raw.y};
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>((words[i / 2] >> (16 * (i % 2))) & 0xffffu);
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, kind);  // exact: fp16 holds every e4m3 and e5m2 value
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    out[i] = pack2<T>(f.x * scale, f.y * scale);
  }
  *reinterpret_cast<uint4*>(chunk) = make_uint4(out[0], out[1], out[2], out[3]);
}

}  // namespace kdtree::cuda
