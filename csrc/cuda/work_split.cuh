// Device-side work split. Work is counted in units of (row tile, KV tile): a row tile is BLOCK_M packed
// query rows (draft tokens x the query heads of one KV head) of one request; a KV tile is BLOCK_N keys.
// Every CTA scans the indptr arrays, derives the same prefix sums, and takes an equal, contiguous range
// of units: long prefixes split across CTAs, short ones share a CTA. The grid is a function of the device
// only, so one captured launch balances whatever lengths a replay brings.
#pragma once

#include "tree_verify_params.h"

namespace kdtree::cuda {

struct RequestInfo {
  int qo_start;    // first query row
  int tree_len;    // T_b
  int prefix_len;  // L_b
  int kv_len;      // L_b + T_b: keys [0, L_b) are the prefix, [L_b, kv_len) the draft tokens
  int kv_start;    // first entry in kv_indices
  int m_tiles;     // row tiles per KV head
  int n_tiles;     // KV tiles
};

template <int kBlockM, int kBlockN>
__device__ __forceinline__ RequestInfo request_info(const TreeVerifyParams& p, int b) {
  RequestInfo r;
  // Clamped so that malformed indptrs (checked only in debug mode on CUDA) cannot read out of bounds.
  const int qo0 = min(max(p.qo_indptr[b], 0), p.num_tokens);
  const int qo1 = min(max(p.qo_indptr[b + 1], qo0), p.num_tokens);
  const int kv0 = max(p.kv_indptr[b], 0);
  const int slots = max(p.kv_indptr[b + 1] - kv0, 0);
  r.qo_start = qo0;
  r.tree_len = qo1 - qo0;
  r.kv_start = kv0;
  r.kv_len = p.k_draft == nullptr ? slots : slots + r.tree_len;
  r.prefix_len = max(r.kv_len - r.tree_len, 0);
  r.m_tiles = r.tree_len == 0 ? 0 : (r.tree_len * p.group + kBlockM - 1) / kBlockM;
  r.n_tiles = (r.kv_len + kBlockN - 1) / kBlockN;
  return r;
}

// Fills unit_start[0..B] (exclusive prefix sums of Hkv * m_tiles * n_tiles) and tile_start[0..B]
// (of Hkv * m_tiles) in shared memory. All threads of the block call it.
template <int kThreads, int kBlockM, int kBlockN>
__device__ void build_schedule(const TreeVerifyParams& p, long long* unit_start, int* tile_start) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block of whole warps");
  __shared__ long long warp_units[kThreads / 32];
  __shared__ int warp_tiles[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  long long carry_units = 0;
  int carry_tiles = 0;
  for (int base = 0; base < p.batch; base += kThreads) {
    const int b = base + threadIdx.x;
    long long units = 0;
    int tiles = 0;
    if (b < p.batch) {
      const RequestInfo r = request_info<kBlockM, kBlockN>(p, b);
      tiles = p.num_kv_heads * r.m_tiles;
      units = static_cast<long long>(tiles) * r.n_tiles;
    }
    long long u = units;  // inclusive warp scan
    int t = tiles;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const long long uo = __shfl_up_sync(0xffffffffu, u, off);
      const int to = __shfl_up_sync(0xffffffffu, t, off);
      if (lane >= off) u += uo, t += to;
    }
    if (lane == 31) warp_units[warp] = u, warp_tiles[warp] = t;
    __syncthreads();
    long long before_units = carry_units;
    int before_tiles = carry_tiles;
    for (int w = 0; w < warp; ++w) before_units += warp_units[w], before_tiles += warp_tiles[w];
    if (b < p.batch) {
      unit_start[b] = before_units + u - units;
      tile_start[b] = before_tiles + t - tiles;
    }
    for (int w = 0; w < kThreads / 32; ++w) carry_units += warp_units[w], carry_tiles += warp_tiles[w];
    __syncthreads();
  }
  if (threadIdx.x == 0) unit_start[p.batch] = carry_units, tile_start[p.batch] = carry_tiles;
  __syncthreads();
}

// Last b with unit_start[b] <= u (a request with work when u < unit_start[B]).
__device__ __forceinline__ int find_request(const long long* unit_start, int batch, long long u) {
  int lo = 0, hi = batch;  // invariant: unit_start[lo] <= u < unit_start[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (unit_start[mid] <= u) lo = mid; else hi = mid;
  }
  return lo;
}

}  // namespace kdtree::cuda
