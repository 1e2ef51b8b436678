// CPU implementations of the packed tree-mask builders (kdtree::tree_mask_from_parents,
// kdtree::tree_mask_from_dense). Both produce the [rows, W] int32 layout tree_verify_attention reads:
// bit j % 32 of word j / 32 of row i set iff draft token i attends draft token j of its own request.
// Every value is checked (csrc/tree_mask_args.h; the CPU path reads values for free); rows past qo_indptr[B]
// are zero.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

#include "tree_mask_args.h"

namespace kdtree {
namespace {

// Reads an int32 or int64 1-D CPU tensor's entry as int64.
int64_t read_index(const at::Tensor& t, int64_t i) {
  return t.scalar_type() == at::kInt ? static_cast<int64_t>(t.const_data_ptr<int32_t>()[i])
                                     : t.const_data_ptr<int64_t>()[i];
}

// parents [N] int32, qo_indptr [B+1] int32 -> [N, words] int32.
at::Tensor tree_mask_from_parents_cpu(const at::Tensor& parents_in, const at::Tensor& qo_indptr_in, int64_t words) {
  const int64_t batch = check_tree_mask_from_parents_args(parents_in, qo_indptr_in, words);
  const at::Tensor parents = parents_in.contiguous();
  const at::Tensor qo_indptr = qo_indptr_in.contiguous();
  check_tree_mask_from_parents_values(parents, qo_indptr, words);
  const int64_t N = parents.size(0);
  const int32_t* par = parents.const_data_ptr<int32_t>();
  const int32_t* qo = qo_indptr.const_data_ptr<int32_t>();

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
  const int64_t batch =
      check_tree_mask_from_dense_args(custom_mask_in, mask_indptr_in, qo_indptr_in, prefix_lens_in, num_tokens, words);
  const at::Tensor qo_indptr = qo_indptr_in.contiguous();
  const at::Tensor mask_indptr = mask_indptr_in.contiguous();
  const at::Tensor prefix_lens = prefix_lens_in.contiguous();
  const at::Tensor custom_mask = custom_mask_in.contiguous();
  check_tree_mask_from_dense_values(custom_mask.numel(), mask_indptr, qo_indptr, prefix_lens, num_tokens, words);
  const int32_t* qo = qo_indptr.const_data_ptr<int32_t>();

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
