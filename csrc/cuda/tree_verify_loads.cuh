// Global -> shared copies of the tree-verify CTA (cp.async, 16 bytes each): the Q tile, the K/V tiles
// gathered through kv_indices, V over the K tile for configurations without V tiles, and the gathering
// warpgroup's loop that fills the K/V buffers of the warp-specialized tile loops (produce_tiles).
#pragma once

#include "tree_verify_cta.cuh"

namespace kdtree::cuda {

template <class C>
__device__ void TreeVerifyCta<C>::load_q(const RequestInfo& r, int h, int m0) {
  // A division by the group per row, not per chunk: this code runs once per segment, with a cold instruction
  // cache, so its length is its time.
  copy_rows<C::kBlockM, C::kChunksQK, C::kMathThreads, false>(
      [&](int row) -> const T* {
        const int packed = m0 + row;
        if (packed >= r.rows) return nullptr;
        const QueryRow query = query_row(r, h, packed);
        return static_cast<const T*>(p.q) + query.token * p.q_row_stride + query.head * p.q_head_stride;
      },
      sQ, tid);
}

template <class C>
__device__ auto TreeVerifyCta<C>::key_rows(const RequestInfo& r, int h, int j) const -> KeyRows {
  if (j >= r.kv_len) return {nullptr, nullptr};
  if (p.k_draft == nullptr || j < r.prefix_len) {
    const int64_t s = slot(r.kv_start + j);
    if constexpr (C::kFp8Cache)  // byte rows, tagged (fp8_cache.cuh)
      return {tag_fp8_row<T>(static_cast<const uint8_t*>(p.k_cache) + s * p.k_row_stride + h * p.k_head_stride),
              tag_fp8_row<T>(static_cast<const uint8_t*>(p.v_cache) + s * p.v_row_stride + h * p.v_head_stride)};
    return {static_cast<const T*>(p.k_cache) + s * p.k_row_stride + h * p.k_head_stride,
            static_cast<const T*>(p.v_cache) + s * p.v_row_stride + h * p.v_head_stride};
  }
  const int64_t d = r.qo_start + j - r.prefix_len;
  return {static_cast<const T*>(p.k_draft) + d * p.kd_row_stride + h * p.kd_head_stride,
          static_cast<const T*>(p.v_draft) + d * p.vd_row_stride + h * p.vd_head_stride};
}

template <class C>
__device__ void TreeVerifyCta<C>::load_kv(int stage, bool v_from_k) {
  load_rows<C::kChunksQK, C::kMathThreads>(sKRow + stage * C::kBlockN, sK + stage * (C::kBlockN * C::kDqk), tid);
  if constexpr (C::kVTile)
    if (!v_from_k)
      load_rows<C::kChunksV, C::kMathThreads>(sVRow + stage * C::kBlockN, sV + stage * (C::kBlockN * C::kDv), tid);
}

template <class C>
template <int kRows, int kChunks, int kCopiers, bool kKv, class RowSource>
__device__ __forceinline__ void TreeVerifyCta<C>::copy_rows(RowSource row_source, T* dst, int copier) {
  constexpr int kRowsPerPass = kCopiers / 8;
  static_assert(kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0 && kChunks % 8 == 0,
                "threads tile the rows");
  const int q = copier % 8, row0 = copier / 8;
  const int position = (q ^ row0) & 7;
  // GQA, bound by its loads, chooses a row's source once and copies its blocks at constant offsets from it
  // (G3 96.2 -> 91.8, G5 77.5 -> 74.9 us); MLA, bound by its math, keeps a choice per copy: the shorter loop
  // made it slower (M2 142.6 -> 144.8, M5 248.6 -> 255.0 us), for a reason not measured.
  constexpr bool kSourcePerRow = C::kDqk <= 256;
  // Row sources in batches of up to eight, found before their copies: for staged row pointers, one
  // shared-memory latency per batch, not one per row (all of a tile's rows at once held too many registers:
  // G2 92 -> 98 us).
  constexpr int kPasses = kRows / kRowsPerPass;
  constexpr int kBatch = kPasses % 8 == 0 ? 8 : kPasses % 4 == 0 ? 4 : 1;
#pragma unroll
  for (int pass0 = 0; pass0 < kPasses; pass0 += kBatch) {
    const T* src[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) src[b] = row_source(row0 + (pass0 + b) * kRowsPerPass);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int row = row0 + (pass0 + b) * kRowsPerPass;
      const bool valid = src[b] != nullptr;
      if constexpr (C::kFp8Cache && kKv) {
        if (valid && is_fp8_row(src[b])) {  // 8 bytes into each chunk's first half; widened once landed
          const uint8_t* const bytes = fp8_row_bytes(src[b]) + q * 8;
#pragma unroll
          for (int block = 0; block < kChunks / 8; ++block)
            cp_async_8(dst + block * kRows * 64 + row * 64 + position * 8, bytes + block * 64);
          continue;
        }
      }
      // A missing row (zeros) reads nothing, from the same offsets of q's first row.
      const T* const from = (valid ? src[b] : dst_fallback()) + q * 8;
#pragma unroll
      for (int block = 0; block < kChunks / 8; ++block) {
        const T* const source = kSourcePerRow ? from + block * 64
                                : valid       ? src[b] + block * 64 + q * 8
                                              : dst_fallback();
        cp_async_16(dst + block * kRows * 64 + row * 64 + position * 8, source, valid);
      }
    }
  }
}

template <class C>
template <int kRows, int kChunks, int kCopiers, class RowSource>
__device__ __forceinline__ void TreeVerifyCta<C>::widen_rows(RowSource row_source, T* dst, int copier, float scale) {
  constexpr int kRowsPerPass = kCopiers / 8;
  const int q = copier % 8, row0 = copier / 8;
  const int position = (q ^ row0) & 7;
  // Rolled: the gathering warpgroup has few registers (kLoadRegs), and a row's chunks are independent enough.
#pragma unroll 1
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const int row = row0 + pass * kRowsPerPass;
    const T* const src = row_source(row);
    if (src == nullptr || !is_fp8_row(src)) continue;
#pragma unroll
    for (int block = 0; block < kChunks / 8; ++block)
      widen_fp8_chunk(dst + block * kRows * 64 + row * 64 + position * 8, p.kv_fp8_e5m2, scale);
  }
}

template <class C>
__device__ void TreeVerifyCta<C>::load_v_over_k(const RequestInfo& r, int h, int kt, T* k_tile) {
  __syncthreads();  // every warp is done reading K
  for (int i = tid; i < C::kBlockN * C::kChunksV; i += C::kMathThreads) {
    const int row = i / C::kChunksV, chunk = i % C::kChunksV;
    const T* src = key_rows(r, h, kt * C::kBlockN + row).v;
    if constexpr (C::kFp8Cache) {
      if (src != nullptr && is_fp8_row(src)) {
        cp_async_8(k_tile + swizzle(row, chunk, C::kBlockN) * 8, fp8_row_bytes(src) + chunk * 8);
        continue;
      }
    }
    cp_async_16(k_tile + swizzle(row, chunk, C::kBlockN) * 8, src != nullptr ? src + chunk * 8 : dst_fallback(),
                src != nullptr);
  }
  cp_async_commit();
  cp_async_wait<0>();
  if constexpr (C::kFp8Cache) {  // this thread's own chunks, widened once they landed (fp8_cache.cuh)
    // The overlap path folds v_scale into P and O (tree_verify_fp8_scales.cuh): its V rows are the stored values.
    const float scale = C::kFp8Overlap ? 1.f : p.v_scale;
    for (int i = tid; i < C::kBlockN * C::kChunksV; i += C::kMathThreads) {
      const int row = i / C::kChunksV, chunk = i % C::kChunksV;
      const T* src = key_rows(r, h, kt * C::kBlockN + row).v;
      if (src != nullptr && is_fp8_row(src))
        widen_fp8_chunk(k_tile + swizzle(row, chunk, C::kBlockN) * 8, p.kv_fp8_e5m2, scale);
    }
  }
  if constexpr (C::kWgmma) fence_proxy_async();
  __syncthreads();
}

// The gathering warpgroup's side of a segment (run_tiles_overlapped, run_tiles_paired). With V tiles, two
// groups of two warps, each on its own: the first copies the K tiles, the second the V tiles (a K tile never
// waits for a V tile's copies or buffer; one stream of all gatherers, K then V of each tile: G2 90 -> 99 us,
// G5 86 -> 95). Paired tiles have no V tiles: all four warps copy the K tiles, in the order the buffers come
// back (two groups of 64, one per buffer: M2 183 -> 160 us, M5 306 -> 265 as one stream).
template <class C>
__device__ inline void TreeVerifyCta<C>::produce_tiles(const Segment& sg) {
  const int g = tid - C::kMathThreads;  // 0 .. kLoadThreads - 1
  if constexpr (C::kPairedTiles) {
    produce<false>(sg, g);
  } else if constexpr (C::kFp8Overlap) {
    if (g < kCopiersPerSide) produce_fp8<false>(sg, g);
    else produce_fp8<true>(sg, g - kCopiersPerSide);
  } else {
    if (g < kCopiersPerSide) produce<false>(sg, g);
    else produce<true>(sg, g - kCopiersPerSide);
  }
}

// kCopiersPerSide gatherers (`copier` is this one's index) fill the K (kV: V) buffers: tile t of the CTA into
// buffer t % STAGES, zeros past kt1 (a missing last B of paired tiles). Each copier waits for its own copies,
// makes them visible to the tensor cores' reads (fence_proxy_async) and arrives on the full barrier.
template <class C>
template <bool kV>
__device__ __forceinline__ void TreeVerifyCta<C>::produce(const Segment& sg, int copier) {
  constexpr int kCopiers = kCopiersPerSide;
  constexpr int kRowsEach = (C::kBlockN + kCopiers - 1) / kCopiers;
  constexpr int kTileElems = C::kBlockN * (kV ? C::kDv : C::kDqk);
  T* const tiles = kV ? sV : sK;
  const T** const slots = kV ? sVRow : sKRow;
  uint64_t* const full = kV ? full_v : full_k;
  uint64_t* const empty = kV ? empty_v : empty_k;
  const RequestInfo& r = sg.r;
  const int kt0 = sg.kt0, kt1 = sg.kt1;
  // This copier's keys of a tile: copier + e * kCopiers for e < kRowsEach, those within the tile.
  auto has_key = [&](int e) { return C::kBlockN % kCopiers == 0 || copier + e * kCopiers < C::kBlockN; };
  // Where they are in tile kt: read a tile ahead, so the index reads hide behind the copies.
  auto rows_of = [&](int kt, const T* (&rows)[kRowsEach]) {
#pragma unroll
    for (int e = 0; e < kRowsEach; ++e) {
      const KeyRows kr = has_key(e) && kt < kt1 ? key_rows(r, sg.h, kt * C::kBlockN + copier + e * kCopiers)
                                                : KeyRows{nullptr, nullptr};
      rows[e] = kV ? kr.v : kr.k;
    }
  };
  const T* next[kRowsEach];
  rows_of(kt0, next);
  const int end = kt0 + C::turn_tiles(kt1 - kt0);
  for (int kt = kt0; kt < end; ++kt) {
    const int t = sg.tiles_before + kt - kt0, buf = t % C::kStages;
    // A slot of row pointers per buffer: it was last read STAGES tiles ago, before the previous barrier.
    const T** const rows = slots + buf * C::kBlockN;
#pragma unroll
    for (int e = 0; e < kRowsEach; ++e)
      if (has_key(e)) rows[copier + e * kCopiers] = next[e];
    named_barrier_sync<kCopiers>(kLoadBarrier + kV);  // the staged rows are visible to every copier
    mbarrier_wait(empty + buf, phase_parity(t) ^ 1);  // a fresh barrier's "previous phase" counts as done
    load_rows<kV ? C::kChunksV : C::kChunksQK, kCopiers>(rows, tiles + buf * kTileElems, copier);
    cp_async_commit();
    rows_of(kt + 1, next);
    // This copier's copies landed (fp8 rows widened in place): visible to wgmma, announced on `full`.
    cp_async_wait<0>();
    if constexpr (C::kFp8Cache)
      widen_rows<C::kBlockN, kV ? C::kChunksV : C::kChunksQK, kCopiers>([&](int row) { return rows[row]; },
                                                                         tiles + buf * kTileElems, copier,
                                                                         kV ? p.v_scale : p.k_scale);
    fence_proxy_async();
    mbarrier_arrive(full + buf);
  }
}

}  // namespace kdtree::cuda
