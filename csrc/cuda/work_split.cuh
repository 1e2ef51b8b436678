// Device-side work split. A row tile is BLOCK_M packed query rows (draft tokens x the query heads of one
// KV head) of one request; its keys are cut into equal pieces at the same offsets for every row tile of the
// request, so the CTAs that run the row tiles of one KV head read each KV tile at about the same time and
// all but the first find it in L2. Every CTA scans the indptr arrays, derives the same prefix sums and the
// same pieces, and takes an equal share of them. The grid is a function of the device and shapes only, so one
// captured launch balances whatever lengths a replay brings.
#pragma once

#include "tree_verify_params.h"

namespace kdtree::cuda {

struct RequestInfo {
  int qo_start;    // first query row
  int tree_len;    // T_b
  int rows;        // packed query rows per KV head: T_b * G
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
  r.rows = r.tree_len * p.group;
  r.m_tiles = r.tree_len == 0 ? 0 : (r.rows + kBlockM - 1) / kBlockM;
  r.n_tiles = (r.kv_len + kBlockN - 1) / kBlockN;
  return r;
}

// Block-wide, over requests b: the exclusive scan of f(b).x into out[0..B] (out[B] = total; global memory,
// read back by the same block after the scan's barriers), and the sum of f(b).y. All threads call it.
template <int kThreads, typename F>
__device__ longlong2 scan_requests(int batch, long long* out, F f) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block of whole warps");
  __shared__ longlong2 warp_sums[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  longlong2 carry = make_longlong2(0, 0);
  for (int base = 0; base < batch; base += kThreads) {
    const int b = base + threadIdx.x;
    const longlong2 own = b < batch ? f(b) : make_longlong2(0, 0);
    longlong2 v = own;  // inclusive warp scan
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const long long x = __shfl_up_sync(0xffffffffu, v.x, off), y = __shfl_up_sync(0xffffffffu, v.y, off);
      if (lane >= off) v.x += x, v.y += y;
    }
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    long long before = carry.x;
    for (int w = 0; w < warp; ++w) before += warp_sums[w].x;
    if (b < batch) out[b] = before + v.x - own.x;
    for (int w = 0; w < kThreads / 32; ++w) carry.x += warp_sums[w].x, carry.y += warp_sums[w].y;
    __syncthreads();
  }
  if (threadIdx.x == 0) out[batch] = carry.x;
  __syncthreads();
  return carry;
}

// One piece of the work split as a CTA runs it: row tile `row_tile` of the batch (KV head h, m tile mt of
// request r) over KV tiles [kt0, kt1); piece `split` of the `pieces` that cover the row tile's keys, whose
// partials are in slots first_piece .. first_piece + pieces - 1. tiles_before counts the KV tiles of the CTA's
// earlier segments as run (turn_tiles: a warp-specialized CTA's position in its ring of K/V buffers).
struct Segment {
  RequestInfo r;
  int h, mt, kt0, kt1, row_tile;
  long long first_piece;
  int pieces, split;
  int tiles_before;
  // The row tile's two pieces run on the two CTAs of a cluster, piece k on rank k, at the same time: they merge
  // through distributed shared memory (configurations with kClusterPairs).
  bool cluster_pair;
};

// How a request's row tiles are cut. Each row tile gets its share of the grid, floor(n_tiles * grid / units)
// pieces, so that the pieces of all row tiles number at most about one per CTA; at least 1, and none shorter
// than min_units_per_cta KV tiles (a split costs a partial write and a merge). Piece k takes the KV tiles
// [k * chunk, (k + 1) * chunk) with chunk = ceil(n_tiles / pieces); the count is cut to the pieces that then
// hold tiles (33 tiles in 8 pieces of 5 leave the eighth empty), which keeps chunk the same.
struct PieceSplit {
  int pieces;  // per row tile (1 for a request without keys)
  int chunk;   // KV tiles per piece, the last one's possibly fewer
};

__device__ __forceinline__ PieceSplit piece_split(const RequestInfo& r, long long units, int grid, int min_units) {
  // In 32 bits when the operands fit, as they do for any practical batch: this code runs once per call, from a
  // cold instruction cache, and a 64-bit division is a subroutine of about 70 instructions.
  const long long numerator = static_cast<long long>(r.n_tiles) * grid;
  const long long share = units <= 0 ? 1
                          : (numerator | units) <= 0xffffffffll
                              ? static_cast<uint32_t>(numerator) / static_cast<uint32_t>(units)
                              : numerator / units;
  const int most = max(1, r.n_tiles / max(min_units, 1));
  const int wanted = static_cast<int>(min(max(share, 1ll), static_cast<long long>(most)));
  const int chunk = (r.n_tiles + wanted - 1) / wanted;
  return chunk > 0 ? PieceSplit{(r.n_tiles + chunk - 1) / chunk, chunk} : PieceSplit{1, 0};
}

// The work split as every CTA derives it, in the CTA's own part of the workspace: kScheduleArrays arrays of
// B+1 int64 words, piece_start, then tile_start, then cut (a PieceSplit per word).
struct Schedule {
  long long* piece_start;  // [B+1] first piece of each request
  long long* tile_start;   // [B+1] first row tile of each request
  PieceSplit* cut;         // [B] how each request's row tiles are cut
  long long pieces;        // pieces of the whole batch
};

static_assert(sizeof(PieceSplit) == sizeof(long long) && alignof(PieceSplit) <= alignof(long long),
              "a cut takes one word of the schedule");
constexpr int kScheduleArrays = 3;

template <int kThreads, int kBlockM, int kBlockN>
__device__ Schedule build_schedule(const TreeVerifyParams& p) {
  long long* const piece_start = p.schedule + static_cast<int64_t>(blockIdx.x) * kScheduleArrays * (p.batch + 1);
  long long* const tile_start = piece_start + p.batch + 1;
  PieceSplit* const cut = reinterpret_cast<PieceSplit*>(piece_start + 2 * (p.batch + 1));
  // Two passes: the row tiles (and the units, summed), then the pieces, which depend on the units' total.
  const long long units = scan_requests<kThreads>(p.batch, tile_start, [&](int b) {
    const RequestInfo r = request_info<kBlockM, kBlockN>(p, b);
    const long long row_tiles = static_cast<long long>(p.num_kv_heads) * r.m_tiles;
    return make_longlong2(row_tiles, row_tiles * r.n_tiles);
  }).y;
  const long long pieces = scan_requests<kThreads>(p.batch, piece_start, [&](int b) {
    const RequestInfo r = request_info<kBlockM, kBlockN>(p, b);
    cut[b] = piece_split(r, units, gridDim.x, p.min_units_per_cta);
    return make_longlong2(static_cast<long long>(p.num_kv_heads) * r.m_tiles * cut[b].pieces, 0);
  }).x;
  return {piece_start, tile_start, cut, pieces};
}

// Last b with start[b] <= u (a request with work when u < start[B]).
__device__ __forceinline__ int find_request(const long long* start, int batch, long long u) {
  int lo = 0, hi = batch;  // invariant: start[lo] <= u < start[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (start[mid] <= u) lo = mid; else hi = mid;
  }
  return lo;
}

}  // namespace kdtree::cuda
