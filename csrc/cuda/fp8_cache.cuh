// fp8 KV-cache rows in the tree-verify kernel (e4m3 or e5m2, chosen at run time; DESIGN.md, "fp8 KV caches"): the
// conversions of the two fp8 paths (tree_verify_config.h: widen and overlap).
//
// The widen path: a cache row lands in shared memory as bytes, eight to each 16-byte chunk of the tile (an 8-byte
// cp.async into the chunk's first half, so the whole tile is in flight at once as with a T cache), and after it has
// landed the thread that copied a chunk widens it in place: eight fp8 values times the cache's scale, rounded to T,
// fill the chunk. The tile then holds exactly what a T cache of the dequantized values would, and the GEMMs, the
// softmax and the swizzle are unchanged. No extra shared memory, and the math never sees fp8 (draft rows, in q's
// dtype and unscaled, are copied as before).
//
// The overlap path lands the rows in a ring of fp8 tiles of their own and converts them into the T tiles off the math's
// path (tree_verify_fp8_ring.cuh), unscaled: every e4m3 and e5m2 value is exact in fp16 and in bf16, so the T tile
// holds the stored values exactly, and the scales are folded into the softmax's score scale and into O
// (tree_verify_fp8_scales.cuh), in fp32.
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

// Two fp8 values (the low and high byte of `pair`) as an exact fp16 pair (one cvt.rn.f16x2.e4m3x2 / e5m2x2 from
// sm_89 on): fp16 holds every e4m3 and e5m2 value.
__device__ __forceinline__ __half2 fp8x2_to_half2(uint32_t pair, __nv_fp8_interpretation_t kind) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), kind);
  return *reinterpret_cast<const __half2*>(&h);
}

// The widen path's conversion: two fp8 values times `scale`, rounded once to T, as a T pair (low half = first).
template <typename T>
__device__ __forceinline__ uint32_t fp8x2_scaled(uint32_t pair, __nv_fp8_interpretation_t kind, float scale) {
  const float2 f = __half22float2(fp8x2_to_half2(pair, kind));
  return pack2<T>(f.x * scale, f.y * scale);
}

// The overlap path's conversion: two fp8 values as a T pair, exactly (unscaled). fp16: the cvt's result itself;
// bf16: through fp32, with no rounding (an fp8 value has at most 4 significant bits, bf16 8, and bf16's exponents
// reach below e5m2's smallest subnormal, 2^-16).
template <typename T>
__device__ __forceinline__ uint32_t fp8x2_exact(uint32_t pair, __nv_fp8_interpretation_t kind) {
  const __half2 h = fp8x2_to_half2(pair, kind);
  if constexpr (std::is_same_v<T, __half>) return *reinterpret_cast<const uint32_t*>(&h);
  else {
    const float2 f = __half22float2(h);
    return pack2<T>(f.x, f.y);
  }
}

// The chunk at `chunk` (16 bytes, its first 8 the landed fp8 values) widened in place to 8 values of T times `scale`
// (the widen path; the overlap path's V over K with a scale of 1).
template <typename T>
__device__ __forceinline__ void widen_fp8_chunk(T* chunk, bool e5m2, float scale) {
  const uint2 raw = *reinterpret_cast<const uint2*>(chunk);
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const uint32_t words[2] = {raw.x, raw.y};
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = fp8x2_scaled<T>(words[i / 2] >> (16 * (i % 2)), kind, scale);
  *reinterpret_cast<uint4*>(chunk) = make_uint4(out[0], out[1], out[2], out[3]);
}

// Sixteen landed fp8 values (a 16-byte chunk of the overlap path's landing ring) as two 16-byte chunks of T, exactly:
// lo holds values 0-7, hi values 8-15.
template <typename T>
__device__ __forceinline__ void fp8x16_to_chunks(const uint4& raw, bool e5m2, uint4& lo, uint4& hi) {
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  lo = make_uint4(fp8x2_exact<T>(raw.x, kind), fp8x2_exact<T>(raw.x >> 16, kind), fp8x2_exact<T>(raw.y, kind),
                  fp8x2_exact<T>(raw.y >> 16, kind));
  hi = make_uint4(fp8x2_exact<T>(raw.z, kind), fp8x2_exact<T>(raw.z >> 16, kind), fp8x2_exact<T>(raw.w, kind),
                  fp8x2_exact<T>(raw.w >> 16, kind));
}

}  // namespace kdtree::cuda
