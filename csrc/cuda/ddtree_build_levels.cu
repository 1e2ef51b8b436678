// ddtree_build_tree on CUDA, level-synchronous: one CTA per request finds the budget best paths with a few dozen
// block-wide steps instead of one serial pop per node (the one-warp kernel in ddtree.cu: 0.55-0.68 µs a node on
// the H200). The algorithm, why it reproduces the heap's tree bit for bit (ties included), and its constants are
// in kdtree_ops/ddtree/levels_reference.py, a NumPy model of this file that the CPU suite holds equal to the CPU
// op. In short:
//   1. Level d -> d+1: each stored node of depth d (a blocked slice of them per thread) counts by binary search
//      its children whose order key is >= the threshold t (a prefix of its sorted row); one block scan places
//      them after the stored nodes, in parent then rank order, so storage order is the op's (depth, rank tuple)
//      order among equal scores.
//   2. Past the capacity C, a prune: a radix selection (11, 11, 10 bits, warp-aggregated shared-memory
//      histograms) over the stored nodes and the level's candidates (generated again from their parents, never
//      stored) finds a cut that keeps a head of the op's order holding at least `budget` nodes (at most Ct,
//      unless ties force the exact cut); the kept nodes are compacted in place, parents renumbered, and t rises.
//   3. After the last level: the exact cut to `budget` nodes, a bitonic sort of (~key, storage index) — the op's
//      order — and the outputs: tokens, parents, depths and the ancestor mask rows.
// Scores are float32 sums parent + own log-prob (__fadd_rn: never contracted), the CPU's additions. Shared memory:
// K*k*4 + 10 B per stored node + a scratch of max(8 KB, 16 B a thread): 58 KB at K=16, k=32, budget 1024.
// Capture-safe: grid from shapes, no host sync, the caller's stream and device guard.
#include "ddtree_build_levels.h"

#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "block_primitives.cuh"
#include "ddtree_order.h"
#include "launch_class.h"
#include "smem_optin.cuh"

namespace kdtree::cuda {
namespace {

constexpr int kItems = 4;            // stored nodes (and parents of a level) per thread, at most
constexpr int kMaxCapacity = 4096;   // C's ceiling: kItems per thread of the 1024-thread configuration
constexpr int kMaxBudget = 2047;     // the sort's scratch holds 2048 keys
constexpr int kMaxPositions = 255;   // depth in a byte of a node's meta
constexpr int kMaxTopK = 256;        // rank in a byte
constexpr uint32_t kRootParent = 0xFFFFu;  // the parent field of the root's children
constexpr int kHistBins = 2048;
// The selection's digits, top bits first (levels_reference.py: RADIX_DIGITS): bits 31..21, 20..10, 9..0.
__host__ __device__ constexpr int radix_shift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
__host__ __device__ constexpr int radix_bits(int pass) { return pass == 2 ? 10 : 11; }

// C and Ct (levels_reference.py: capacity_for, keep_target).
__host__ __device__ constexpr int capacity_for(int budget) { return 4 * budget < kMaxCapacity ? 4 * budget : kMaxCapacity; }
__device__ int keep_target(int budget, int capacity) { return min(capacity, budget + budget / 2); }

// A stored node's meta: parent storage index (16 bits, kRootParent for depth 1), depth (8), rank (8).
__device__ uint32_t pack_meta(uint32_t parent, int depth, int rank) {
  return parent << 16 | static_cast<uint32_t>(depth) << 8 | static_cast<uint32_t>(rank);
}

__host__ __device__ constexpr size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// Dynamic shared memory. scratch: the selection's histogram, then the sort's keys (and its exchange buffers),
// then the output's parent indices.
struct LevelsSmem {
  char* scratch;     // max(kHistBins * 4, 16 * threads) bytes
  float* score;      // [C]
  uint32_t* meta;    // [C]
  float* lp;         // [K * k]
  uint16_t* remap;   // [C] a prune's old -> new storage index; then storage index -> output node

  __host__ __device__ static constexpr size_t scratch_bytes(int threads) {
    return 16 * static_cast<size_t>(threads) > kHistBins * 4 ? 16 * static_cast<size_t>(threads) : kHistBins * 4;
  }
  static size_t bytes(int lp_count, int capacity, int threads) {
    return scratch_bytes(threads) + 2 * align16(4 * static_cast<size_t>(capacity)) +
           align16(4 * static_cast<size_t>(lp_count)) + align16(2 * static_cast<size_t>(capacity));
  }
  __device__ static LevelsSmem carve(char* smem, int lp_count, int capacity, int threads) {
    LevelsSmem t;
    t.scratch = smem;
    char* p = smem + scratch_bytes(threads);
    t.score = reinterpret_cast<float*>(p);
    p += align16(4 * static_cast<size_t>(capacity));
    t.meta = reinterpret_cast<uint32_t*>(p);
    p += align16(4 * static_cast<size_t>(capacity));
    t.lp = reinterpret_cast<float*>(p);
    p += align16(4 * static_cast<size_t>(lp_count));
    t.remap = reinterpret_cast<uint16_t*>(p);
    return t;
  }
};

struct Control {
  int scan[2][32];  // warp totals, double-buffered so that back-to-back scans need one barrier each
  int bucket, higher, in_bucket;  // a selection pass's result
};

// This thread's parents of the level being expanded (a blocked slice): scores and passing-children counts.
struct Parents {
  int first = 0, n = 0;
  float s[kItems];
  int cnt[kItems];
};

// This thread's stored nodes (a blocked slice), loaded for a cut.
struct Stored {
  int first = 0, n = 0;
  float s[kItems];
  uint32_t meta[kItems];
};

struct Cut {
  uint32_t u;  // keep the keys > u ...
  int m;       // ... and the first m (storage order, then candidate order) equal to u
};

// Where a cut puts the kept nodes: stored ones at s_new (-1: dropped), then each parent's first v_keep children.
struct Placement {
  int s_new[kItems];
  int v_keep[kItems], v_at[kItems];
  int s_total, v_total;
};

__device__ uint32_t child_key(float parent_score, const float* row, int rank) {
  return ddtree_score_key(__fadd_rn(parent_score, row[rank]));
}

// Children of a node scoring s among ranks < limit whose key is >= t: a prefix of the sorted row.
__device__ int count_at_least(float s, const float* row, int limit, uint32_t t) {
  if (limit == 0 || child_key(s, row, 0) < t) return 0;  // the common answer, in one probe
  int lo = 1, hi = limit;  // ranks < lo pass, ranks >= hi fail
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (child_key(s, row, mid) >= t) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

template <int kThreads>
struct LevelsBuild {
  LevelsSmem t;
  Control* ctl;
  BlockScan<kThreads> scanner;
  int positions, top_k, budget, capacity, target;
  // Block-uniform state: every thread computes the same values from block-wide results.
  int stored = 0, level_begin = 0;
  uint32_t threshold = 1;  // every key passes (the smallest, -inf's, is 0x007FFFFF)

  __device__ int scan(int value, int* total) { return scanner.exclusive(value, total); }

  // This thread's blocked slice of `count` items (count <= kItems * kThreads).
  __device__ static void slice(int count, int* first, int* n) {
    const int per = (count + kThreads - 1) / kThreads;
    *first = threadIdx.x * per;
    *n = max(0, min(per, count - *first));
  }

  __device__ Stored load_stored() const {
    Stored st;
    slice(stored, &st.first, &st.n);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      st.s[j] = j < st.n ? t.score[st.first + j] : 0.0f;
      st.meta[j] = j < st.n ? t.meta[st.first + j] : 0u;
    }
    return st;
  }

  // The cut keeping a head of the op's order over the stored nodes and the level's candidates: >= budget nodes,
  // <= keep_at_most unless the budget-th key's ties force the exact cut (then exactly budget).
  __device__ Cut select(const Stored& st, const Parents& par, const float* row, int keep_at_most) {
    uint32_t* hist = reinterpret_cast<uint32_t*>(t.scratch);
    uint32_t prefix = 0, prefix_mask = 0;
    int above = 0;  // nodes in the buckets above the prefix's, over the earlier passes
#pragma unroll 1
    for (int pass = 0; pass < 3; ++pass) {
      const int shift = radix_shift(pass), bins = 1 << radix_bits(pass);
      const uint32_t digit_mask = bins - 1;
      for (int i = threadIdx.x; i < bins; i += kThreads) hist[i] = 0;
      __syncthreads();
      auto add = [&](bool valid, uint32_t key) {
        block_hist_add(hist, valid && (key & prefix_mask) == prefix ? static_cast<int>((key >> shift) & digit_mask) : -1);
      };
#pragma unroll
      for (int j = 0; j < kItems; ++j) add(j < st.n, ddtree_score_key(st.s[j]));
#pragma unroll
      for (int j = 0; j < kItems; ++j) {  // candidates, generated again; warp-uniform trip counts for hist_add
        const int c = j < par.n ? par.cnt[j] : 0;
        const int most = static_cast<int>(__reduce_max_sync(kBlockFullWarp, static_cast<unsigned>(c)));
        for (int r = 0; r < most; ++r) add(r < c, r < c ? child_key(par.s[j], row, r) : 0u);
      }
      __syncthreads();
      // Thread 0 owns the highest bins: an exclusive scan of the owned sums is the count above each range.
      const int per = bins / kThreads, top = bins - threadIdx.x * per;
      int local = 0;
      for (int b = top - per; b < top; ++b) local += static_cast<int>(hist[b]);
      int all;
      int run = above + scan(local, &all);
      if (run < budget && run + local >= budget) {  // the budget-th key is in this thread's bins
        for (int b = top - 1; b >= top - per; --b) {
          const int h = static_cast<int>(hist[b]);
          if (run + h >= budget) {
            ctl->bucket = b;
            ctl->higher = run;
            ctl->in_bucket = h;
            break;
          }
          run += h;
        }
      }
      __syncthreads();
      const int higher = ctl->higher;
      const uint32_t lowest = prefix | static_cast<uint32_t>(ctl->bucket) << shift;  // the bucket's smallest key
      if (higher + ctl->in_bucket <= keep_at_most) return {lowest - 1, 0};
      if (pass == 2) return {lowest, budget - higher};  // lowest is the budget-th key: cut among its ties
      above = higher;
      prefix = lowest;
      prefix_mask |= digit_mask << shift;
    }
    return {0, 0};  // unreachable
  }

  // Where cut `c` puts the kept stored nodes and candidates (storage order kept, candidates after the nodes).
  __device__ Placement place(const Stored& st, const Parents& par, const float* row, Cut c) {
    Placement pl;
    int above[kItems], tied[kItems];  // per parent: candidates > u, and == u (tie cuts only)
    int s_rank = 0, v_rank = 0;       // tie ranks of this thread's first tied node and candidate
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      above[j] = j < par.n ? count_at_least(par.s[j], row, par.cnt[j], c.u + 1) : 0;
      tied[j] = j < par.n && c.m > 0 ? count_at_least(par.s[j], row, par.cnt[j], c.u) - above[j] : 0;
    }
    if (c.m > 0) {  // block-uniform
      int s_tied = 0, v_tied = 0, s_all, v_all;
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        s_tied += j < st.n && ddtree_score_key(st.s[j]) == c.u;
        v_tied += tied[j];
      }
      s_rank = scan(s_tied, &s_all);
      v_rank = s_all + scan(v_tied, &v_all);
    }
    bool keep[kItems];
    int s_keep = 0, v_keep = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const uint32_t key = ddtree_score_key(st.s[j]);
      keep[j] = j < st.n && (key > c.u || (key == c.u && s_rank++ < c.m));
      s_keep += keep[j];
      pl.v_keep[j] = above[j] + min(max(c.m - v_rank, 0), tied[j]);
      v_rank += tied[j];
      v_keep += pl.v_keep[j];
    }
    // Kept totals are <= max(Ct, budget) <= C <= 4096: both fit 16 bits of one scan.
    int all;
    const int before = scan(v_keep << 16 | s_keep, &all);
    pl.s_total = all & 0xFFFF;
    pl.v_total = all >> 16;
    int s_at = before & 0xFFFF, v_at = pl.s_total + (before >> 16);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      pl.s_new[j] = keep[j] ? s_at++ : -1;
      pl.v_at[j] = v_at;
      v_at += pl.v_keep[j];
    }
    return pl;
  }

  // Level d's candidates do not fit: cut stored nodes and candidates, compact in place, store the kept candidates.
  __device__ void prune(int d, const float* row, const Parents& par) {
    const Stored st = load_stored();
    const Cut c = select(st, par, row, target);
    const Placement pl = place(st, par, row, c);
#pragma unroll
    for (int j = 0; j < kItems; ++j)
      if (pl.s_new[j] >= 0) t.remap[st.first + j] = static_cast<uint16_t>(pl.s_new[j]);
    __syncthreads();  // the remap is whole, and every read of the old nodes is done
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (pl.s_new[j] < 0 || pl.s_new[j] >= capacity) continue;  // >= C: only for rows the contract forbids
      const uint32_t p = st.meta[j] >> 16;
      t.score[pl.s_new[j]] = st.s[j];
      t.meta[pl.s_new[j]] = (p == kRootParent ? p : t.remap[p]) << 16 | (st.meta[j] & 0xFFFFu);
    }
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (pl.v_keep[j] == 0) continue;
      const uint32_t parent = d == 0 ? kRootParent : t.remap[level_begin + par.first + j];
      for (int r = 0, o = pl.v_at[j]; r < pl.v_keep[j] && o < capacity; ++r, ++o) {
        t.score[o] = __fadd_rn(par.s[j], row[r]);
        t.meta[o] = pack_meta(parent, d + 1, r);
      }
    }
    level_begin = min(pl.s_total, capacity);
    stored = min(pl.s_total + pl.v_total, capacity);
    threshold = max(threshold, c.u + 1);
  }

  // Steps 1 and 2: every level, with prunes where the capacity runs out.
  __device__ void expand() {
#pragma unroll 1
    for (int d = 0; d < positions; ++d) {
      const int count = d == 0 ? 1 : stored - level_begin;  // depth-d nodes; level 0 is the root
      if (count == 0) break;
      const float* row = t.lp + d * top_k;
      Parents par;
      slice(count, &par.first, &par.n);
      int mine = 0;
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        par.s[j] = j < par.n && d > 0 ? t.score[level_begin + par.first + j] : 0.0f;
        par.cnt[j] = j < par.n ? count_at_least(par.s[j], row, top_k, threshold) : 0;
        mine += par.cnt[j];
      }
      int total;
      const int before = scan(mine, &total);
      if (total == 0) break;
      if (stored + total > capacity) {
        prune(d, row, par);
      } else {
        int o = stored + before;
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
          const uint32_t parent = d == 0 ? kRootParent : static_cast<uint32_t>(level_begin + par.first + j);
          for (int r = 0; r < par.cnt[j]; ++r, ++o) {
            t.score[o] = __fadd_rn(par.s[j], row[r]);
            t.meta[o] = pack_meta(parent, d + 1, r);
          }
        }
        level_begin = stored;
        stored += total;
      }
      __syncthreads();  // the level's nodes are written before the next level reads them
    }
  }

  // Step 3's cut and sort: keys[j] (scratch) = (~key << 32 | storage index) of the op's j-th node, j < budget.
  __device__ void cut_and_sort() {
    uint64_t* keys = reinterpret_cast<uint64_t*>(t.scratch);
    const Stored st = load_stored();
    Parents none;  // no candidates
    const Cut c = stored > budget ? select(st, none, nullptr, budget) : Cut{0u, 0};  // key > 0: every node
    const Placement pl = place(st, none, nullptr, c);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (pl.s_new[j] >= 0 && pl.s_new[j] < budget)
        keys[pl.s_new[j]] = static_cast<uint64_t>(~ddtree_score_key(st.s[j])) << 32 | static_cast<uint32_t>(st.first + j);
    }
    block_bitonic_sort<kThreads>(keys, budget);
  }
};

template <int kThreads>
__global__ void __launch_bounds__(kThreads, 1) build_levels_kernel(
    const float* __restrict__ logprobs,  // [B, K, k]
    const int64_t* __restrict__ tokens,  // [B, K, k]
    const int64_t* __restrict__ roots,   // [B]
    int64_t* __restrict__ tree_tokens,   // [B, nodes]
    int32_t* __restrict__ parents,       // [B, nodes]
    int32_t* __restrict__ depths,        // [B, nodes]
    int32_t* __restrict__ tree_mask,     // [B * nodes, words]
    int positions, int top_k, int nodes, int words) {
  extern __shared__ __align__(16) char smem[];
  __shared__ Control ctl;
  const int lp_count = positions * top_k, budget = nodes - 1, capacity = capacity_for(budget);
  LevelsBuild<kThreads> build;
  build.t = LevelsSmem::carve(smem, lp_count, capacity, kThreads);
  build.ctl = &ctl;
  build.scanner.sums = ctl.scan;
  build.positions = positions;
  build.top_k = top_k;
  build.budget = budget;
  build.capacity = capacity;
  build.target = keep_target(budget, capacity);
  const int64_t b = blockIdx.x;
  for (int i = threadIdx.x; i < lp_count; i += kThreads) build.t.lp[i] = logprobs[b * lp_count + i];
  int32_t* mask = tree_mask + b * nodes * static_cast<int64_t>(words);
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(nodes) * words; i += kThreads) mask[i] = 0;  // bits later
  __syncthreads();

  uint32_t node_of[2] = {0, 0};  // storage index of this thread's output nodes j = threadIdx.x + i * kThreads
  if (budget > 0) {
    build.expand();
    build.cut_and_sort();
    const uint64_t* keys = reinterpret_cast<const uint64_t*>(build.t.scratch);
    for (int i = 0; i < 2; ++i) {
      const int j = threadIdx.x + i * kThreads;
      if (j >= budget) break;
      node_of[i] = min(static_cast<uint32_t>(keys[j]), static_cast<uint32_t>(capacity - 1));  // see below
      build.t.remap[node_of[i]] = static_cast<uint16_t>(j + 1);
    }
    __syncthreads();  // the output numbering is whole; the keys are read
  }
  int32_t* node_parent = reinterpret_cast<int32_t*>(build.t.scratch);  // [nodes], over the sort's keys
  const int64_t* request_tokens = tokens + b * lp_count;
  const int64_t out = b * nodes;
  for (int i = 0; i < 2; ++i) {
    const int j = threadIdx.x + i * kThreads;
    if (j >= budget) break;
    const uint32_t meta = build.t.meta[node_of[i]];
    const uint32_t p = meta >> 16;
    const int depth = static_cast<int>((meta >> 8) & 0xFFu), rank = static_cast<int>(meta & 0xFFu);
    // The clamps change nothing for inputs the op takes (rows sorted descending, <= 0: checked under
    // KDTREE_OPS_DEBUG=1); for others they keep every access in bounds and the mask walk below finite.
    const int parent = p == kRootParent || p >= static_cast<uint32_t>(capacity) ? 0 : min(static_cast<int>(build.t.remap[p]), j);
    const int position = min(max(depth, 1), positions) - 1;
    tree_tokens[out + j + 1] = request_tokens[position * top_k + min(rank, top_k - 1)];
    parents[out + j + 1] = parent;
    depths[out + j + 1] = depth;
    node_parent[j + 1] = parent;
  }
  if (threadIdx.x == 0) {
    tree_tokens[out] = roots[b];
    parents[out] = -1;
    depths[out] = 0;
    node_parent[0] = -1;
  }
  __syncthreads();
  // Row n: node n and its ancestors. Their indices decrease up the chain, so one word at a time (as ddtree.cu).
  for (int n = threadIdx.x; n < nodes; n += kThreads) {
    int32_t* row = mask + static_cast<int64_t>(n) * words;
    int word = n >> 5;
    uint32_t bits = 0;
    for (int a = n; a >= 0; a = node_parent[a]) {
      if ((a >> 5) != word) {
        row[word] = static_cast<int32_t>(bits);
        word = a >> 5;
        bits = 0;
      }
      bits |= 1u << (a & 31);
    }
    row[word] = static_cast<int32_t>(bits);
  }
}

bool serial_build_forced() {
  const char* v = std::getenv("KDTREE_OPS_SERIAL_TREE_BUILD");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

template <int kThreads>
void launch(const BuildTreeDims& dims, size_t smem, size_t limit, const at::Tensor& logprobs, const at::Tensor& tokens,
            const at::Tensor& root_tokens, at::Tensor& tree_tokens, at::Tensor& parents, at::Tensor& depths,
            at::Tensor& tree_mask) {
  constexpr auto kernel = build_levels_kernel<kThreads>;
  allow_dynamic_smem<kernel>(logprobs.get_device(), smem, "ddtree_build_tree",
                             "the level-synchronous build's log-probs, stored nodes and scratch", limit);
  kernel<<<static_cast<unsigned>(dims.batch), kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(
      logprobs.data_ptr<float>(), tokens.data_ptr<int64_t>(), root_tokens.data_ptr<int64_t>(),
      tree_tokens.data_ptr<int64_t>(), parents.data_ptr<int32_t>(), depths.data_ptr<int32_t>(),
      tree_mask.data_ptr<int32_t>(), static_cast<int>(dims.positions), static_cast<int>(dims.top_k),
      static_cast<int>(dims.nodes), static_cast<int>(dims.words));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

bool launch_build_tree_levels(const BuildTreeDims& dims, const at::Tensor& logprobs, const at::Tensor& tokens,
                              const at::Tensor& root_tokens, at::Tensor& tree_tokens, at::Tensor& parents,
                              at::Tensor& depths, at::Tensor& tree_mask) {
  const int64_t budget = dims.nodes - 1;
  if (budget > kMaxBudget || dims.positions > kMaxPositions || dims.top_k > kMaxTopK) return false;
  if (serial_build_forced()) return false;
  const int device = logprobs.get_device();
  if (!unverified_reason_on(kBuildLevelsFamily, "", device).empty()) return false;
  // 256 threads while the sort's keys fit one a thread (budget <= 256: cheaper barriers), else 1024.
  const int threads = budget <= 256 ? 256 : 1024;
  const size_t smem = LevelsSmem::bytes(static_cast<int>(dims.positions * dims.top_k),
                                        capacity_for(static_cast<int>(budget)), threads);
  const size_t limit = std::min<size_t>(limits_of(launch_class(device)).smem_per_block,
                                        at::cuda::getDeviceProperties(device)->sharedMemPerBlockOptin);
  if (smem + sizeof(Control) > limit) return false;  // e.g. K * k past 22K log-probs: the serial kernel decides
  if (threads == 256) launch<256>(dims, smem, limit, logprobs, tokens, root_tokens, tree_tokens, parents, depths, tree_mask);
  else launch<1024>(dims, smem, limit, logprobs, tokens, root_tokens, tree_tokens, parents, depths, tree_mask);
  return true;
}

}  // namespace kdtree::cuda
