// Argument checks of the DDTree round's ops (ddtree_build_tree, ddtree_accept_greedy, ddtree_commit_kv), shared by
// the CPU and CUDA implementations so that both reject the same inputs with the same messages. The *_args checks
// read shapes, dtypes, devices and pointers only (free under CUDA-graph capture); the *_values checks read tensor
// values (a host sync on CUDA): the CPU path always runs them, the CUDA path only with KDTREE_OPS_DEBUG=1 outside
// graph capture. Semantics of each op: kdtree_ops/ddtree/ops.py.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace kdtree {

struct BuildTreeDims {
  int64_t batch;      // B
  int64_t positions;  // K: future positions of the block drafter
  int64_t top_k;      // k: candidates per position
  int64_t nodes;      // budget + 1: the root and the budget paths
  int64_t words;      // ceil(nodes / 32): int32 words per mask row
};

// Number of paths of depth 1..K with k candidates per position, sum_{d=1..K} k^d, saturated at INT64_MAX.
int64_t ddtree_path_count(int64_t positions, int64_t top_k);

// logprobs [B, K, k] float32, tokens [B, K, k] int64, root_tokens [B] int64 on one device;
// 0 <= budget <= ddtree_path_count(K, k).
BuildTreeDims check_build_tree_args(const at::Tensor& logprobs, const at::Tensor& tokens,
                                    const at::Tensor& root_tokens, int64_t budget);

// Every log-prob is <= 0 (so no NaN) and each [b, p, :] row is non-increasing. Takes tensors on any device.
void check_build_tree_values(const at::Tensor& logprobs);  // [B, K, k] float32

// tree_tokens [B, T] int64, parents [B, T] int32, target_tokens [B, T] int64 on one device, T >= 1,
// max_depth >= 0. Returns B.
int64_t check_accept_greedy_args(const at::Tensor& tree_tokens, const at::Tensor& parents,
                                 const at::Tensor& target_tokens, int64_t max_depth);

// parents[b, 0] == -1 and -1 <= parents[b, i] < i for i >= 1. Takes tensors on any device.
void check_accept_greedy_values(const at::Tensor& parents);  // [B, T] int32

struct CommitKvDims {
  int64_t batch;    // B
  int64_t entries;  // D+1: accepted entries per request
  int64_t nodes;    // T: tree nodes per request (columns of node_slots)
  int64_t slots;    // S: cache slots
};

// k_cache [S, Hkv, Dk] (last dim contiguous), v_cache [S, Hkv', Dv] of k_cache's dtype or None, not overlapping
// k_cache; accepted [B, D+1] int32, node_slots [B, T] int64, dest_slots [B, D+1] int64; all on one device.
CommitKvDims check_commit_kv_args(const at::Tensor& k_cache, const std::optional<at::Tensor>& v_cache,
                                  const at::Tensor& accepted, const at::Tensor& node_slots,
                                  const at::Tensor& dest_slots);

// accepted in [-1, T); for entries >= 0: node_slots[b, accepted] and dest_slots in [0, S), destinations distinct,
// and no destination is a source of another request (requests are copied concurrently). Any device.
void check_commit_kv_values(const CommitKvDims& dims, const at::Tensor& accepted, const at::Tensor& node_slots,
                            const at::Tensor& dest_slots);

}  // namespace kdtree
