// CPU implementation of kdtree::tree_verify_attention(_out): the reference-speed kernel CI runs and the
// semantics every device kernel must match.
//
// Work split: one task per (query row, KV head). A task walks its request's visible keys once and serves
// every query head of that KV head's group from the same key/value loads (the CPU analogue of packing a
// GQA group into one tile). Keys go in blocks: scores of a block first, then one online-softmax rescale
// per block, so the running max is updated ~L/kKeyBlock times rather than once per key. fp32 throughout.
//
// fp8 KV caches: a cache row is converted to fp32 and multiplied by its scale as it is read (the key/value is
// stored value x k_scale/v_scale); draft rows passed in k_draft/v_draft are in q's dtype and unscaled.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "tree_verify_args.h"

namespace kdtree {
namespace {

// Keys scored before one softmax rescale. 64 keeps the per-block score buffer ([group, 64] floats) in L1
// for every group size in the benchmark table (group <= 128).
constexpr int64_t kKeyBlock = 64;

// Raw pointers and strides of one call, read-only in the task loop. scalar_t: q's dtype (also the output's and
// the draft K/V's); cache_t: the caches' (scalar_t, or an fp8 type).
template <typename scalar_t, typename cache_t, typename index_t>
struct CpuParams {
  const scalar_t* q;          // [N, Hq, Dqk], strides q_row / q_head
  const cache_t* k_cache;     // [S, Hkv, Dqk], strides k_row / k_head; key = stored x k_scale
  const cache_t* v_cache;     // [S, Hkv, Dv], strides v_row / v_head; value = stored x v_scale
  const scalar_t* k_draft;    // [N, Hkv, Dqk] or nullptr (draft K/V then in the cache)
  const scalar_t* v_draft;    // [N, Hkv, Dv] or nullptr
  const int32_t* qo_indptr;   // [B+1]
  const int32_t* kv_indptr;   // [B+1]
  const index_t* kv_indices;  // [>= kv_indptr[B]]
  const int32_t* tree_mask;   // [N, W], row stride mask_row
  const int32_t* row_request; // [N]: request of each query row, -1 for padding rows past qo_indptr[B]
  scalar_t* out;              // [N, Hq, Dv] contiguous
  int64_t q_row, q_head, k_row, k_head, v_row, v_head;
  int64_t kd_row, kd_head, vd_row, vd_head, mask_row;
  int64_t group, num_kv_heads, dqk, dv;
  float sm_scale, logit_cap;
  float k_scale, v_scale;     // of the cache rows only
};

// One key of a task: its value row, in the cache (cache_t, scaled by v_scale) or in v_draft (scalar_t, unscaled).
template <typename scalar_t, typename cache_t>
struct KeyRef {
  const cache_t* v_cache_row;  // nullptr for a draft row
  const scalar_t* v_draft_row;
};

// dst[d] = src[d] as fp32, times scale (1 for rows in q's dtype: exact, so unscaled rows read as before).
template <typename T>
void load_row(const T* src, int64_t len, float scale, float* dst) {
  for (const auto d : c10::irange(len)) dst[d] = static_cast<float>(src[d]) * scale;
}

// Attention of the `group` query heads sharing KV head `kvh`, for query row `row`.
template <typename scalar_t, typename cache_t, typename index_t>
void attend_row(const CpuParams<scalar_t, cache_t, index_t>& p, int64_t row, int64_t kvh,
                std::vector<float>& scratch) {
  const int64_t G = p.group, Dqk = p.dqk, Dv = p.dv;
  scalar_t* out = p.out + (row * p.num_kv_heads + kvh) * G * Dv;  // the group's heads are adjacent in out
  const int32_t b = p.row_request[row];
  if (b < 0) {  // graph padding: defined zeros
    std::fill(out, out + G * Dv, scalar_t(0));
    return;
  }
  const int64_t tree_begin = p.qo_indptr[b];
  const int64_t tree_len = p.qo_indptr[b + 1] - tree_begin;
  const int64_t slot_begin = p.kv_indptr[b];
  const int64_t slots = p.kv_indptr[b + 1] - slot_begin;
  const bool draft_in_cache = p.k_draft == nullptr;
  const int64_t prefix_len = draft_in_cache ? slots - tree_len : slots;
  const int32_t* mask = p.tree_mask + row * p.mask_row;

  // scratch: q in fp32 [G, Dqk] | acc [G, Dv] | running max [G] | running sum [G]
  //          | block scores [G, kKeyBlock] | key row [Dqk] | value row [Dv]
  scratch.resize(G * Dqk + G * Dv + 2 * G + G * kKeyBlock + Dqk + Dv);
  float* qf = scratch.data();
  float* acc = qf + G * Dqk;
  float* run_max = acc + G * Dv;
  float* run_sum = run_max + G;
  float* scores = run_sum + G;
  float* kf = scores + G * kKeyBlock;
  float* vf = kf + Dqk;
  for (const auto h : c10::irange(G)) {
    const scalar_t* qh = p.q + row * p.q_row + (kvh * G + h) * p.q_head;
    for (const auto d : c10::irange(Dqk)) qf[h * Dqk + d] = static_cast<float>(qh[d]);
    run_max[h] = -std::numeric_limits<float>::infinity();
    run_sum[h] = 0.f;
  }
  std::fill(acc, acc + G * Dv, 0.f);

  KeyRef<scalar_t, cache_t> block[kKeyBlock];
  int64_t block_len = 0;
  auto flush = [&]() {
    if (block_len == 0) return;  // (also keeps exp(-inf - -inf) away from a row that saw nothing)
    for (const auto h : c10::irange(G)) {
      float* s = scores + h * kKeyBlock;
      float block_max = run_max[h];
      for (const auto t : c10::irange(block_len)) block_max = std::max(block_max, s[t]);
      // block_max is finite: every score is (tanh-capped or plain) finite for finite inputs.
      const float rescale = std::exp(run_max[h] - block_max);  // exp(-inf) = 0 on the first block
      run_sum[h] *= rescale;
      float* acc_h = acc + h * Dv;
      for (const auto d : c10::irange(Dv)) acc_h[d] *= rescale;
      run_max[h] = block_max;
      for (const auto t : c10::irange(block_len)) s[t] = std::exp(s[t] - block_max);
    }
    for (const auto t : c10::irange(block_len)) {
      if (block[t].v_cache_row != nullptr) load_row(block[t].v_cache_row, Dv, p.v_scale, vf);
      else load_row(block[t].v_draft_row, Dv, 1.f, vf);
      for (const auto h : c10::irange(G)) {
        const float w = scores[h * kKeyBlock + t];
        run_sum[h] += w;
        float* acc_h = acc + h * Dv;
        for (const auto d : c10::irange(Dv)) acc_h[d] += w * vf[d];
      }
    }
    block_len = 0;
  };
  // kf holds the key in fp32 (already scaled); `value` says where its value row is.
  auto add_key = [&](const KeyRef<scalar_t, cache_t>& value) {
    for (const auto h : c10::irange(G)) {
      const float* qh = qf + h * Dqk;
      float dot = 0.f;
      for (const auto d : c10::irange(Dqk)) dot += qh[d] * kf[d];
      float s = dot * p.sm_scale;
      if (p.logit_cap > 0.f) s = p.logit_cap * std::tanh(s / p.logit_cap);
      scores[h * kKeyBlock + block_len] = s;
    }
    block[block_len++] = value;
    if (block_len == kKeyBlock) flush();
  };

  auto add_cache_key = [&](int64_t slot) {
    load_row(p.k_cache + slot * p.k_row + kvh * p.k_head, Dqk, p.k_scale, kf);
    add_key({p.v_cache + slot * p.v_row + kvh * p.v_head, nullptr});
  };
  // The committed prefix: always visible.
  for (const auto j : c10::irange(prefix_len)) add_cache_key(static_cast<int64_t>(p.kv_indices[slot_begin + j]));
  // The request's draft tokens: visible where this row's tree-mask bit is set.
  for (const auto j : c10::irange(tree_len)) {
    if (((static_cast<uint32_t>(mask[j >> 5]) >> (j & 31)) & 1u) == 0) continue;
    if (draft_in_cache) {
      add_cache_key(static_cast<int64_t>(p.kv_indices[slot_begin + prefix_len + j]));
    } else {
      const int64_t r = tree_begin + j;
      load_row(p.k_draft + r * p.kd_row + kvh * p.kd_head, Dqk, 1.f, kf);
      add_key({nullptr, p.v_draft + r * p.vd_row + kvh * p.vd_head});
    }
  }
  flush();

  for (const auto h : c10::irange(G)) {
    // A row that saw nothing has run_sum 0 and acc 0: write zeros, never 0/0.
    const float inv = run_sum[h] > 0.f ? 1.f / run_sum[h] : 0.f;
    for (const auto d : c10::irange(Dv)) out[h * Dv + d] = static_cast<scalar_t>(acc[h * Dv + d] * inv);
  }
}

template <typename scalar_t, typename cache_t, typename index_t>
void run_cpu(const TreeVerifyDims& dims, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
             const at::Tensor& qo_indptr, const at::Tensor& kv_indptr, const at::Tensor& kv_indices,
             const at::Tensor& tree_mask, double sm_scale, double logit_cap, const std::optional<at::Tensor>& k_draft,
             const std::optional<at::Tensor>& v_draft, double k_scale, double v_scale, at::Tensor& out) {
  const int64_t N = dims.num_tokens;
  // Map each query row to its request once (rows past qo_indptr[B] stay -1: padding).
  std::vector<int32_t> row_request(N, -1);
  const int32_t* qo = qo_indptr.data_ptr<int32_t>();
  for (const auto b : c10::irange(dims.batch)) {
    for (int64_t r = qo[b]; r < qo[b + 1]; ++r) row_request[r] = static_cast<int32_t>(b);
  }

  CpuParams<scalar_t, cache_t, index_t> p{};
  p.q = q.const_data_ptr<scalar_t>();
  p.k_cache = k_cache.const_data_ptr<cache_t>();
  p.v_cache = v_cache.const_data_ptr<cache_t>();
  p.k_draft = k_draft.has_value() ? k_draft->const_data_ptr<scalar_t>() : nullptr;
  p.v_draft = v_draft.has_value() ? v_draft->const_data_ptr<scalar_t>() : nullptr;
  p.qo_indptr = qo;
  p.kv_indptr = kv_indptr.const_data_ptr<int32_t>();
  p.kv_indices = kv_indices.const_data_ptr<index_t>();
  p.tree_mask = tree_mask.const_data_ptr<int32_t>();
  p.row_request = row_request.data();
  p.out = out.data_ptr<scalar_t>();
  p.q_row = q.stride(0);
  p.q_head = q.stride(1);
  p.k_row = k_cache.stride(0);
  p.k_head = k_cache.stride(1);
  p.v_row = v_cache.stride(0);
  p.v_head = v_cache.stride(1);
  if (k_draft.has_value()) {
    p.kd_row = k_draft->stride(0);
    p.kd_head = k_draft->stride(1);
    p.vd_row = v_draft->stride(0);
    p.vd_head = v_draft->stride(1);
  }
  p.mask_row = N > 0 ? tree_mask.stride(0) : 0;
  p.group = dims.num_q_heads / dims.num_kv_heads;
  p.num_kv_heads = dims.num_kv_heads;
  p.dqk = dims.head_dim_qk;
  p.dv = dims.head_dim_v;
  p.sm_scale = static_cast<float>(sm_scale);
  p.logit_cap = static_cast<float>(logit_cap);
  p.k_scale = static_cast<float>(k_scale);
  p.v_scale = static_cast<float>(v_scale);

  const int64_t tasks = N * dims.num_kv_heads;
  at::parallel_for(0, tasks, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t t = begin; t < end; ++t) attend_row(p, t / p.num_kv_heads, t % p.num_kv_heads, scratch);
  });
}

// Runs run_cpu with the cache element type: q's dtype, or the fp8 type of an fp8 KV cache.
template <typename scalar_t, typename index_t, typename... Args>
void run_cpu_for_cache_dtype(at::ScalarType cache_dtype, Args&&... args) {
  switch (cache_dtype) {
    case at::ScalarType::Float8_e4m3fn:
      return run_cpu<scalar_t, c10::Float8_e4m3fn, index_t>(std::forward<Args>(args)...);
    case at::ScalarType::Float8_e5m2:
      return run_cpu<scalar_t, c10::Float8_e5m2, index_t>(std::forward<Args>(args)...);
    default:  // check_tree_verify_args admits q's dtype otherwise
      return run_cpu<scalar_t, scalar_t, index_t>(std::forward<Args>(args)...);
  }
}

void tree_verify_attention_cpu_impl(const TreeVerifyDims& dims, const at::Tensor& q, const at::Tensor& k_cache,
                                    const at::Tensor& v_cache, const at::Tensor& qo_indptr,
                                    const at::Tensor& kv_indptr, const at::Tensor& kv_indices,
                                    const at::Tensor& tree_mask, double sm_scale, double logit_cap,
                                    const std::optional<at::Tensor>& k_draft,
                                    const std::optional<at::Tensor>& v_draft, double k_scale, double v_scale,
                                    at::Tensor& out) {
  check_tree_verify_values(dims, qo_indptr, kv_indptr, kv_indices, k_cache.size(0));
  if (out.numel() == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "tree_verify_attention_cpu", [&] {
    if (kv_indices.scalar_type() == at::kInt) {
      run_cpu_for_cache_dtype<scalar_t, int32_t>(k_cache.scalar_type(), dims, q, k_cache, v_cache, qo_indptr,
                                                 kv_indptr, kv_indices, tree_mask, sm_scale, logit_cap, k_draft,
                                                 v_draft, k_scale, v_scale, out);
    } else {
      run_cpu_for_cache_dtype<scalar_t, int64_t>(k_cache.scalar_type(), dims, q, k_cache, v_cache, qo_indptr,
                                                 kv_indptr, kv_indices, tree_mask, sm_scale, logit_cap, k_draft,
                                                 v_draft, k_scale, v_scale, out);
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(kdtree, CPU, m) {
  m.impl("tree_verify_attention", &tree_verify_attention_entry<&tree_verify_attention_cpu_impl>);
  m.impl("tree_verify_attention_out", &tree_verify_attention_out_entry<&tree_verify_attention_cpu_impl>);
}

}  // namespace kdtree
