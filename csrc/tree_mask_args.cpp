#include "tree_mask_args.h"

#include <c10/util/irange.h>

#include <utility>

namespace kdtree {
namespace {

void check_index_vector(const at::Tensor& t, const char* op, const char* name, bool allow_int64) {
  TORCH_CHECK(t.dim() == 1, op, ": ", name, " must be 1-D, got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kInt || (allow_int64 && t.scalar_type() == at::kLong), op, ": ", name,
              allow_int64 ? " must be int32 or int64" : " must be int32", ", got ", t.scalar_type());
}

// qo_indptr [B+1] int32: 1-D with at least one entry.
void check_qo_indptr_shape(const at::Tensor& qo_indptr, const char* op) {
  check_index_vector(qo_indptr, op, "qo_indptr", /*allow_int64=*/false);
  TORCH_CHECK(qo_indptr.size(0) >= 1, op, ": qo_indptr must be [B+1] with at least one entry, got ",
              qo_indptr.sizes());
}

// qo_indptr (contiguous CPU int32): starts at 0, non-decreasing, qo_indptr[B] <= rows, T_b <= 32 * words.
void check_qo_indptr_values(const at::Tensor& qo_cpu, const char* op, int64_t rows, const char* rows_name,
                            int64_t words) {
  const int32_t* qo = qo_cpu.const_data_ptr<int32_t>();
  const int64_t batch = qo_cpu.size(0) - 1;
  TORCH_CHECK(qo[0] == 0, op, ": qo_indptr[0] must be 0, got ", qo[0]);
  for (const auto b : c10::irange(batch)) {
    const int64_t tree = qo[b + 1] - qo[b];
    TORCH_CHECK(tree >= 0, op, ": qo_indptr must be non-decreasing, got qo_indptr[", b, "] = ", qo[b],
                " > qo_indptr[", b + 1, "] = ", qo[b + 1]);
    TORCH_CHECK(tree <= 32 * words, op, ": request ", b, " has ", tree, " draft tokens but words = ", words,
                " gives only ", 32 * words, " bits per row");
  }
  TORCH_CHECK(qo[batch] <= rows, op, ": qo_indptr[B] = ", qo[batch], " exceeds ", rows_name, " = ", rows);
}

}  // namespace

int64_t check_tree_mask_from_parents_args(const at::Tensor& parents, const at::Tensor& qo_indptr, int64_t words) {
  constexpr const char* op = "tree_mask_from_parents";
  check_index_vector(parents, op, "parents", /*allow_int64=*/false);
  check_qo_indptr_shape(qo_indptr, op);
  TORCH_CHECK(qo_indptr.device() == parents.device(), op, ": qo_indptr must be on the device of parents (",
              parents.device(), "), got ", qo_indptr.device());
  TORCH_CHECK(words >= 0, op, ": words must be >= 0, got ", words);
  return qo_indptr.size(0) - 1;
}

void check_tree_mask_from_parents_values(const at::Tensor& parents_any, const at::Tensor& qo_indptr_any,
                                         int64_t words) {
  constexpr const char* op = "tree_mask_from_parents";
  const at::Tensor qo_indptr = qo_indptr_any.cpu().contiguous();
  const at::Tensor parents = parents_any.cpu().contiguous();
  check_qo_indptr_values(qo_indptr, op, parents.size(0), "the N rows of parents", words);
  const int32_t* par = parents.const_data_ptr<int32_t>();
  const int32_t* qo = qo_indptr.const_data_ptr<int32_t>();
  for (const auto b : c10::irange(qo_indptr.size(0) - 1)) {
    for (int64_t i = 0; i < qo[b + 1] - qo[b]; ++i) {
      const int32_t parent = par[qo[b] + i];
      TORCH_CHECK(parent >= -1 && parent < i, op, ": parents[", qo[b] + i, "] = ", parent, " (token ", i,
                  " of request ", b, ") must be -1 (root) or the index of an earlier token of its request (0..",
                  i - 1, ")");
    }
  }
}

int64_t check_tree_mask_from_dense_args(const at::Tensor& custom_mask, const at::Tensor& mask_indptr,
                                        const at::Tensor& qo_indptr, const at::Tensor& prefix_lens,
                                        int64_t num_tokens, int64_t words) {
  constexpr const char* op = "tree_mask_from_dense";
  TORCH_CHECK(custom_mask.dim() == 1, op, ": custom_mask must be 1-D (flat), got shape ", custom_mask.sizes());
  TORCH_CHECK(custom_mask.scalar_type() == at::kByte || custom_mask.scalar_type() == at::kBool, op,
              ": custom_mask must be uint8 or bool, got ", custom_mask.scalar_type());
  check_index_vector(mask_indptr, op, "mask_indptr", /*allow_int64=*/true);
  check_index_vector(prefix_lens, op, "prefix_lens", /*allow_int64=*/true);
  check_qo_indptr_shape(qo_indptr, op);
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{mask_indptr, "mask_indptr"},
                                {qo_indptr, "qo_indptr"}, {prefix_lens, "prefix_lens"}}) {
    TORCH_CHECK(t.device() == custom_mask.device(), op, ": ", name, " must be on the device of custom_mask (",
                custom_mask.device(), "), got ", t.device());
  }
  TORCH_CHECK(num_tokens >= 0, op, ": num_tokens must be >= 0, got ", num_tokens);
  TORCH_CHECK(words >= 0, op, ": words must be >= 0, got ", words);
  const int64_t batch = qo_indptr.size(0) - 1;
  TORCH_CHECK(mask_indptr.size(0) >= batch, op, ": mask_indptr must have at least B = ", batch,
              " entries, got ", mask_indptr.sizes());
  TORCH_CHECK(prefix_lens.size(0) >= batch, op, ": prefix_lens must have at least B = ", batch,
              " entries, got ", prefix_lens.sizes());
  return batch;
}

void check_tree_mask_from_dense_values(int64_t custom_mask_numel, const at::Tensor& mask_indptr_any,
                                       const at::Tensor& qo_indptr_any, const at::Tensor& prefix_lens_any,
                                       int64_t num_tokens, int64_t words) {
  constexpr const char* op = "tree_mask_from_dense";
  const at::Tensor qo_indptr = qo_indptr_any.cpu().contiguous();
  check_qo_indptr_values(qo_indptr, op, num_tokens, "num_tokens", words);
  // int32 | int64 -> int64: a [B] copy, so one loop reads both widths.
  const at::Tensor mask_indptr = mask_indptr_any.cpu().to(at::kLong).contiguous();
  const at::Tensor prefix_lens = prefix_lens_any.cpu().to(at::kLong).contiguous();
  const int32_t* qo = qo_indptr.const_data_ptr<int32_t>();
  const int64_t* starts = mask_indptr.const_data_ptr<int64_t>();
  const int64_t* prefixes = prefix_lens.const_data_ptr<int64_t>();
  for (const auto b : c10::irange(qo_indptr.size(0) - 1)) {
    const int64_t tree = qo[b + 1] - qo[b];
    const int64_t prefix = prefixes[b];
    const int64_t start = starts[b];
    TORCH_CHECK(prefix >= 0, op, ": prefix_lens[", b, "] = ", prefix, " must be >= 0");
    TORCH_CHECK(start >= 0 && start + tree * (prefix + tree) <= custom_mask_numel, op, ": request ", b,
                "'s mask [T_b = ", tree, ", L_b + T_b = ", prefix + tree, "] at mask_indptr[", b, "] = ", start,
                " does not fit in custom_mask of ", custom_mask_numel, " entries");
  }
}

}  // namespace kdtree
