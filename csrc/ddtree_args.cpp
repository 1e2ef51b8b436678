#include "ddtree_args.h"

#include <c10/util/irange.h>

#include <cstdint>
#include <limits>
#include <unordered_map>

namespace kdtree {
namespace {

// t is [rows, cols...] = `expected_dims`-D of dtype `dtype`: the message names the argument and the layout.
void check_layout(const at::Tensor& t, const char* op, const char* name, int64_t dims, at::ScalarType dtype,
                  const char* layout) {
  TORCH_CHECK(t.dim() == dims && t.scalar_type() == dtype, op, ": ", name, " must be ", layout, " ", dtype,
              ", got shape ", t.sizes(), " ", t.scalar_type());
}

void check_same_device(const at::Tensor& t, const at::Tensor& first, const char* op, const char* name,
                       const char* first_name) {
  TORCH_CHECK(t.device() == first.device(), op, ": ", name, " must be on the device of ", first_name, " (",
              first.device(), "), got ", t.device());
}

// [start, end) bytes a strided tensor can touch.
std::pair<uintptr_t, uintptr_t> byte_extent(const at::Tensor& t) {
  const auto start = reinterpret_cast<uintptr_t>(t.data_ptr());
  uintptr_t last = 0;
  for (const auto d : c10::irange(t.dim())) last += static_cast<uintptr_t>((t.size(d) - 1) * t.stride(d));
  return {start, start + (last + 1) * t.element_size()};
}

}  // namespace

int64_t ddtree_path_count(int64_t positions, int64_t top_k) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t total = 0, level = 1;  // level = k^d
  for (int64_t d = 1; d <= positions && top_k > 0; ++d) {
    level = level > kMax / top_k ? kMax : level * top_k;
    total = total > kMax - level ? kMax : total + level;
    if (total == kMax) break;
  }
  return total;
}

BuildTreeDims check_build_tree_args(const at::Tensor& logprobs, const at::Tensor& tokens,
                                    const at::Tensor& root_tokens, int64_t budget) {
  constexpr const char* op = "ddtree_build_tree";
  check_layout(logprobs, op, "logprobs", 3, at::kFloat, "[B, K, k]");
  check_layout(tokens, op, "tokens", 3, at::kLong, "[B, K, k]");
  TORCH_CHECK(tokens.sizes() == logprobs.sizes(), op, ": tokens must be [B, K, k] = ", logprobs.sizes(),
              " like logprobs, got ", tokens.sizes());
  check_layout(root_tokens, op, "root_tokens", 1, at::kLong, "[B]");
  TORCH_CHECK(root_tokens.size(0) == logprobs.size(0), op, ": root_tokens must be [B] = [", logprobs.size(0),
              "], got ", root_tokens.sizes());
  check_same_device(tokens, logprobs, op, "tokens", "logprobs");
  check_same_device(root_tokens, logprobs, op, "root_tokens", "logprobs");
  const int64_t positions = logprobs.size(1), top_k = logprobs.size(2);
  const int64_t paths = ddtree_path_count(positions, top_k);
  TORCH_CHECK(budget >= 0 && budget <= paths, op, ": budget must be in [0, sum_{d=1..K} k^d = ", paths,
              "] for K = ", positions, ", k = ", top_k, ", got ", budget);
  TORCH_CHECK(budget < std::numeric_limits<int32_t>::max(), op, ": budget must be < 2^31 - 1, got ", budget);
  return {logprobs.size(0), positions, top_k, budget + 1, (budget + 1 + 31) / 32};
}

void check_build_tree_values(const at::Tensor& logprobs_any) {
  constexpr const char* op = "ddtree_build_tree";
  const at::Tensor logprobs = logprobs_any.cpu().contiguous();
  const int64_t rows = logprobs.size(0) * logprobs.size(1), top_k = logprobs.size(2);
  const float* lp = logprobs.const_data_ptr<float>();
  for (const auto r : c10::irange(rows)) {
    for (const auto j : c10::irange(top_k)) {
      const float v = lp[r * top_k + j];
      TORCH_CHECK(v <= 0.0f, op, ": logprobs[", r / logprobs.size(1), ", ", r % logprobs.size(1), ", ", j, "] = ", v,
                  " must be a log-probability (<= 0, not NaN)");
      TORCH_CHECK(j == 0 || v <= lp[r * top_k + j - 1], op, ": logprobs[", r / logprobs.size(1), ", ",
                  r % logprobs.size(1), ", :] must be sorted descending, got ", lp[r * top_k + j - 1], " then ", v,
                  " at ", j - 1, ", ", j);
    }
  }
}

int64_t check_accept_greedy_args(const at::Tensor& tree_tokens, const at::Tensor& parents,
                                 const at::Tensor& target_tokens, int64_t max_depth) {
  constexpr const char* op = "ddtree_accept_greedy";
  check_layout(tree_tokens, op, "tree_tokens", 2, at::kLong, "[B, T]");
  check_layout(parents, op, "parents", 2, at::kInt, "[B, T]");
  check_layout(target_tokens, op, "target_tokens", 2, at::kLong, "[B, T]");
  TORCH_CHECK(tree_tokens.size(1) >= 1, op, ": tree_tokens must be [B, T] with T >= 1 (node 0 is the root), got ",
              tree_tokens.sizes());
  TORCH_CHECK(parents.sizes() == tree_tokens.sizes(), op, ": parents must be [B, T] = ", tree_tokens.sizes(),
              " like tree_tokens, got ", parents.sizes());
  TORCH_CHECK(target_tokens.sizes() == tree_tokens.sizes(), op, ": target_tokens must be [B, T] = ",
              tree_tokens.sizes(), " like tree_tokens, got ", target_tokens.sizes());
  check_same_device(parents, tree_tokens, op, "parents", "tree_tokens");
  check_same_device(target_tokens, tree_tokens, op, "target_tokens", "tree_tokens");
  TORCH_CHECK(max_depth >= 0 && max_depth < std::numeric_limits<int32_t>::max(), op,
              ": max_depth must be in [0, 2^31 - 1), got ", max_depth);
  TORCH_CHECK(tree_tokens.size(1) < std::numeric_limits<int32_t>::max(), op, ": T must be < 2^31 - 1, got ",
              tree_tokens.size(1));
  return tree_tokens.size(0);
}

void check_accept_greedy_values(const at::Tensor& parents_any) {
  constexpr const char* op = "ddtree_accept_greedy";
  const at::Tensor parents = parents_any.cpu().contiguous();
  const int64_t nodes = parents.size(1);
  const int32_t* par = parents.const_data_ptr<int32_t>();
  for (const auto b : c10::irange(parents.size(0))) {
    TORCH_CHECK(par[b * nodes] == -1, op, ": parents[", b, ", 0] = ", par[b * nodes], " must be -1 (the root)");
    for (const auto i : c10::irange(int64_t{1}, nodes)) {
      const int32_t p = par[b * nodes + i];
      TORCH_CHECK(p >= -1 && p < i, op, ": parents[", b, ", ", i, "] = ", p,
                  " must be -1 (padding) or an earlier node (0..", i - 1, ")");
    }
  }
}

CommitKvDims check_commit_kv_args(const at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                                  const at::Tensor& accepted, const at::Tensor& node_slots,
                                  const at::Tensor& dest_slots) {
  constexpr const char* op = "ddtree_commit_kv";
  TORCH_CHECK(k_cache.dim() == 3, op, ": k_cache must be [S, Hkv, Dk], got shape ", k_cache.sizes());
  TORCH_CHECK(k_cache.size(2) <= 1 || k_cache.stride(2) == 1, op,
              ": k_cache must have a contiguous last dimension, got strides ", k_cache.strides());
  if (v_cache.has_value()) {
    const at::Tensor& v = *v_cache;
    TORCH_CHECK(v.dim() == 3 && v.size(0) == k_cache.size(0), op, ": v_cache must be [S, Hkv, Dv] with S = ",
                k_cache.size(0), " like k_cache, got shape ", v.sizes());
    TORCH_CHECK(v.scalar_type() == k_cache.scalar_type(), op, ": v_cache must have the dtype of k_cache (",
                k_cache.scalar_type(), "), got ", v.scalar_type());
    TORCH_CHECK(v.size(2) <= 1 || v.stride(2) == 1, op, ": v_cache must have a contiguous last dimension, got strides ",
                v.strides());
    check_same_device(v, k_cache, op, "v_cache", "k_cache");
    if (v.numel() > 0 && k_cache.numel() > 0) {
      const auto [k0, k1] = byte_extent(k_cache);
      const auto [v0, v1] = byte_extent(v);
      TORCH_CHECK(v1 <= k0 || k1 <= v0, op,
                  ": v_cache overlaps k_cache (MLA keeps V inside K: pass v_cache=None, K's rows carry V)");
    }
  }
  check_layout(accepted, op, "accepted", 2, at::kInt, "[B, D+1]");
  TORCH_CHECK(accepted.size(1) >= 1, op, ": accepted must be [B, D+1] with D+1 >= 1, got ", accepted.sizes());
  check_layout(node_slots, op, "node_slots", 2, at::kLong, "[B, T]");
  TORCH_CHECK(node_slots.size(0) == accepted.size(0), op, ": node_slots must be [B, T] with B = ", accepted.size(0),
              " like accepted, got ", node_slots.sizes());
  check_layout(dest_slots, op, "dest_slots", 2, at::kLong, "[B, D+1]");
  TORCH_CHECK(dest_slots.sizes() == accepted.sizes(), op, ": dest_slots must be [B, D+1] = ", accepted.sizes(),
              " like accepted, got ", dest_slots.sizes());
  check_same_device(accepted, k_cache, op, "accepted", "k_cache");
  check_same_device(node_slots, k_cache, op, "node_slots", "k_cache");
  check_same_device(dest_slots, k_cache, op, "dest_slots", "k_cache");
  return {accepted.size(0), accepted.size(1), node_slots.size(1), k_cache.size(0)};
}

void check_commit_kv_values(const CommitKvDims& dims, const at::Tensor& accepted_any, const at::Tensor& node_slots_any,
                            const at::Tensor& dest_slots_any) {
  constexpr const char* op = "ddtree_commit_kv";
  const at::Tensor accepted = accepted_any.cpu().contiguous();
  const at::Tensor node_slots = node_slots_any.cpu().contiguous();
  const at::Tensor dest_slots = dest_slots_any.cpu().contiguous();
  const int32_t* acc = accepted.const_data_ptr<int32_t>();
  const int64_t* src = node_slots.const_data_ptr<int64_t>();
  const int64_t* dst = dest_slots.const_data_ptr<int64_t>();
  std::unordered_map<int64_t, int64_t> writer;   // destination slot -> request writing it
  std::unordered_map<int64_t, int64_t> reader;   // source slot -> request reading it (-2: several requests)
  for (const auto b : c10::irange(dims.batch)) {
    for (const auto d : c10::irange(dims.entries)) {
      const int32_t node = acc[b * dims.entries + d];
      TORCH_CHECK(node >= -1 && node < dims.nodes, op, ": accepted[", b, ", ", d, "] = ", node,
                  " must be -1 or a node index in [0, T = ", dims.nodes, ")");
      if (node < 0) continue;
      const int64_t from = src[b * dims.nodes + node], to = dst[b * dims.entries + d];
      TORCH_CHECK(from >= 0 && from < dims.slots, op, ": node_slots[", b, ", ", node, "] = ", from,
                  " must be a slot in [0, S = ", dims.slots, ")");
      TORCH_CHECK(to >= 0 && to < dims.slots, op, ": dest_slots[", b, ", ", d, "] = ", to,
                  " must be a slot in [0, S = ", dims.slots, ")");
      TORCH_CHECK(writer.emplace(to, b).second, op, ": dest_slots[", b, ", ", d, "] = ", to,
                  " is the destination of another accepted entry");
      const auto [it, fresh] = reader.emplace(from, b);
      if (!fresh && it->second != b) it->second = -2;
    }
  }
  for (const auto& [slot, b] : writer) {
    const auto it = reader.find(slot);
    TORCH_CHECK(it == reader.end() || it->second == b, op, ": slot ", slot, " is written by request ", b,
                " and read by another request (requests must not share slots)");
  }
}

}  // namespace kdtree
