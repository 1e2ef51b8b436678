// CUDA implementation of kdtree::tree_verify_attention(_out): argument checks, parameter packing and the
// choice of kernel family by head dims (caches of q's dtype or fp8, by the path KDTREE_OPS_FP8_PATH names:
// fp8_path.h). Capture-safe: no host sync (value checks only with KDTREE_OPS_DEBUG=1 outside capture), launches on
// the current stream, grid from the device only.
#include <ATen/cuda/CUDAContext.h>
#include <cmath>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "tree_verify_args.h"
#include "tree_verify_dtypes.h"
#include "tree_verify_families.h"
#include "fp8_path.h"
#include "value_checks.cuh"

namespace kdtree {
namespace {

void check_16_byte_rows(const at::Tensor& t, const char* name) {
  const bool aligned = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 &&
                       (t.size(0) <= 1 || t.stride(0) % 8 == 0) && (t.size(1) <= 1 || t.stride(1) % 8 == 0);
  TORCH_CHECK(aligned, "tree_verify_attention: on CUDA, ", name,
              " needs 16-byte aligned rows (data pointer and row/head strides multiples of 8 elements), got "
              "strides ", t.strides());
}

// Row and head strides in multiples of 16 bytes (dims of one row or head need none).
bool strides_of_16_bytes(const at::Tensor& t) {
  const int64_t bytes = t.element_size();
  return (t.size(0) <= 1 || t.stride(0) * bytes % 16 == 0) && (t.size(1) <= 1 || t.stride(1) * bytes % 16 == 0);
}

bool is_prefix_view(const at::Tensor& v, const at::Tensor& k) {
  return v.data_ptr() == k.data_ptr() && v.stride(0) == k.stride(0) && v.stride(1) == k.stride(1) &&
         v.size(2) <= k.size(2);
}

void tree_verify_attention_cuda(const TreeVerifyDims& d, const at::Tensor& q, const at::Tensor& k_cache,
                                const at::Tensor& v_cache, const at::Tensor& qo_indptr, const at::Tensor& kv_indptr,
                                const at::Tensor& kv_indices, const at::Tensor& tree_mask, double sm_scale,
                                double logit_cap, const std::optional<at::Tensor>& k_draft,
                                const std::optional<at::Tensor>& v_draft, double k_scale, double v_scale,
                                at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(q.device());
  const std::string dtypes = cuda::cuda_dtype_unsupported_reason(q.scalar_type(), k_cache.scalar_type());
  TORCH_CHECK(dtypes.empty(), "tree_verify_attention: ", dtypes);
  const bool fp8 = is_fp8_cache_dtype(k_cache.scalar_type());
  if (cuda_value_checks_wanted()) {
    check_tree_verify_values(d, qo_indptr, kv_indptr, kv_indices, k_cache.size(0));
  }
  // The family is chosen before the empty-call return, so a call the kernels cannot take fails at any size.
  const cuda::TreeVerifyFamily* family = cuda::find_tree_verify_family(d.head_dim_qk, d.head_dim_v, d.num_kv_heads);
  TORCH_CHECK(family != nullptr, "tree_verify_attention: on CUDA, head dims (Dqk, Dv) = (", d.head_dim_qk, ", ",
              d.head_dim_v, ") with ", d.num_kv_heads, " KV heads have no kernel; the CUDA kernels take ",
              cuda::kTreeVerifyHeadDims);
  // The overlap path's landing ring copies fp8 rows 16 bytes at a time (the widen path 8): a cache whose row or head
  // stride is not a multiple of 16 bytes takes the widen path, said once.
  const bool overlap_requested = fp8 && cuda::fp8_path() == cuda::Fp8Path::kOverlap;
  const bool overlap = overlap_requested && strides_of_16_bytes(k_cache) && strides_of_16_bytes(v_cache);
  if (overlap_requested && !overlap) {
    TORCH_WARN_ONCE("tree_verify_attention: the fp8 overlap path (KDTREE_OPS_FP8_PATH=overlap) needs k_cache and "
                    "v_cache row/head strides that are multiples of 16 bytes; got k_cache strides ", k_cache.strides(),
                    " and v_cache strides ", v_cache.strides(), ", so such calls take the widen path");
  }
  const cuda::Fp8Path path = overlap ? cuda::Fp8Path::kOverlap : cuda::Fp8Path::kWiden;
  const std::string unverified = cuda::tree_verify_unverified_reason(*family, q.get_device(), fp8, path);
  TORCH_CHECK(unverified.empty(), "tree_verify_attention: ", unverified);
  if (d.num_tokens == 0) return;
  TORCH_CHECK(d.num_tokens <= INT32_MAX / 1024, "tree_verify_attention: too many query rows (", d.num_tokens, ")");

  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{q, "q"}, {k_cache, "k_cache"},
                                {v_cache, "v_cache"}, {out, "out"}})
    check_16_byte_rows(t, name);
  if (overlap) {
    // Its draft scores are divided by k_scale before the score scale multiplies it back (tree_verify_fp8_scales.cuh).
    TORCH_CHECK(std::isfinite(k_scale) && k_scale != 0.0, "tree_verify_attention: on CUDA, the fp8 overlap path "
                "(KDTREE_OPS_FP8_PATH=overlap) needs a finite, nonzero k_scale, got ", k_scale);
  }
  if (k_draft.has_value()) {
    check_16_byte_rows(*k_draft, "k_draft");
    check_16_byte_rows(*v_draft, "v_draft");
  }

  cuda::TreeVerifyParams p{};
  p.q = q.data_ptr();
  p.q_row_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.k_cache = k_cache.data_ptr();
  p.k_row_stride = k_cache.stride(0);
  p.k_head_stride = k_cache.stride(1);
  p.v_cache = v_cache.data_ptr();
  p.v_row_stride = v_cache.stride(0);
  p.v_head_stride = v_cache.stride(1);
  if (k_draft.has_value()) {
    p.k_draft = k_draft->data_ptr();
    p.kd_row_stride = k_draft->stride(0);
    p.kd_head_stride = k_draft->stride(1);
    p.v_draft = v_draft->data_ptr();
    p.vd_row_stride = v_draft->stride(0);
    p.vd_head_stride = v_draft->stride(1);
  }
  p.out = out.data_ptr();
  p.qo_indptr = qo_indptr.data_ptr<int32_t>();
  p.kv_indptr = kv_indptr.data_ptr<int32_t>();
  p.kv_indices = kv_indices.data_ptr();
  p.kv_indices_int64 = kv_indices.scalar_type() == at::kLong;
  p.tree_mask = reinterpret_cast<const uint32_t*>(tree_mask.data_ptr<int32_t>());
  p.mask_row_stride = tree_mask.stride(0);
  p.mask_words = static_cast<int>(d.mask_words);  // <= 32 (check_tree_verify_args)
  p.num_tokens = static_cast<int>(d.num_tokens);
  p.num_q_heads = static_cast<int>(d.num_q_heads);
  p.num_kv_heads = static_cast<int>(d.num_kv_heads);
  p.group = static_cast<int>(d.num_q_heads / d.num_kv_heads);
  p.batch = static_cast<int>(d.batch);
  p.sm_scale = static_cast<float>(sm_scale);
  p.scale_log2 = static_cast<float>(sm_scale * 1.4426950408889634);
  p.logit_cap = static_cast<float>(logit_cap);
  p.k_scale = static_cast<float>(k_scale);
  p.v_scale = static_cast<float>(v_scale);
  p.kv_fp8_e5m2 = k_cache.scalar_type() == at::ScalarType::Float8_e5m2;
  p.fp8_overlap = overlap;
  // V read from the K tile is widened with k_scale on the widen path (the overlap path's T tiles hold the stored
  // values, either scale folded apart): with another v_scale the kernels load V rows of their own.
  p.cache_v_aliases_k = is_prefix_view(v_cache, k_cache) && (!fp8 || k_scale == v_scale);
  p.draft_v_aliases_k = k_draft.has_value() && is_prefix_view(*v_draft, *k_draft);

  family->launch(p, q, fp8);
}

}  // namespace

TORCH_LIBRARY_IMPL(kdtree, CUDA, m) {
  m.impl("tree_verify_attention", &tree_verify_attention_entry<&tree_verify_attention_cuda>);
  m.impl("tree_verify_attention_out", &tree_verify_attention_out_entry<&tree_verify_attention_cuda>);
}

}  // namespace kdtree
