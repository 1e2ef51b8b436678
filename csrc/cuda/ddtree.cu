// CUDA impls of the DDTree round (schemas in csrc/ops.cpp, semantics in kdtree_ops/ddtree/ops.py, the CPU impls in
// csrc/cpu/ddtree.cpp produce the same bits). All three are capture-safe: grids from shapes only, no host sync,
// the current stream under a device guard; the value checks run only with KDTREE_OPS_DEBUG=1 outside capture.
//
// ddtree_build_tree: the level-synchronous build (ddtree_build_levels.cu) where it runs (its gate, its shapes);
// elsewhere this serial kernel, one CTA per request, which pops the best-first order one node at a time and so
// minimizes the latency of one pop:
//   - The frontier is indexed by tree node: node p's only live entry is its next child (rank next_child[p]), so
//     the frontier never holds more than `nodes` entries and a pop changes exactly two of them (the parent's
//     entry moves to its next rank, the new node opens its first child). This is the hint's "first child + next
//     sibling" enumeration without a heap.
//   - One warp runs the pops. Lane l owns nodes l, l+32, ... and keeps the best of its entries in registers; a pop
//     is one `redux.sync.max` over the lanes' 32-bit order-preserving score keys, a ballot (one lane holds the max
//     unless scores tie exactly: then the depth and lexicographic rules of csrc/ddtree_order.h decide, a slow
//     path), and a shuffle of the winner's node. Only the owner of the parent rescans its nodes (nodes/32 of
//     them: a max over their keys with independent loads, the tie rules only where two share the max) and the
//     owner of the new node compares one entry. No __syncthreads and no shared-memory tree
//     reduction per pop: a CTA-wide argmax would cost two barriers per pop, a heap ~2 log2(nodes) dependent
//     shared-memory round trips.
//   - Log-probs and the tree live in shared memory (K*k*4 + 28 B per node: 31 KB at K=16, k=32, budget 1024).
//   - While warp 0 builds, the other warps zero the request's mask rows; after one barrier every thread writes
//     the token/parent/depth outputs and the set bits of its rows (a walk up the ancestors, <= K+1 steps; the
//     ancestors' indices decrease, so each nonzero word of a row is written once).
//   Scores are float32 sums parent + own log-prob (no multiply, so no FMA contraction), the same additions as
//   the CPU, so both produce one tree, ties included.
// ddtree_accept_greedy: one CTA per request. Every node i checks in parallel whether it carries its parent's
//   target token and records itself with a shared-memory atomicMin in first_match[parent] (the first such child
//   in node order, whatever the schedule); then one thread walks first_match from the root, <= max_depth steps.
// ddtree_commit_kv: CTAs over (request, column tile, K/V). A CTA stages the tile's columns of all the request's
//   accepted source rows in shared memory, waits at a barrier, then writes them to the destinations: every read
//   of a column happens before any write of it, and other columns are other CTAs' bytes. The copy unit is the
//   widest power of two (<= 16 B) dividing the caches' pointers, strides and row bytes.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <tuple>
#include <type_traits>

#include "ddtree_args.h"
#include "ddtree_build_levels.h"
#include "ddtree_order.h"
#include "launch_class.h"
#include "smem_optin.cuh"
#include "value_checks.cuh"

namespace kdtree {
namespace {

constexpr int kThreads = 256;  // 8 warps per CTA in all three kernels
constexpr unsigned kFullWarp = 0xffffffffu;

// ---------------------------------------------------------------------------------------------------------------
// ddtree_build_tree

// The request's tree in shared memory. ekey[n] is the order key of node n's entry (kDdtreeNoEntry: none);
// entry[n] its score, which becomes the score of the child it opens.
struct SmemTree {
  float* lp;            // [K * k] the request's log-probs
  int32_t* parent;      // [nodes]
  int32_t* depth;       // [nodes]
  int32_t* rank;        // [nodes] candidate rank at the node's own position
  int32_t* next_child;  // [nodes] rank of the node's pending child
  uint32_t* ekey;       // [nodes]
  float* entry;         // [nodes]
  float* score;         // [nodes]

  static size_t bytes(int64_t lp_count, int64_t nodes) { return 4 * lp_count + 28 * nodes; }
  __device__ static SmemTree carve(char* smem, int lp_count, int nodes) {
    SmemTree t;
    t.lp = reinterpret_cast<float*>(smem);
    t.parent = reinterpret_cast<int32_t*>(t.lp + lp_count);
    t.depth = t.parent + nodes;
    t.rank = t.depth + nodes;
    t.next_child = t.rank + nodes;
    t.ekey = reinterpret_cast<uint32_t*>(t.next_child + nodes);
    t.entry = reinterpret_cast<float*>(t.ekey + nodes);
    t.score = t.entry + nodes;
    return t;
  }
  // Does node a's entry sort before node b's (b < 0: no node, so any entry does)?
  __device__ bool before(int32_t a, int32_t b) const {
    if (b < 0) return ekey[a] != kDdtreeNoEntry;
    return ddtree_entry_before(ekey[a], depth[a], a, ekey[b], depth[b], b, parent, rank);
  }
};

// Warp 0: the pops. Lane l's best entry among nodes l, l+32, ... is (best, best_key); best < 0: none.
__device__ void build_frontier(const SmemTree& t, int positions, int top_k, int nodes) {
  const int lane = threadIdx.x;
  auto open = [&](int n, int child) {  // n's entry for candidate `child` at position depth[n] + 1 (one lane)
    t.next_child[n] = child;
    const bool exists = t.depth[n] < positions && child < top_k;
    const float s = exists ? t.score[n] + t.lp[t.depth[n] * top_k + child] : 0.0f;
    t.entry[n] = s;
    t.ekey[n] = exists ? ddtree_score_key(s) : kDdtreeNoEntry;
  };
  if (lane == 0) {
    t.parent[0] = -1;
    t.depth[0] = 0;
    t.rank[0] = 0;
    t.score[0] = 0.0f;
    open(0, 0);
  }
  __syncwarp();
  int best = lane == 0 && t.ekey[0] != kDdtreeNoEntry ? 0 : -1;
  uint32_t best_key = best >= 0 ? t.ekey[0] : kDdtreeNoEntry;

  for (int n = 1; n < nodes; ++n) {
    const uint32_t top = __reduce_max_sync(kFullWarp, best_key);
    if (top == kDdtreeNoEntry) {  // unreachable for budget <= the number of paths (checked): pad, stay in bounds
      __syncwarp();  // the last rescan's reads before these writes
      if (lane == 0) {
        t.parent[n] = -1;
        t.depth[n] = 0;
        t.rank[n] = 0;
        t.ekey[n] = kDdtreeNoEntry;
      }
      __syncwarp();
      continue;
    }
    const unsigned holders = __ballot_sync(kFullWarp, best_key == top);
    int p = __shfl_sync(kFullWarp, best, __ffs(holders) - 1);
    if (__popc(holders) > 1) {  // exact score tie between lanes: shallower, then lexicographic (uniform loop)
      for (unsigned rest = holders & (holders - 1); rest != 0; rest &= rest - 1) {
        const int other = __shfl_sync(kFullWarp, best, __ffs(rest) - 1);
        if (t.before(other, p)) p = other;
      }
    }
    // Every lane's reads of the tree (the tie rules above, the last pop's rescan) before lane 0 writes it: ballot,
    // shuffle and the max-reduction converge the warp but do not order shared memory (racecheck found both).
    __syncwarp();
    // The new node n = p's pending child; p moves on to its next rank, n opens its first child.
    if (lane == 0) {
      const int r = t.next_child[p];
      t.parent[n] = p;
      t.depth[n] = t.depth[p] + 1;
      t.rank[n] = r;
      t.score[n] = t.entry[p];
      open(p, r + 1);
      open(n, 0);
    }
    __syncwarp();
    if (lane == (p & 31)) {  // p's entry got worse: rescan this lane's nodes (n among them if it is ours)
      // The max key first (independent loads, selects only), the tie rules only where two nodes share it.
      best = -1;
      best_key = kDdtreeNoEntry;
      bool tied = false;
      for (int j = lane; j <= n; j += 32) {
        const uint32_t key = t.ekey[j];
        tied = key == best_key ? true : (key > best_key ? false : tied);
        best = key > best_key ? j : best;
        best_key = key > best_key ? key : best_key;
      }
      if (tied && best_key != kDdtreeNoEntry) {
        for (int j = best + 32; j <= n; j += 32) {
          if (t.ekey[j] == best_key && t.before(j, best)) best = j;
        }
      }
    } else if (lane == (n & 31) && t.before(n, best)) {
      best = n;
      best_key = t.ekey[n];
    }
  }
}

__global__ void __launch_bounds__(kThreads) build_tree_kernel(
    const float* __restrict__ logprobs,     // [B, K, k]
    const int64_t* __restrict__ tokens,     // [B, K, k]
    const int64_t* __restrict__ roots,      // [B]
    int64_t* __restrict__ tree_tokens,      // [B, nodes]
    int32_t* __restrict__ parents,          // [B, nodes]
    int32_t* __restrict__ depths,           // [B, nodes]
    int32_t* __restrict__ tree_mask,        // [B * nodes, words]
    int positions, int top_k, int nodes, int words) {
  extern __shared__ __align__(16) char smem[];
  const int lp_count = positions * top_k;
  const SmemTree t = SmemTree::carve(smem, lp_count, nodes);
  const int64_t b = blockIdx.x;
  for (int i = threadIdx.x; i < lp_count; i += kThreads) t.lp[i] = logprobs[b * lp_count + i];
  __syncthreads();

  int32_t* mask = tree_mask + b * nodes * static_cast<int64_t>(words);
  const int64_t mask_words = static_cast<int64_t>(nodes) * words;
  if (threadIdx.x < 32) {
    build_frontier(t, positions, top_k, nodes);
  } else {  // meanwhile: zero the mask rows (coalesced), the bits go in after the barrier
    for (int64_t i = threadIdx.x - 32; i < mask_words; i += kThreads - 32) mask[i] = 0;
  }
  __syncthreads();

  const int64_t* request_tokens = tokens + b * lp_count;
  for (int n = threadIdx.x; n < nodes; n += kThreads) {
    const int d = t.depth[n];
    tree_tokens[b * nodes + n] = d == 0 ? roots[b] : request_tokens[(d - 1) * top_k + t.rank[n]];
    parents[b * nodes + n] = t.parent[n];
    depths[b * nodes + n] = d;
    // Row n: node n and its ancestors. Their indices decrease up the chain, so one word at a time.
    int32_t* row = mask + static_cast<int64_t>(n) * words;
    int word = n >> 5;
    uint32_t bits = 0;
    for (int a = n; a >= 0; a = t.parent[a]) {
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

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> ddtree_build_tree_cuda(
    const at::Tensor& logprobs_in,     // [B, K, k] float32
    const at::Tensor& tokens_in,       // [B, K, k] int64
    const at::Tensor& root_tokens_in,  // [B] int64
    int64_t budget) {
  constexpr const char* op = "ddtree_build_tree";
  const BuildTreeDims dims = check_build_tree_args(logprobs_in, tokens_in, root_tokens_in, budget);
  cuda::check_verified(op, op, "", logprobs_in.get_device());
  const c10::cuda::CUDAGuard guard(logprobs_in.device());
  const at::Tensor logprobs = logprobs_in.contiguous();  // no-ops for the usual inputs; a copy is graph-safe
  const at::Tensor tokens = tokens_in.contiguous();
  const at::Tensor root_tokens = root_tokens_in.contiguous();
  if (cuda_value_checks_wanted()) check_build_tree_values(logprobs);

  const auto options = logprobs.options();
  at::Tensor tree_tokens = at::empty({dims.batch, dims.nodes}, options.dtype(at::kLong));
  at::Tensor parents = at::empty({dims.batch, dims.nodes}, options.dtype(at::kInt));
  at::Tensor depths = at::empty({dims.batch, dims.nodes}, options.dtype(at::kInt));
  at::Tensor tree_mask = at::empty({dims.batch * dims.nodes, dims.words}, options.dtype(at::kInt));
  if (dims.batch == 0) return {tree_tokens, parents, depths, tree_mask};
  TORCH_CHECK(dims.positions * dims.top_k < INT_MAX, op, ": K * k must be < 2^31 - 1, got ", dims.positions, " * ",
              dims.top_k);
  TORCH_CHECK(dims.batch <= INT_MAX, op, ": B must be < 2^31, got ", dims.batch);
  if (cuda::launch_build_tree_levels(dims, logprobs, tokens, root_tokens, tree_tokens, parents, depths, tree_mask))
    return {tree_tokens, parents, depths, tree_mask};  // the level-synchronous build took it (ddtree_build_levels.cu)
  const size_t smem = SmemTree::bytes(dims.positions * dims.top_k, dims.nodes);
  cuda::allow_dynamic_smem<build_tree_kernel>(logprobs.get_device(), smem, op,
                                              "the tree of K * k log-probs and budget + 1 nodes");
  build_tree_kernel<<<static_cast<unsigned>(dims.batch), kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(
      logprobs.data_ptr<float>(), tokens.data_ptr<int64_t>(), root_tokens.data_ptr<int64_t>(),
      tree_tokens.data_ptr<int64_t>(), parents.data_ptr<int32_t>(), depths.data_ptr<int32_t>(),
      tree_mask.data_ptr<int32_t>(), static_cast<int>(dims.positions), static_cast<int>(dims.top_k),
      static_cast<int>(dims.nodes), static_cast<int>(dims.words));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {tree_tokens, parents, depths, tree_mask};
}

// ---------------------------------------------------------------------------------------------------------------
// ddtree_accept_greedy

__global__ void __launch_bounds__(kThreads) accept_greedy_kernel(
    const int64_t* __restrict__ tree_tokens,  // [B, T]
    const int32_t* __restrict__ parents,      // [B, T]
    const int64_t* __restrict__ targets,      // [B, T]
    int32_t* __restrict__ accepted,           // [B, max_depth + 1]
    int32_t* __restrict__ accept_len,         // [B]
    int64_t* __restrict__ next_tokens,        // [B]
    int nodes, int max_depth) {
  extern __shared__ int32_t first_match[];  // [T]: first child carrying the node's target token (INT_MAX: none)
  __shared__ int32_t path_length;
  const int64_t b = blockIdx.x;
  const int64_t* tok = tree_tokens + b * nodes;
  const int32_t* par = parents + b * nodes;
  const int64_t* target = targets + b * nodes;
  for (int i = threadIdx.x; i < nodes; i += kThreads) first_match[i] = INT_MAX;
  __syncthreads();
  for (int i = 1 + threadIdx.x; i < nodes; i += kThreads) {
    const int p = par[i];
    // p < i: a child after its parent (the debug checks reject the rest; skipping them keeps the walk acyclic).
    if (p >= 0 && p < i && tok[i] == target[p]) atomicMin(&first_match[p], i);
  }
  __syncthreads();
  int32_t* row = accepted + b * (max_depth + 1);
  if (threadIdx.x == 0) {
    int node = 0, length = 0;
    row[0] = 0;
    while (length < max_depth && first_match[node] != INT_MAX) {
      node = first_match[node];
      row[++length] = node;
    }
    accept_len[b] = length;
    next_tokens[b] = target[node];
    path_length = length;
  }
  __syncthreads();
  for (int d = path_length + 1 + threadIdx.x; d <= max_depth; d += kThreads) row[d] = -1;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ddtree_accept_greedy_cuda(
    const at::Tensor& tree_tokens_in,    // [B, T] int64
    const at::Tensor& parents_in,        // [B, T] int32
    const at::Tensor& target_tokens_in,  // [B, T] int64
    int64_t max_depth) {
  constexpr const char* op = "ddtree_accept_greedy";
  const int64_t batch = check_accept_greedy_args(tree_tokens_in, parents_in, target_tokens_in, max_depth);
  cuda::check_verified(op, op, "", tree_tokens_in.get_device());
  const c10::cuda::CUDAGuard guard(tree_tokens_in.device());
  const at::Tensor tree_tokens = tree_tokens_in.contiguous();
  const at::Tensor parents = parents_in.contiguous();
  const at::Tensor target_tokens = target_tokens_in.contiguous();
  if (cuda_value_checks_wanted()) check_accept_greedy_values(parents);

  const int64_t nodes = tree_tokens.size(1);
  const auto options = tree_tokens.options();
  at::Tensor accepted = at::empty({batch, max_depth + 1}, options.dtype(at::kInt));
  at::Tensor accept_len = at::empty({batch}, options.dtype(at::kInt));
  at::Tensor next_tokens = at::empty({batch}, options.dtype(at::kLong));
  if (batch == 0) return {accepted, accept_len, next_tokens};
  TORCH_CHECK(batch <= INT_MAX, op, ": B must be < 2^31, got ", batch);
  const size_t smem = sizeof(int32_t) * nodes;
  cuda::allow_dynamic_smem<accept_greedy_kernel>(tree_tokens.get_device(), smem, op, "a tree of T nodes");
  accept_greedy_kernel<<<static_cast<unsigned>(batch), kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(
      tree_tokens.data_ptr<int64_t>(), parents.data_ptr<int32_t>(), target_tokens.data_ptr<int64_t>(),
      accepted.data_ptr<int32_t>(), accept_len.data_ptr<int32_t>(), next_tokens.data_ptr<int64_t>(),
      static_cast<int>(nodes), static_cast<int>(max_depth));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {accepted, accept_len, next_tokens};
}

// ---------------------------------------------------------------------------------------------------------------
// ddtree_commit_kv

// One cache viewed as [S, heads, units] copy units of kUnit bytes: unit u of head h of slot s is at
// base + s * slot_stride + h * head_stride + u * kUnit (strides in bytes).
struct CommitPlane {
  char* base;
  int64_t slot_stride, head_stride;
  int64_t head_units;  // units per head
  int64_t row_units;   // heads * head_units
};

constexpr int kStageBytes = 16 * 1024;  // staging per CTA: (D+1) rows x tile units

template <int kUnit>
struct alignas(kUnit) CopyUnit {
  char bytes[kUnit];
};

// grid (B, column tiles, planes). smem: src/dst slots [entries] int64 each, then the staged tile [entries][tile].
template <int kUnit>
__global__ void __launch_bounds__(kThreads) commit_kv_kernel(
    CommitPlane k_plane, CommitPlane v_plane,
    const int32_t* __restrict__ accepted,    // [B, entries]
    const int64_t* __restrict__ node_slots,  // [B, nodes]
    const int64_t* __restrict__ dest_slots,  // [B, entries]
    int entries, int nodes, int64_t slots, int tile_units) {
  using Unit = CopyUnit<kUnit>;
  extern __shared__ __align__(16) char smem[];
  int64_t* src_slot = reinterpret_cast<int64_t*>(smem);  // -1: entry skipped
  int64_t* dst_slot = src_slot + entries;
  Unit* staged = reinterpret_cast<Unit*>(dst_slot + entries);
  const int64_t b = blockIdx.x;
  const CommitPlane plane = blockIdx.z == 0 ? k_plane : v_plane;  // by value: per-field selects, no stack copy
  // An entry out of range (a node past T, a slot past S: inputs the debug checks reject) is skipped rather than
  // read or written out of bounds.
  for (int d = threadIdx.x; d < entries; d += kThreads) {
    const int node = accepted[b * entries + d];
    const int64_t from = node >= 0 && node < nodes ? node_slots[b * nodes + node] : -1;
    const int64_t to = dest_slots[b * entries + d];
    const bool valid = from >= 0 && from < slots && to >= 0 && to < slots;
    src_slot[d] = valid ? from : -1;
    dst_slot[d] = to;
  }
  __syncthreads();
  auto at = [&](int64_t slot, int64_t unit) {
    const int64_t head = unit / plane.head_units, within = unit - head * plane.head_units;
    return reinterpret_cast<Unit*>(plane.base + slot * plane.slot_stride + head * plane.head_stride) + within;
  };
  // Tiles of a row's units, grid-stride over blockIdx.y; the tile loop's bounds are the same for the whole CTA.
  for (int64_t first = static_cast<int64_t>(blockIdx.y) * tile_units; first < plane.row_units;
       first += static_cast<int64_t>(gridDim.y) * tile_units) {
    const int cols = static_cast<int>(std::min<int64_t>(tile_units, plane.row_units - first));
    for (int i = threadIdx.x; i < entries * cols; i += kThreads) {
      const int d = i / cols, c = i - d * cols;
      if (src_slot[d] >= 0) staged[d * tile_units + c] = *at(src_slot[d], first + c);
    }
    __syncthreads();  // every read of these columns before any write of them
    for (int i = threadIdx.x; i < entries * cols; i += kThreads) {
      const int d = i / cols, c = i - d * cols;
      if (src_slot[d] >= 0) *at(dst_slot[d], first + c) = staged[d * tile_units + c];
    }
    __syncthreads();  // the staging buffer is reused by the next tile
  }
}

// Widest copy unit (bytes, power of two <= 16) dividing the cache's address, strides and head bytes.
int copy_unit_bytes(const at::Tensor& cache) {
  const int64_t es = cache.element_size();
  int64_t common = reinterpret_cast<uintptr_t>(cache.data_ptr()) | (cache.stride(0) * es) | (cache.stride(1) * es) |
                   (cache.size(2) * es) | 16;
  return static_cast<int>(common & -common);
}

CommitPlane commit_plane(const at::Tensor& cache, int unit) {
  const int64_t es = cache.element_size();
  const int64_t head_units = cache.size(2) * es / unit;
  return {static_cast<char*>(cache.data_ptr()), cache.stride(0) * es, cache.stride(1) * es, head_units,
          cache.size(1) * head_units};
}

void ddtree_commit_kv_cuda(const at::Tensor& k_cache,                // [S, Hkv, Dk], written
                           const std::optional<at::Tensor>& v_cache,  // [S, Hkv, Dv] or None, written
                           const at::Tensor& accepted_in,            // [B, D+1] int32
                           const at::Tensor& node_slots_in,          // [B, T] int64
                           const at::Tensor& dest_slots_in) {        // [B, D+1] int64
  constexpr const char* op = "ddtree_commit_kv";
  const CommitKvDims dims = check_commit_kv_args(k_cache, v_cache, accepted_in, node_slots_in, dest_slots_in);
  cuda::check_verified(op, op, "", k_cache.get_device());
  const c10::cuda::CUDAGuard guard(k_cache.device());
  const at::Tensor accepted = accepted_in.contiguous();
  const at::Tensor node_slots = node_slots_in.contiguous();
  const at::Tensor dest_slots = dest_slots_in.contiguous();
  if (cuda_value_checks_wanted()) check_commit_kv_values(dims, accepted, node_slots, dest_slots);
  const bool with_v = v_cache.has_value();
  if (dims.batch == 0) return;
  TORCH_CHECK(dims.batch <= INT_MAX && dims.entries <= INT_MAX && dims.nodes <= INT_MAX, op,
              ": B, D+1 and T must be < 2^31");

  const int unit = std::min(copy_unit_bytes(k_cache), with_v && v_cache->numel() > 0 ? copy_unit_bytes(*v_cache) : 16);
  const CommitPlane k_plane = commit_plane(k_cache, unit);
  const CommitPlane v_plane = with_v ? commit_plane(*v_cache, unit) : k_plane;
  const int64_t row_units = std::max(k_plane.row_units, with_v ? v_plane.row_units : 0);
  const int tile_units = static_cast<int>(
      std::clamp<int64_t>(kStageBytes / (dims.entries * unit), 1, std::max<int64_t>(row_units, 1)));
  const int64_t tiles = (row_units + tile_units - 1) / tile_units;
  const dim3 grid(static_cast<unsigned>(dims.batch), static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, 65535)),
                  with_v ? 2 : 1);
  const size_t smem = 2 * sizeof(int64_t) * dims.entries + static_cast<size_t>(dims.entries) * tile_units * unit;
  auto launch = [&](auto unit_bytes) {
    constexpr auto kernel = commit_kv_kernel<decltype(unit_bytes)::value>;
    cuda::allow_dynamic_smem<kernel>(k_cache.get_device(), smem, op, "staging D+1 accepted rows");
    kernel<<<grid, kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(
        k_plane, v_plane, accepted.data_ptr<int32_t>(), node_slots.data_ptr<int64_t>(),
        dest_slots.data_ptr<int64_t>(), static_cast<int>(dims.entries), static_cast<int>(dims.nodes), dims.slots,
        tile_units);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  switch (unit) {
    case 16: launch(std::integral_constant<int, 16>{}); break;
    case 8: launch(std::integral_constant<int, 8>{}); break;
    case 4: launch(std::integral_constant<int, 4>{}); break;
    case 2: launch(std::integral_constant<int, 2>{}); break;
    default: launch(std::integral_constant<int, 1>{}); break;
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(kdtree, CUDA, m) {
  m.impl("ddtree_build_tree", &ddtree_build_tree_cuda);
  m.impl("ddtree_accept_greedy", &ddtree_accept_greedy_cuda);
  m.impl("ddtree_commit_kv", &ddtree_commit_kv_cuda);
}

}  // namespace kdtree
