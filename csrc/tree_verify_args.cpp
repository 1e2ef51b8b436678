#include "tree_verify_args.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace kdtree {
namespace {

void check_float_dtype(const at::Tensor& t, const char* name, at::ScalarType expected) {
  TORCH_CHECK(t.scalar_type() == expected, "tree_verify_attention: ", name, " must have the dtype of q (",
              expected, "), got ", t.scalar_type());
}

// k_cache/v_cache: q's dtype, or one fp8 dtype for both (then the key/value is stored value x scale).
void check_cache_dtypes(const at::Tensor& k_cache, const at::Tensor& v_cache, at::ScalarType q_dtype) {
  const auto cache_dtype = k_cache.scalar_type();
  if (!is_fp8_cache_dtype(cache_dtype)) {
    TORCH_CHECK(cache_dtype_supported(q_dtype, cache_dtype), "tree_verify_attention: k_cache must have the dtype of q (", q_dtype,
                ") or be an fp8 KV cache (float8_e4m3fn or float8_e5m2), got ", cache_dtype);
    check_float_dtype(v_cache, "v_cache", q_dtype);
    return;
  }
  TORCH_CHECK(v_cache.scalar_type() == cache_dtype, "tree_verify_attention: v_cache must have the dtype of the fp8 ",
              "k_cache (", cache_dtype, "), got ", v_cache.scalar_type());
}

void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.device() == q.device(), "tree_verify_attention: ", name, " must be on the device of q (",
              q.device(), "), got ", t.device());
}

void check_inner_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, "tree_verify_attention: ", name,
              " must have a contiguous last dimension (stride 1), got strides ", t.strides());
}

void check_shape(const at::Tensor& t, const char* name, at::IntArrayRef expected, const char* layout) {
  TORCH_CHECK(t.sizes() == expected, "tree_verify_attention: ", name, " must be ", layout, " = ", expected,
              ", got ", t.sizes());
}

}  // namespace

bool is_fp8_cache_dtype(at::ScalarType dtype) {
  return dtype == at::ScalarType::Float8_e4m3fn || dtype == at::ScalarType::Float8_e5m2;
}

bool query_dtype_supported(at::ScalarType q) { return q == at::kFloat || q == at::kBFloat16 || q == at::kHalf; }

bool cache_dtype_supported(at::ScalarType q, at::ScalarType cache) { return cache == q || is_fp8_cache_dtype(cache); }

TreeVerifyDims check_tree_verify_args(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& qo_indptr,
    const at::Tensor& kv_indptr, const at::Tensor& kv_indices, const at::Tensor& tree_mask,
    const std::optional<at::Tensor>& k_draft, const std::optional<at::Tensor>& v_draft, const at::Tensor* out) {
  TORCH_CHECK(q.dim() == 3, "tree_verify_attention: q must be 3-D [N, Hq, Dqk], got ", q.sizes());
  TORCH_CHECK(k_cache.dim() == 3, "tree_verify_attention: k_cache must be 3-D [S, Hkv, Dqk], got ",
              k_cache.sizes());
  TORCH_CHECK(v_cache.dim() == 3, "tree_verify_attention: v_cache must be 3-D [S, Hkv, Dv], got ",
              v_cache.sizes());
  const auto dtype = q.scalar_type();
  TORCH_CHECK(query_dtype_supported(dtype), "tree_verify_attention: q must be float32, bfloat16 or float16, got ",
              dtype);

  TreeVerifyDims d;
  d.num_tokens = q.size(0);
  d.num_q_heads = q.size(1);
  d.head_dim_qk = q.size(2);
  d.num_kv_heads = k_cache.size(1);
  d.head_dim_v = v_cache.size(2);
  d.draft_in_cache = !k_draft.has_value();

  TORCH_CHECK(d.num_kv_heads > 0 && d.num_q_heads % d.num_kv_heads == 0,
              "tree_verify_attention: the query heads of q (", d.num_q_heads,
              ") must be a multiple of the KV heads of k_cache (", d.num_kv_heads, ")");
  TORCH_CHECK(k_cache.size(2) == d.head_dim_qk, "tree_verify_attention: k_cache head dim (", k_cache.size(2),
              ") must equal q's (", d.head_dim_qk, ")");
  TORCH_CHECK(v_cache.size(0) == k_cache.size(0) && v_cache.size(1) == d.num_kv_heads,
              "tree_verify_attention: v_cache must be [S, Hkv, Dv] with S and Hkv of k_cache ",
              k_cache.sizes(), ", got ", v_cache.sizes());

  check_cache_dtypes(k_cache, v_cache, dtype);
  check_same_device(k_cache, "k_cache", q);
  check_same_device(v_cache, "v_cache", q);
  check_inner_contiguous(q, "q");
  check_inner_contiguous(k_cache, "k_cache");
  check_inner_contiguous(v_cache, "v_cache");

  TORCH_CHECK(qo_indptr.dim() == 1 && qo_indptr.size(0) >= 1,
              "tree_verify_attention: qo_indptr must be 1-D [B+1], got ", qo_indptr.sizes());
  d.batch = qo_indptr.size(0) - 1;
  TORCH_CHECK(qo_indptr.scalar_type() == at::kInt, "tree_verify_attention: qo_indptr must be int32, got ",
              qo_indptr.scalar_type());
  TORCH_CHECK(kv_indptr.scalar_type() == at::kInt, "tree_verify_attention: kv_indptr must be int32, got ",
              kv_indptr.scalar_type());
  TORCH_CHECK(kv_indptr.dim() == 1 && kv_indptr.size(0) == d.batch + 1,
              "tree_verify_attention: kv_indptr must be [B+1] = [", d.batch + 1, "] like qo_indptr, got ",
              kv_indptr.sizes());
  TORCH_CHECK(kv_indices.dim() == 1 && (kv_indices.scalar_type() == at::kInt || kv_indices.scalar_type() == at::kLong),
              "tree_verify_attention: kv_indices must be 1-D int32 or int64, got ", kv_indices.scalar_type(),
              " ", kv_indices.sizes());
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{qo_indptr, "qo_indptr"},
                                {kv_indptr, "kv_indptr"}, {kv_indices, "kv_indices"}, {tree_mask, "tree_mask"}}) {
    check_same_device(t, name, q);
    TORCH_CHECK(t.dim() != 1 || t.size(0) <= 1 || t.stride(0) == 1, "tree_verify_attention: ", name,
                " must be contiguous");
  }

  TORCH_CHECK(tree_mask.scalar_type() == at::kInt, "tree_verify_attention: tree_mask must be int32, got ",
              tree_mask.scalar_type());
  TORCH_CHECK(tree_mask.dim() == 2 && tree_mask.size(0) == d.num_tokens,
              "tree_verify_attention: tree_mask must be [N, W] with N = ", d.num_tokens, " rows, got ",
              tree_mask.sizes());
  TORCH_CHECK(d.num_tokens == 0 || tree_mask.size(1) >= 1,
              "tree_verify_attention: tree_mask needs at least one int32 word per row, got ", tree_mask.sizes());
  // More words than 32 would describe trees past 1024 tokens, which no kernel takes: a shape error everywhere, so
  // that a wide mask (a DDTree budget of 1024 or more) fails at once rather than reach a kernel.
  TORCH_CHECK(tree_mask.size(1) <= 32, "tree_verify_attention: tree_mask must have at most 32 int32 words per row "
              "(trees of up to 1024 tokens), got ", tree_mask.sizes());
  check_inner_contiguous(tree_mask, "tree_mask");
  d.mask_words = tree_mask.size(1);

  TORCH_CHECK(k_draft.has_value() == v_draft.has_value(),
              "tree_verify_attention: pass k_draft and v_draft together, or neither");
  if (k_draft.has_value()) {
    check_shape(*k_draft, "k_draft", {d.num_tokens, d.num_kv_heads, d.head_dim_qk}, "[N, Hkv, Dqk]");
    check_shape(*v_draft, "v_draft", {d.num_tokens, d.num_kv_heads, d.head_dim_v}, "[N, Hkv, Dv]");
    check_float_dtype(*k_draft, "k_draft", dtype);
    check_float_dtype(*v_draft, "v_draft", dtype);
    check_same_device(*k_draft, "k_draft", q);
    check_same_device(*v_draft, "v_draft", q);
    check_inner_contiguous(*k_draft, "k_draft");
    check_inner_contiguous(*v_draft, "v_draft");
  }

  if (out != nullptr) {
    check_shape(*out, "out", {d.num_tokens, d.num_q_heads, d.head_dim_v}, "[N, Hq, Dv]");
    check_float_dtype(*out, "out", dtype);
    check_same_device(*out, "out", q);
    TORCH_CHECK(out->is_contiguous(), "tree_verify_attention: out must be contiguous, got strides ",
                out->strides());
  }
  return d;
}

void check_tree_verify_values(const TreeVerifyDims& d, const at::Tensor& qo_indptr_any,
                              const at::Tensor& kv_indptr_any, const at::Tensor& kv_indices_any,
                              int64_t num_slots) {
  const at::Tensor qo_indptr = qo_indptr_any.cpu().contiguous();
  const at::Tensor kv_indptr = kv_indptr_any.cpu().contiguous();
  const at::Tensor kv_indices = kv_indices_any.cpu().to(at::kLong).contiguous();
  const int32_t* qo = qo_indptr.data_ptr<int32_t>();
  const int32_t* kv = kv_indptr.data_ptr<int32_t>();
  const int64_t* slots = kv_indices.data_ptr<int64_t>();

  TORCH_CHECK(qo[0] == 0 && kv[0] == 0, "tree_verify_attention: qo_indptr[0] and kv_indptr[0] must be 0, got ",
              qo[0], " and ", kv[0]);
  TORCH_CHECK(qo[d.batch] <= d.num_tokens, "tree_verify_attention: qo_indptr[B] = ", qo[d.batch],
              " exceeds the N = ", d.num_tokens, " rows of q");
  TORCH_CHECK(kv[d.batch] <= kv_indices.size(0), "tree_verify_attention: kv_indptr[B] = ", kv[d.batch],
              " exceeds the ", kv_indices.size(0), " entries of kv_indices");
  for (int64_t b = 0; b < d.batch; ++b) {
    const int64_t tree = qo[b + 1] - qo[b];
    const int64_t slots_b = kv[b + 1] - kv[b];
    TORCH_CHECK(tree >= 0, "tree_verify_attention: qo_indptr must be non-decreasing (request ", b, ")");
    TORCH_CHECK(slots_b >= 0, "tree_verify_attention: kv_indptr must be non-decreasing (request ", b, ")");
    TORCH_CHECK(tree <= 32 * d.mask_words, "tree_verify_attention: request ", b, " has ", tree,
                " draft tokens but tree_mask has only ", d.mask_words, " words (", 32 * d.mask_words, " bits) per row");
    TORCH_CHECK(!d.draft_in_cache || slots_b >= tree, "tree_verify_attention: request ", b, " has ", slots_b,
                " kv slots, fewer than its ", tree, " draft tokens (without k_draft the slots must hold the "
                "prefix then the draft tokens)");
  }
  for (int64_t i = 0; i < kv[d.batch]; ++i) {
    TORCH_CHECK(slots[i] >= 0 && slots[i] < num_slots, "tree_verify_attention: kv_indices[", i, "] = ", slots[i],
                " is out of range for a cache of ", num_slots, " slots");
  }
}

at::Tensor new_attention_output(const at::Tensor& q, const TreeVerifyDims& d) {
  return at::empty({d.num_tokens, d.num_q_heads, d.head_dim_v}, q.options());
}

void check_tree_verify_scalars(double sm_scale, double logit_cap, double k_scale, double v_scale,
                               at::ScalarType cache_dtype) {
  TORCH_CHECK(std::isfinite(sm_scale), "tree_verify_attention: sm_scale must be finite, got ", sm_scale);
  TORCH_CHECK(std::isfinite(logit_cap) && logit_cap >= 0.0,
              "tree_verify_attention: logit_cap must be finite and >= 0 (0 disables it), got ", logit_cap);
  TORCH_CHECK(std::isfinite(k_scale) && k_scale > 0.0,
              "tree_verify_attention: k_scale must be finite and > 0 (k_cache's key = stored value x k_scale), got ",
              k_scale);
  TORCH_CHECK(std::isfinite(v_scale) && v_scale > 0.0,
              "tree_verify_attention: v_scale must be finite and > 0 (v_cache's value = stored value x v_scale), got ",
              v_scale);
  TORCH_CHECK(is_fp8_cache_dtype(cache_dtype) || (k_scale == 1.0 && v_scale == 1.0),
              "tree_verify_attention: k_scale and v_scale multiply fp8 KV caches only; with a ", cache_dtype,
              " k_cache they must be 1.0, got ", k_scale, " and ", v_scale);
}

bool debug_checks_enabled() {
  const char* v = std::getenv("KDTREE_OPS_DEBUG");
  return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
}

}  // namespace kdtree
