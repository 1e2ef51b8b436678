// The tree mask, in one place: which of a KV tile's 64 columns one query row may see.
// Prefix columns are always visible; draft column j is visible iff bit j % 32 of word j / 32 of the query's
// tree_mask row is set; columns at or past the request's KV length are not.
#pragma once

#include <cstdint>

namespace kdtree::cuda {

// Bits [tree_start, tree_start + 64) of one packed mask row, as a 64-bit word (tree_start >= 0).
__device__ __forceinline__ uint64_t mask_window(const uint32_t* row, int words, int tree_start) {
  const int w = tree_start >> 5, shift = tree_start & 31;
  auto word = [&](int i) -> uint64_t { return i < words ? static_cast<uint64_t>(__ldg(row + i)) : 0ull; };
  const uint64_t low = word(w) | (word(w + 1) << 32);
  return shift == 0 ? low : (low >> shift) | (word(w + 2) << (64 - shift));
}

// Visibility of columns [tile_start, tile_start + 64) for the query whose mask row is `row`.
// Bit c set <=> column tile_start + c is visible. prefix_len = L_b, kv_len = L_b + T_b.
__device__ __forceinline__ uint64_t visible_columns(const uint32_t* row, int words, int tile_start, int prefix_len,
                                                    int kv_len) {
  const int tree_start = tile_start - prefix_len;  // tree index of column 0
  uint64_t bits;
  if (tree_start >= 0) {
    bits = mask_window(row, words, tree_start);
  } else {
    const int prefix_cols = -tree_start;  // leading prefix columns
    bits = prefix_cols >= 64 ? ~0ull : (((1ull << prefix_cols) - 1) | (mask_window(row, words, 0) << prefix_cols));
  }
  const int valid = kv_len - tile_start;
  return valid >= 64 ? bits : (valid <= 0 ? 0ull : bits & ((1ull << valid) - 1));
}

}  // namespace kdtree::cuda
