// The fp8 overlap path's landing ring (tree_verify_config.h, kFp8Overlap): fp8 cache rows land in fp8 tiles of their
// own, a byte a value, and are converted exactly (unscaled: the scales are folded into the softmax and O,
// tree_verify_fp8_scales.cuh) into the T tiles that the unchanged 16-bit GEMMs read, off the math's path:
//   - GQA on wgmma (the gathering warpgroup, produce_fp8): each gatherer copies its chunks of tile t + L into the
//     ring, then converts its chunks of tile t into the T tile the math warps have handed back, while they compute
//     on the other one. The copies of the next tiles are in flight during the conversion, and the conversion runs
//     during the math: the widen path instead waits for a tile's bytes, widens them in place and only then issues
//     the next tile's copies, all on the path to the barrier the math waits for (examples/TUNING.md, "fp8 KV caches").
//   - the loops whose math warps load their own tiles (run_tiles_fp8, tree_verify_mainloop_fp8.cuh): the math
//     warps convert tile kt + 1 while the tensor cores compute tile kt's GEMMs.
// This is FlashInfer's design for a 16-bit query over an fp8 cache (its FA3 kernels' producer warpgroup dequantizes
// staged fp8 tiles into the 16-bit layout the unchanged consumer reads), with this kernel's gathers and tree mask.
//
// A landing tile is [BLOCK_N rows][D bytes], row-major, unswizzled: 16-byte chunk c of row r at byte 16 (r D/16 + c),
// so a warp's copies and its reads of the ring each cover contiguous bytes. The thread that copies a chunk converts
// it (into T chunks 2c and 2c + 1 of the row), so it waits only for its own copies (cp.async groups), with no barrier
// between landing and conversion. Draft rows (q's dtype) skip the ring: the converting thread copies them into the T
// tile. Rows past the keys land as zeros and convert to zeros.
#pragma once

#include "tree_verify_cta.cuh"

namespace kdtree::cuda {

// Calls f(row, c) for this copier's 16-byte chunks of an fp8 tile of BLOCK_N rows of kD bytes, kCopiers threads in
// all: consecutive copiers take consecutive chunks. Where kCopiers is a multiple of the chunks a row has, a copier
// takes the same chunk c of every row it has, kCopiers / (kD / 16) rows apart, kUnroll rows an iteration (the
// gathering warpgroup has few registers: unrolled whole, its conversion loop spilled 876 bytes at 56).
template <class C>
template <int kD, int kCopiers, int kUnroll, class F>
__device__ __forceinline__ void TreeVerifyCta<C>::for_each_fp8_chunk(int copier, F&& f) {
  constexpr int kChunks = kD / 16;
  if constexpr (kCopiers % kChunks == 0) {
    constexpr int kRowsPerPass = kCopiers / kChunks;
    const int c = copier % kChunks, row0 = copier / kChunks;
#pragma unroll kUnroll
    for (int row = 0; row < C::kBlockN; row += kRowsPerPass)
      if (C::kBlockN % kRowsPerPass == 0 || row0 + row < C::kBlockN) f(row0 + row, c);
  } else {
#pragma unroll 1
    for (int idx = copier; idx < C::kBlockN * kChunks; idx += kCopiers) f(idx / kChunks, idx % kChunks);
  }
}

// This copier's copies of a tile into the landing tile `land`, from the row pointers staged in `rows`: fp8 cache rows
// (tagged, fp8_cache.cuh) as 16-byte chunks, a missing row (nullptr) as zeros, draft rows not at all (convert_fp8_tile
// copies them). The caller commits the group.
template <class C>
template <int kD, int kCopiers, int kLandUnroll>
__device__ __forceinline__ void TreeVerifyCta<C>::land_fp8_tile(const T* const* rows, uint8_t* land, int copier) {
  constexpr int kChunks = kD / 16;
  for_each_fp8_chunk<kD, kCopiers, kLandUnroll>(copier, [&](int row, int c) {
    const T* const src = rows[row];
    uint8_t* const dst = land + (row * kChunks + c) * 16;
    if (src == nullptr) cp_async_16(dst, dst_fallback(), false);  // zeros; reads nothing
    else if (is_fp8_row(src)) cp_async_16(dst, fp8_row_bytes(src) + c * 16, true);
  });
}

// After this copier's landing copies of tile kt arrived: its chunks of the tile into the T tile `dst` (BLOCK_N rows,
// swizzled like every T tile), each 16 fp8 values exactly (fp8_cache.cuh); for a draft row, the same 16 values copied
// from k_draft/v_draft (kV: V's rows), waited for here. Every group of this thread's copies is complete when a tile
// has draft rows (cp.async groups complete in order): the ring's next tiles land before the conversion starts, which
// costs only tiles that reach the draft rows, a request's last ones. The caller makes the tile visible to the tensor
// cores (fence_proxy_async) and hands it over.
template <class C>
template <int kD, int kCopiers, bool kV, int kConvertUnroll>
__device__ __forceinline__ void TreeVerifyCta<C>::convert_fp8_tile(const RequestInfo& r, int h, int kt,
                                                                   const uint8_t* land, T* dst, int copier) {
  constexpr int kChunks = kD / 16;
  auto chunk_at = [&](int row, int c) { return dst + swizzle(row, c, C::kBlockN) * 8; };  // T chunk c (8 values)
  const int key0 = kt * C::kBlockN;
  const bool drafts = kt >= first_draft_tile(r);
  if (drafts) {
    for_each_fp8_chunk<kD, kCopiers, 1>(copier, [&](int row, int c) {
      const int j = key0 + row;
      if (j < r.prefix_len || j >= r.kv_len) return;
      const KeyRows kr = key_rows(r, h, j);
      const T* const src = (kV ? kr.v : kr.k) + c * 16;
      cp_async_16(chunk_at(row, 2 * c), src, true);
      cp_async_16(chunk_at(row, 2 * c + 1), src + 8, true);
    });
    cp_async_commit();
    cp_async_wait<0>();
  }
  const bool e5m2 = p.kv_fp8_e5m2;
  for_each_fp8_chunk<kD, kCopiers, kConvertUnroll>(copier, [&](int row, int c) {
    const int j = key0 + row;
    if (drafts && j >= r.prefix_len && j < r.kv_len) return;  // a draft row, copied above
    uint4 lo, hi;
    fp8x16_to_chunks<T>(*reinterpret_cast<const uint4*>(land + (row * kChunks + c) * 16), e5m2, lo, hi);
    *reinterpret_cast<uint4*>(chunk_at(row, 2 * c)) = lo;
    *reinterpret_cast<uint4*>(chunk_at(row, 2 * c + 1)) = hi;
  });
}

// The gathering warpgroup's side of a segment on the fp8 overlap path (GQA on wgmma, run_tiles_overlapped): as
// produce, kCopiersPerSide gatherers fill the K (kV: V) T tiles, tile t of the CTA into buffer t % STAGES, announced
// on full and handed back on empty; in between, each tile passes through the landing ring, L = kLandStagesK (V)
// tiles deep. A copier keeps L groups of its copies in flight: it waits for its copies of tile t, waits for buffer
// t % STAGES, converts its chunks of tile t into it and announces it, then issues its copies of tile t + L into the
// ring slot that tile t has just left. Its loops are rolled (the gatherers have kLoadRegs = 56); the hd64/hd128 wgmma
// kernels spill 12-40 bytes on sm_90a either way (examples/TUNING.md, "fp8 KV caches": not yet traced).
template <class C>
template <bool kV>
__device__ __forceinline__ void TreeVerifyCta<C>::produce_fp8(const Segment& sg, int copier) {
  static_assert(C::kFp8Overlap && C::kOverlapPv, "the fp8 landing ring of the gathering warpgroup (GQA on wgmma)");
  constexpr int kCopiers = kCopiersPerSide;
  constexpr int kRowsEach = (C::kBlockN + kCopiers - 1) / kCopiers;
  constexpr int kD = kV ? C::kDv : C::kDqk;
  constexpr int kLand = kV ? C::kLandStagesV : C::kLandStagesK;
  constexpr int kLandTile = kV ? C::kLandTileV : C::kLandTileK;
  constexpr int kTileElems = C::kBlockN * kD;
  T* const tiles = kV ? sV : sK;
  uint8_t* const land = kV ? sLandV : sLandK;
  const T** const slots = kV ? sVRow : sKRow;
  uint64_t* const full = kV ? full_v : full_k;
  uint64_t* const empty = kV ? empty_v : empty_k;
  const RequestInfo& r = sg.r;
  const int kt0 = sg.kt0, kt1 = sg.kt1;
  auto has_key = [&](int e) { return C::kBlockN % kCopiers == 0 || copier + e * kCopiers < C::kBlockN; };
  // This copier's keys of tile kt: where they are, read a tile ahead, so the index reads hide behind the copies.
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
  // Tile kt's copies into ring slot t % L, from row pointers staged in slot t % 2 (last read by every copier before
  // the barrier of the tile issued in between); a group either way, so that every wait below counts L groups.
  auto issue = [&](int kt) {
    if (kt < kt1) {
      const int t = sg.tiles_before + kt - kt0;
      const T** const rows = slots + (t % 2) * C::kBlockN;
#pragma unroll
      for (int e = 0; e < kRowsEach; ++e)
        if (has_key(e)) rows[copier + e * kCopiers] = next[e];
      named_barrier_sync<kCopiers>(kLoadBarrier + kV);  // the staged rows are visible to every copier
      land_fp8_tile<kD, kCopiers, 1>(rows, land + (t % kLand) * kLandTile, copier);
      rows_of(kt + 1, next);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kLand; ++i) issue(kt0 + i);
  for (int kt = kt0; kt < kt1; ++kt) {
    const int t = sg.tiles_before + kt - kt0, buf = t % C::kStages;
    cp_async_wait<kLand - 1>();  // this copier's copies of tile kt
    mbarrier_wait(empty + buf, phase_parity(t) ^ 1);  // a fresh barrier's "previous phase" counts as done
    convert_fp8_tile<kD, kCopiers, kV, 1>(r, sg.h, kt, land + (t % kLand) * kLandTile, tiles + buf * kTileElems,
                                       copier);
    fence_proxy_async();  // the converted chunks, visible to wgmma
    mbarrier_arrive(full + buf);
    issue(kt + kLand);
  }
}

}  // namespace kdtree::cuda
