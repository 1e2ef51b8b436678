// Argument checks of tree_verify_attention(_out), shared by the CPU and CUDA implementations so that both
// reject the same inputs with the same messages. Shape/dtype/device checks only: they read no tensor
// values, so they are free under CUDA-graph capture. The value checks (indptr order, slot range, enough
// mask words) are in check_tree_verify_values, which the CPU path always runs and the CUDA path runs only
// with KDTREE_OPS_DEBUG=1 outside graph capture (reading device values is a host sync).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace kdtree {

// Sizes of one validated call.
struct TreeVerifyDims {
  int64_t num_tokens;    // N: query rows (draft tokens of all requests, plus graph padding)
  int64_t num_q_heads;   // Hq
  int64_t num_kv_heads;  // Hkv (Hq % Hkv == 0)
  int64_t head_dim_qk;   // Dqk
  int64_t head_dim_v;    // Dv
  int64_t batch;         // B
  int64_t mask_words;    // W: int32 words per tree-mask row
  bool draft_in_cache;   // true: the draft tokens' K/V are the last T_b slots of each request
};

// True for the fp8 dtypes a KV cache may have (float8_e4m3fn, float8_e5m2).
bool is_fp8_cache_dtype(at::ScalarType dtype);

// The op's dtype rule on every device (the CUDA kernels take a subset: cuda/tree_verify_dtypes.h): q is float32,
// bfloat16 or float16, and the caches have q's dtype or one fp8 dtype.
bool query_dtype_supported(at::ScalarType q);
bool cache_dtype_supported(at::ScalarType q, at::ScalarType cache);

// Validates shapes, dtypes, devices and strides; `out` (when given) must be [N, Hq, Dv], contiguous,
// dtype of q. The caches have q's dtype, or are both float8_e4m3fn or both float8_e5m2 (an fp8 KV cache);
// k_draft/v_draft always have q's dtype.
TreeVerifyDims check_tree_verify_args(
    const at::Tensor& q,                     // [N, Hq, Dqk] float32 | bfloat16 | float16
    const at::Tensor& k_cache,               // [S, Hkv, Dqk] dtype of q, or fp8
    const at::Tensor& v_cache,               // [S, Hkv, Dv] dtype of k_cache
    const at::Tensor& qo_indptr,             // [B+1] int32
    const at::Tensor& kv_indptr,             // [B+1] int32
    const at::Tensor& kv_indices,            // [>= kv_indptr[B]] int32 | int64
    const at::Tensor& tree_mask,             // [N, W] int32
    const std::optional<at::Tensor>& k_draft,  // [N, Hkv, Dqk] or None
    const std::optional<at::Tensor>& v_draft,  // [N, Hkv, Dv] or None
    const at::Tensor* out);                  // [N, Hq, Dv] or nullptr

// Validates sm_scale (finite), logit_cap (finite, >= 0; 0 disables it) and the cache scales k_scale, v_scale
// (finite, > 0: an fp8 cache row's key/value is its stored value times its scale; the scales multiply fp8 caches
// only, so with a cache in q's dtype they must be 1.0 rather than be ignored).
void check_tree_verify_scalars(double sm_scale, double logit_cap, double k_scale, double v_scale,
                               at::ScalarType cache_dtype);

// Validates the index tensors' values (reads them: host sync on CUDA). Takes CPU tensors.
void check_tree_verify_values(
    const TreeVerifyDims& dims,
    const at::Tensor& qo_indptr,
    const at::Tensor& kv_indptr,
    const at::Tensor& kv_indices,
    int64_t num_slots);

// Allocates the op's output: [N, Hq, Dv], dtype and device of q.
at::Tensor new_attention_output(const at::Tensor& q, const TreeVerifyDims& dims);

// True when KDTREE_OPS_DEBUG=1: the CUDA path then also runs the value checks (outside graph capture).
bool debug_checks_enabled();

// One device's implementation: computes the attention of a validated call into `out` ([N, Hq, Dv]). k_scale and
// v_scale multiply the fp8 cache rows' keys and values (1.0 for other caches), never k_draft/v_draft.
using TreeVerifyImpl = void (*)(const TreeVerifyDims& dims, const at::Tensor& q, const at::Tensor& k_cache,
                                const at::Tensor& v_cache, const at::Tensor& qo_indptr, const at::Tensor& kv_indptr,
                                const at::Tensor& kv_indices, const at::Tensor& tree_mask, double sm_scale,
                                double logit_cap, const std::optional<at::Tensor>& k_draft,
                                const std::optional<at::Tensor>& v_draft, double k_scale, double v_scale,
                                at::Tensor& out);

// The two schemas' entry points around an implementation, the same on every device: the arguments are
// checked (shapes, dtypes, scalars: no tensor values), then the functional form allocates its output.
template <TreeVerifyImpl Impl>
at::Tensor tree_verify_attention_entry(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                       const at::Tensor& qo_indptr, const at::Tensor& kv_indptr,
                                       const at::Tensor& kv_indices, const at::Tensor& tree_mask, double sm_scale,
                                       double logit_cap, const std::optional<at::Tensor>& k_draft,
                                       const std::optional<at::Tensor>& v_draft, double k_scale, double v_scale) {
  const TreeVerifyDims dims = check_tree_verify_args(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices,
                                                     tree_mask, k_draft, v_draft, nullptr);
  check_tree_verify_scalars(sm_scale, logit_cap, k_scale, v_scale, k_cache.scalar_type());
  at::Tensor out = new_attention_output(q, dims);
  Impl(dims, q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, logit_cap, k_draft, v_draft,
       k_scale, v_scale, out);
  return out;
}

template <TreeVerifyImpl Impl>
void tree_verify_attention_out_entry(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                     const at::Tensor& qo_indptr, const at::Tensor& kv_indptr,
                                     const at::Tensor& kv_indices, const at::Tensor& tree_mask, double sm_scale,
                                     double logit_cap, const std::optional<at::Tensor>& k_draft,
                                     const std::optional<at::Tensor>& v_draft, double k_scale, double v_scale,
                                     at::Tensor out) {
  const TreeVerifyDims dims = check_tree_verify_args(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices,
                                                     tree_mask, k_draft, v_draft, &out);
  check_tree_verify_scalars(sm_scale, logit_cap, k_scale, v_scale, k_cache.scalar_type());
  Impl(dims, q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, logit_cap, k_draft, v_draft,
       k_scale, v_scale, out);
}

}  // namespace kdtree
