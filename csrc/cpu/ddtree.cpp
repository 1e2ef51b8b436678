// CPU implementations of the DDTree round (schemas in csrc/ops.cpp, semantics in kdtree_ops/ddtree/ops.py):
//   ddtree_build_tree:    best-first tree from the drafter's top-k, with a binary heap over frontier entries;
//   ddtree_accept_greedy: the walk from the root along the target's greedy tokens;
//   ddtree_commit_kv:     the accepted nodes' K/V rows copied to their destination slots.
// Requests are independent: at::parallel_for over them. Every value is checked (csrc/ddtree_args.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>
#include <queue>
#include <tuple>
#include <vector>

#include "ddtree_args.h"
#include "ddtree_order.h"

namespace kdtree {
namespace {

// One request's tree under construction. Node n's frontier entry is its next child (rank next_child[n]), scored
// entry_score[n]; the entry exists while next_child[n] < k and depth[n] < K.
struct TreeBuilder {
  std::vector<int32_t> parent, depth, rank, next_child;
  std::vector<float> score, entry_score;

  explicit TreeBuilder(int64_t nodes)
      : parent(nodes), depth(nodes), rank(nodes), next_child(nodes), score(nodes), entry_score(nodes) {}

  bool before(int32_t a, int32_t b) const {
    return ddtree_entry_before(ddtree_score_key(entry_score[a]), depth[a], a, ddtree_score_key(entry_score[b]),
                               depth[b], b, parent.data(), rank.data());
  }
};

// logprobs [K, k] float32 and tokens [K, k] int64 of one request -> its nodes' tokens/parents/depths [nodes].
void build_one_tree(const float* lp, const int64_t* tok, int64_t root_token, const BuildTreeDims& dims,
                    int64_t* tree_tokens, int32_t* parents, int32_t* depths) {
  const int64_t positions = dims.positions, top_k = dims.top_k;
  TreeBuilder t(dims.nodes);
  // The heap's top is the entry that sorts first: std::priority_queue keeps the largest under `less`.
  auto less = [&t](int32_t a, int32_t b) { return t.before(b, a); };
  std::priority_queue<int32_t, std::vector<int32_t>, decltype(less)> frontier(less);
  auto open_entry = [&](int32_t n, int32_t child) {  // n's entry for candidate `child` at position depth[n] + 1
    t.next_child[n] = child;
    if (t.depth[n] >= positions || child >= top_k) return;
    t.entry_score[n] = t.score[n] + lp[t.depth[n] * top_k + child];
    frontier.push(n);
  };
  t.parent[0] = -1;
  t.depth[0] = 0;
  t.rank[0] = 0;
  t.score[0] = 0.0f;
  open_entry(0, 0);
  for (int32_t n = 1; n < dims.nodes; ++n) {
    const int32_t p = frontier.top();  // budget <= the number of paths: never empty here
    frontier.pop();
    t.parent[n] = p;
    t.depth[n] = t.depth[p] + 1;
    t.rank[n] = t.next_child[p];
    t.score[n] = t.entry_score[p];
    open_entry(p, t.next_child[p] + 1);
    open_entry(n, 0);
  }
  tree_tokens[0] = root_token;
  parents[0] = -1;
  depths[0] = 0;
  for (int64_t n = 1; n < dims.nodes; ++n) {
    tree_tokens[n] = tok[(t.depth[n] - 1) * top_k + t.rank[n]];
    parents[n] = t.parent[n];
    depths[n] = t.depth[n];
  }
}

// parents [nodes] of one request -> its mask rows [nodes, words]: a row is its parent's row plus its own bit.
void ancestor_rows(const int32_t* parents, int64_t nodes, int64_t words, int32_t* rows) {
  std::memset(rows, 0, sizeof(int32_t) * nodes * words);
  for (int64_t i = 0; i < nodes; ++i) {
    int32_t* row = rows + i * words;
    if (parents[i] >= 0) std::memcpy(row, rows + parents[i] * words, sizeof(int32_t) * words);
    row[i >> 5] = static_cast<int32_t>(static_cast<uint32_t>(row[i >> 5]) | (1u << (i & 31)));
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> ddtree_build_tree_cpu(
    const at::Tensor& logprobs_in,     // [B, K, k] float32
    const at::Tensor& tokens_in,       // [B, K, k] int64
    const at::Tensor& root_tokens_in,  // [B] int64
    int64_t budget) {
  const BuildTreeDims dims = check_build_tree_args(logprobs_in, tokens_in, root_tokens_in, budget);
  const at::Tensor logprobs = logprobs_in.contiguous();
  const at::Tensor tokens = tokens_in.contiguous();
  const at::Tensor root_tokens = root_tokens_in.contiguous();
  check_build_tree_values(logprobs);
  const auto options = logprobs.options();
  at::Tensor tree_tokens = at::empty({dims.batch, dims.nodes}, options.dtype(at::kLong));
  at::Tensor parents = at::empty({dims.batch, dims.nodes}, options.dtype(at::kInt));
  at::Tensor depths = at::empty({dims.batch, dims.nodes}, options.dtype(at::kInt));
  at::Tensor tree_mask = at::empty({dims.batch * dims.nodes, dims.words}, options.dtype(at::kInt));
  const int64_t per_request = dims.positions * dims.top_k;
  const float* lp = logprobs.const_data_ptr<float>();
  const int64_t* tok = tokens.const_data_ptr<int64_t>();
  const int64_t* roots = root_tokens.const_data_ptr<int64_t>();
  int64_t* out_tokens = tree_tokens.data_ptr<int64_t>();
  int32_t* out_parents = parents.data_ptr<int32_t>();
  int32_t* out_depths = depths.data_ptr<int32_t>();
  int32_t* out_mask = tree_mask.data_ptr<int32_t>();
  at::parallel_for(0, dims.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      build_one_tree(lp + b * per_request, tok + b * per_request, roots[b], dims, out_tokens + b * dims.nodes,
                     out_parents + b * dims.nodes, out_depths + b * dims.nodes);
      ancestor_rows(out_parents + b * dims.nodes, dims.nodes, dims.words, out_mask + b * dims.nodes * dims.words);
    }
  });
  return {tree_tokens, parents, depths, tree_mask};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ddtree_accept_greedy_cpu(
    const at::Tensor& tree_tokens_in,    // [B, T] int64
    const at::Tensor& parents_in,        // [B, T] int32
    const at::Tensor& target_tokens_in,  // [B, T] int64
    int64_t max_depth) {
  const int64_t batch = check_accept_greedy_args(tree_tokens_in, parents_in, target_tokens_in, max_depth);
  const at::Tensor tree_tokens = tree_tokens_in.contiguous();
  const at::Tensor parents = parents_in.contiguous();
  const at::Tensor target_tokens = target_tokens_in.contiguous();
  check_accept_greedy_values(parents);
  const int64_t nodes = tree_tokens.size(1), entries = max_depth + 1;
  const auto options = tree_tokens.options();
  at::Tensor accepted = at::empty({batch, entries}, options.dtype(at::kInt));
  at::Tensor accept_len = at::empty({batch}, options.dtype(at::kInt));
  at::Tensor next_tokens = at::empty({batch}, options.dtype(at::kLong));
  const int64_t* tok = tree_tokens.const_data_ptr<int64_t>();
  const int32_t* par = parents.const_data_ptr<int32_t>();
  const int64_t* target = target_tokens.const_data_ptr<int64_t>();
  int32_t* out_accepted = accepted.data_ptr<int32_t>();
  int32_t* out_len = accept_len.data_ptr<int32_t>();
  int64_t* out_next = next_tokens.data_ptr<int64_t>();
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> first_match(nodes);  // first child (node order) carrying its parent's target token
    for (int64_t b = begin; b < end; ++b) {
      const int64_t* tb = tok + b * nodes;
      const int32_t* pb = par + b * nodes;
      const int64_t* gb = target + b * nodes;
      std::fill(first_match.begin(), first_match.end(), -1);
      for (int64_t i = nodes - 1; i >= 1; --i) {  // backwards: the smallest matching index is written last
        if (pb[i] >= 0 && tb[i] == gb[pb[i]]) first_match[pb[i]] = static_cast<int32_t>(i);
      }
      int32_t* row = out_accepted + b * entries;
      int32_t node = 0, length = 0;
      row[0] = 0;
      while (length < max_depth && first_match[node] >= 0) {
        node = first_match[node];
        row[++length] = node;
      }
      for (int64_t d = length + 1; d < entries; ++d) row[d] = -1;
      out_len[b] = length;
      out_next[b] = gb[node];
    }
  });
  return {accepted, accept_len, next_tokens};
}

// One cache's rows of slot s, head h: `head_bytes` contiguous bytes at base + s * slot_stride + h * head_stride.
struct CachePlane {
  char* base;
  int64_t slot_stride, head_stride, heads, head_bytes;  // strides in bytes

  explicit CachePlane(const at::Tensor& cache)
      : base(static_cast<char*>(cache.data_ptr())),
        slot_stride(cache.stride(0) * cache.element_size()),
        head_stride(cache.stride(1) * cache.element_size()),
        heads(cache.size(1)),
        head_bytes(cache.size(2) * cache.element_size()) {}
  int64_t row_bytes() const { return heads * head_bytes; }
  void read(int64_t slot, char* to) const {
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(to + h * head_bytes, base + slot * slot_stride + h * head_stride, head_bytes);
    }
  }
  void write(int64_t slot, const char* from) const {
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(base + slot * slot_stride + h * head_stride, from + h * head_bytes, head_bytes);
    }
  }
};

void ddtree_commit_kv_cpu(const at::Tensor& k_cache,                // [S, Hkv, Dk], written
                          const std::optional<at::Tensor>& v_cache,  // [S, Hkv, Dv] or None, written
                          const at::Tensor& accepted_in,            // [B, D+1] int32
                          const at::Tensor& node_slots_in,          // [B, T] int64
                          const at::Tensor& dest_slots_in) {        // [B, D+1] int64
  const CommitKvDims dims = check_commit_kv_args(k_cache, v_cache, accepted_in, node_slots_in, dest_slots_in);
  const at::Tensor accepted = accepted_in.contiguous();
  const at::Tensor node_slots = node_slots_in.contiguous();
  const at::Tensor dest_slots = dest_slots_in.contiguous();
  check_commit_kv_values(dims, accepted, node_slots, dest_slots);
  std::vector<CachePlane> planes{CachePlane(k_cache)};
  if (v_cache.has_value()) planes.emplace_back(*v_cache);
  const int32_t* acc = accepted.const_data_ptr<int32_t>();
  const int64_t* src = node_slots.const_data_ptr<int64_t>();
  const int64_t* dst = dest_slots.const_data_ptr<int64_t>();
  at::parallel_for(0, dims.batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<char> staged;
    for (int64_t b = begin; b < end; ++b) {
      for (const CachePlane& plane : planes) {
        // Every accepted row of the request is read before any is written: a destination may be another's source.
        const int64_t row = plane.row_bytes();
        staged.resize(dims.entries * row);
        for (int64_t d = 0; d < dims.entries; ++d) {
          const int32_t node = acc[b * dims.entries + d];
          if (node >= 0) plane.read(src[b * dims.nodes + node], staged.data() + d * row);
        }
        for (int64_t d = 0; d < dims.entries; ++d) {
          if (acc[b * dims.entries + d] >= 0) plane.write(dst[b * dims.entries + d], staged.data() + d * row);
        }
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(kdtree, CPU, m) {
  m.impl("ddtree_build_tree", &ddtree_build_tree_cpu);
  m.impl("ddtree_accept_greedy", &ddtree_accept_greedy_cpu);
  m.impl("ddtree_commit_kv", &ddtree_commit_kv_cpu);
}

}  // namespace kdtree
