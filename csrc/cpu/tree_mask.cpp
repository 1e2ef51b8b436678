// CPU implementations of the packed tree-mask builders (kdtree::tree_mask_from_parents,
// kdtree::tree_mask_from_dense). Both produce the [rows, W] int32 layout tree_verify_attention reads:
// bit j % 32 of word j / 32 of row i set iff draft token i attends draft token j of its own request.
// Every value is checked here (the CPU path reads values for free); rows past qo_indptr[B] are zero.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <cstring>

namespace kdtree {
namespace {

// Reads an int32 or int64 1-D CPU tensor's entry as int64.
int64_t read_index(const at::Tensor& t, int64_t i) {
  return t.scalar_type() == at::kInt ? static_cast<int64_t>(t.const_data_ptr<int32_t>()[i])
                                     : t.const_data_ptr<int64_t>()[i];
}

void check_index_vector(const at::Tensor& t, const char* op, const char* name, bool allow_int64) {
  TORCH_CHECK(t.dim() == 1, op, ": ", name, " must be 1-D, got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kInt || (allow_int64 && t.scalar_type() == at::kLong), op, ": ", name,
              allow_int64 ? " must be int32 or int64" : " must be int32", ", got ", t.scalar_type());
}

// qo_indptr [B+1] int32: starts at 0, non-decreasing, qo_indptr[B] <= rows, T_b <= 32 * words.
void check_qo_indptr(const at::Tensor& qo_indptr, const char* op, int64_t rows, const char* rows_name,
                     int64_t words) {
  check_index_vector(qo_indptr, op, "qo_indptr", /*allow_int64=*/false);
  TORCH_CHECK(qo_indptr.size(0) >= 1, op, ": qo_indptr must be [B+1] with at least one entry, got ",
              qo_indptr.sizes());
  const int32_t* qo = qo_indptr.const_data_ptr<int32_t>();
  const int64_t batch = qo_indptr.size(0) - 1;
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

// parents [N] int32, qo_indptr [B+1] int32 -> [N, words] int32.
at::Tensor tree_mask_from_parents_cpu(const at::Tensor& parents_in, const at::Tensor& qo_indptr_in, int64_t words) {
  constexpr const char* op = "tree_mask_from_parents";
  check_index_vector(parents_in, op, "parents", /*allow_int64=*/false);
  TORCH_CHECK(qo_indptr_in.device() == parents_in.device(), op, ": qo_indptr must be on the device of parents (",
              parents_in.device(), "), got ", qo_indptr_in.device());
  TORCH_CHECK(words >= 0, op, ": words must be >= 0, got ", words);
  const at::Tensor parents = parents_in.contiguous();
  const at::Tensor qo_indptr = qo_indptr_in.contiguous();
  const int64_t N = parents.size(0);
  check_qo_indptr(qo_indptr, op, N, "the N rows of parents", words);

  const int32_t* par = parents.const_data_ptr<int32_t>();
  const int32_t* qo = qo_indptr.const_data_ptr<int32_t>();
  const int64_t batch = qo_indptr.size(0) - 1;
  for (const auto b : c10::irange(batch)) {
    for (int64_t i = 0; i < qo[b + 1] - qo[b]; ++i) {
      const int32_t parent = par[qo[b] + i];
      TORCH_CHECK(parent >= -1 && parent < i, op, ": parents[", qo[b] + i, "] = ", parent, " (token ", i,
                  " of request ", b, ") must be -1 (root) or the index of an earlier token of its request (0..",
                  i - 1, ")");
    }
  }

  at::Tensor mask = at::zeros({N, words}, parents.options());
  if (mask.numel() == 0) return mask;
  int32_t* m = mask.data_ptr<int32_t>();
  // Requests are independent; within one, a row is its parent's row plus its own bit (parents come first).
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t i = 0; i < qo[b + 1] - qo[b]; ++i) {
        int32_t* row = m + (qo[b] + i) * words;
        const int32_t parent = par[qo[b] + i];
        if (parent >= 0) std::memcpy(row, m + (qo[b] + parent) * words, sizeof(int32_t) * words);
        row[i >> 5] = static_cast<int32_t>(static_cast<uint32_t>(row[i >> 5]) | (1u << (i & 31)));
      }
    }
  });
  return mask;
}

// custom_mask [*] uint8/bool flat; mask_indptr [>= B], prefix_lens [>= B] int32/int64 -> [num_tokens, words].
at::Tensor tree_mask_from_dense_cpu(const at::Tensor& custom_mask_in, const at::Tensor& mask_indptr_in,
                                    const at::Tensor& qo_indptr_in, const at::Tensor& prefix_lens_in,
                                    int64_t num_tokens, int64_t words) {
  constexpr const char* op = "tree_mask_from_dense";
  TORCH_CHECK(custom_mask_in.dim() == 1, op, ": custom_mask must be 1-D (flat), got shape ", custom_mask_in.sizes());
  TORCH_CHECK(custom_mask_in.scalar_type() == at::kByte || custom_mask_in.scalar_type() == at::kBool, op,
              ": custom_mask must be uint8 or bool, got ", custom_mask_in.scalar_type());
  check_index_vector(mask_indptr_in, op, "mask_indptr", /*allow_int64=*/true);
  check_index_vector(prefix_lens_in, op, "prefix_lens", /*allow_int64=*/true);
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{mask_indptr_in, "mask_indptr"},
                                {qo_indptr_in, "qo_indptr"}, {prefix_lens_in, "prefix_lens"}}) {
    TORCH_CHECK(t.device() == custom_mask_in.device(), op, ": ", name, " must be on the device of custom_mask (",
                custom_mask_in.device(), "), got ", t.device());
  }
  TORCH_CHECK(num_tokens >= 0, op, ": num_tokens must be >= 0, got ", num_tokens);
  TORCH_CHECK(words >= 0, op, ": words must be >= 0, got ", words);
  const at::Tensor qo_indptr = qo_indptr_in.contiguous();
  check_qo_indptr(qo_indptr, op, num_tokens, "num_tokens", words);
  const int64_t batch = qo_indptr.size(0) - 1;
  TORCH_CHECK(mask_indptr_in.size(0) >= batch, op, ": mask_indptr must have at least B = ", batch,
              " entries, got ", mask_indptr_in.sizes());
  TORCH_CHECK(prefix_lens_in.size(0) >= batch, op, ": prefix_lens must have at least B = ", batch,
              " entries, got ", prefix_lens_in.sizes());
  const at::Tensor mask_indptr = mask_indptr_in.contiguous();
  const at::Tensor prefix_lens = prefix_lens_in.contiguous();
  const at::Tensor custom_mask = custom_mask_in.contiguous();
  const int32_t* qo = qo_indptr.const_data_ptr<int32_t>();
  const int64_t mask_len = custom_mask.numel();
  for (const auto b : c10::irange(batch)) {
    const int64_t tree = qo[b + 1] - qo[b];
    const int64_t prefix = read_index(prefix_lens, b);
    const int64_t start = read_index(mask_indptr, b);
    TORCH_CHECK(prefix >= 0, op, ": prefix_lens[", b, "] = ", prefix, " must be >= 0");
    TORCH_CHECK(start >= 0 && start + tree * (prefix + tree) <= mask_len, op, ": request ", b,
                "'s mask [T_b = ", tree, ", L_b + T_b = ", prefix + tree, "] at mask_indptr[", b, "] = ", start,
                " does not fit in custom_mask of ", mask_len, " entries");
  }

  at::Tensor out = at::zeros({num_tokens, words}, qo_indptr.options());
  if (out.numel() == 0) return out;
  // bool and uint8 share one byte per entry: read both as uint8, nonzero = visible.
  const uint8_t* dense = static_cast<const uint8_t*>(custom_mask.const_data_ptr());
  int32_t* o = out.data_ptr<int32_t>();
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t tree = qo[b + 1] - qo[b];
      const int64_t prefix = read_index(prefix_lens, b);
      const uint8_t* base = dense + read_index(mask_indptr, b);
      for (int64_t i = 0; i < tree; ++i) {
        const uint8_t* src = base + i * (prefix + tree) + prefix;  // the draft columns of row i
        int32_t* row = o + (qo[b] + i) * words;
        for (int64_t j = 0; j < tree; ++j) {
          if (src[j] != 0) row[j >> 5] = static_cast<int32_t>(static_cast<uint32_t>(row[j >> 5]) | (1u << (j & 31)));
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kdtree, CPU, m) {
  m.impl("tree_mask_from_parents", &tree_mask_from_parents_cpu);
  m.impl("tree_mask_from_dense", &tree_mask_from_dense_cpu);
}

}  // namespace kdtree
