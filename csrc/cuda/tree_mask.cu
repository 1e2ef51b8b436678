// CUDA impls of the packed tree-mask helpers (schemas in csrc/ops.cpp, semantics in kdtree_ops/ops.py):
//   tree_mask_from_parents: ancestor bitmask from within-request parent indices;
//   tree_mask_from_dense:   bitmask from SGLang's dense FULL_MASK layout.
// Both are capture-safe: the grid depends on shapes only and every per-request length (qo_indptr,
// prefix_lens, mask_indptr) is read on the device, so a graph captured at one bucket replays correctly for
// any batch that fits it. Argument checks are shared with the CPU (csrc/tree_mask_args.h); the value checks
// run only with KDTREE_OPS_DEBUG=1 outside capture (host sync).
//
// One warp per output row: it finds its request by binary search over qo_indptr, so rows of empty
// requests and padding rows past qo_indptr[B] need no separate pass (they are written as zeros).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "tree_mask_args.h"
#include "tree_verify_args.h"
#include "value_checks.cuh"

namespace kdtree {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 32 * kWarpsPerBlock;

// Request that owns query row `row`, or -1 when the row is past qo_indptr[B] (graph padding).
// qo_indptr is non-decreasing, so the last b with qo_indptr[b] <= row also has row < qo_indptr[b+1].
__device__ __forceinline__ int find_request(const int32_t* __restrict__ qo_indptr, int batch, int64_t row) {
  if (batch <= 0 || row >= qo_indptr[batch]) return -1;
  int lo = 0, hi = batch - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (qo_indptr[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Grid size for `rows` warp-per-row items: enough blocks to cover them, capped (the loops are grid-stride).
int64_t grid_for_rows(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return std::clamp<int64_t>(blocks, 1, 65535);
}

// One warp per row of mask [num_rows, words] (grid-stride): rows of no request (padding past qo_indptr[B])
// are zeroed; for the others fill(row, b, start, out, lane) writes the row (start = qo_indptr[b]).
template <class Fill>
__device__ __forceinline__ void for_each_mask_row(const int32_t* __restrict__ qo_indptr, int32_t* __restrict__ mask,
                                                  int batch, int64_t num_rows, int words, Fill fill) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int64_t num_warps = gridDim.x * static_cast<int64_t>(blockDim.x) / 32;
  for (int64_t row = warp; row < num_rows; row += num_warps) {
    int32_t* out = mask + row * words;
    const int b = find_request(qo_indptr, batch, row);
    if (b < 0) {
      for (int w = lane; w < words; w += 32) out[w] = 0;
      continue;
    }
    fill(row, b, static_cast<int64_t>(qo_indptr[b]), out, lane);
  }
}

// Lane l writes words l, l+32, ...; every lane walks the same parent chain (broadcast loads) and keeps the
// bits that fall in its words. A chain that does not strictly decrease or leaves the request (invalid input,
// rejected by the debug checks) ends the walk instead of looping.
__global__ void mask_from_parents_kernel(
    const int32_t* __restrict__ parents,    // [num_rows]
    const int32_t* __restrict__ qo_indptr,  // [batch+1]
    int32_t* __restrict__ mask,             // [num_rows, words]
    int batch, int64_t num_rows, int words) {
  for_each_mask_row(qo_indptr, mask, batch, num_rows, words,
                    [&](int64_t row, int b, int64_t start, int32_t* out, int lane) {
    const int tree = qo_indptr[b + 1] - static_cast<int>(start);
    for (int w0 = 0; w0 < words; w0 += 32) {
      const int w = w0 + lane;
      uint32_t bits = 0;
      int node = static_cast<int>(row - start);
      while (true) {
        if ((node >> 5) == w) bits |= 1u << (node & 31);
        const int parent = parents[start + node];
        if (parent < 0 || parent >= node || parent >= tree) break;
        node = parent;
      }
      if (w < words) out[w] = static_cast<int32_t>(bits);
    }
  });
}

// For each word, lane l reads draft column 32*w + l of the row's dense mask (32 consecutive bytes: coalesced)
// and a ballot packs the 32 bits.
template <typename MaskT, typename OffsetT, typename PrefixT>
__global__ void mask_from_dense_kernel(
    const MaskT* __restrict__ dense,          // [dense_len] flat FULL_MASK
    const OffsetT* __restrict__ mask_indptr,  // [>= batch]
    const int32_t* __restrict__ qo_indptr,    // [batch+1]
    const PrefixT* __restrict__ prefix_lens,  // [batch]
    int32_t* __restrict__ mask,               // [num_rows, words]
    int batch, int64_t num_rows, int words, int64_t dense_len) {
  for_each_mask_row(qo_indptr, mask, batch, num_rows, words,
                    [&](int64_t row, int b, int64_t start, int32_t* out, int lane) {
    const int64_t tree = qo_indptr[b + 1] - start;
    const int64_t prefix = static_cast<int64_t>(prefix_lens[b]);
    // Row i of request b: [L_b + T_b] bytes at mask_indptr[b] + i * (L_b + T_b); its draft columns start at L_b.
    const int64_t row_start = static_cast<int64_t>(mask_indptr[b]) + (row - start) * (prefix + tree) + prefix;
    for (int w = 0; w < words; ++w) {
      const int64_t col = 32 * static_cast<int64_t>(w) + lane;
      const int64_t at = row_start + col;
      const bool visible = col < tree && at >= 0 && at < dense_len && dense[at] != 0;
      const uint32_t bits = __ballot_sync(0xffffffffu, visible);
      if (lane == 0) out[w] = static_cast<int32_t>(bits);
    }
  });
}

at::Tensor tree_mask_from_parents_cuda(const at::Tensor& parents_in,    // [N] int32
                                       const at::Tensor& qo_indptr_in,  // [B+1] int32
                                       int64_t words) {
  const int64_t batch = check_tree_mask_from_parents_args(parents_in, qo_indptr_in, words);
  const c10::cuda::CUDAGuard guard(parents_in.device());
  const at::Tensor parents = parents_in.contiguous();  // no-ops for the usual inputs; a copy is graph-safe
  const at::Tensor qo_indptr = qo_indptr_in.contiguous();
  const int64_t num_rows = parents.size(0);

  if (cuda_value_checks_wanted()) check_tree_mask_from_parents_values(parents, qo_indptr, words);

  at::Tensor mask = at::empty({num_rows, words}, parents.options().dtype(at::kInt));
  if (num_rows == 0 || words == 0) return mask;
  mask_from_parents_kernel<<<grid_for_rows(num_rows), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      parents.data_ptr<int32_t>(), qo_indptr.data_ptr<int32_t>(), mask.data_ptr<int32_t>(),
      static_cast<int>(batch), num_rows, static_cast<int>(words));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return mask;
}

at::Tensor tree_mask_from_dense_cuda(const at::Tensor& custom_mask_in,  // [*] uint8 | bool, flat FULL_MASK
                                     const at::Tensor& mask_indptr_in,  // [>= B] int32 | int64
                                     const at::Tensor& qo_indptr_in,    // [B+1] int32
                                     const at::Tensor& prefix_lens_in,  // [>= B] int32 | int64
                                     int64_t num_tokens, int64_t words) {
  const int64_t batch =
      check_tree_mask_from_dense_args(custom_mask_in, mask_indptr_in, qo_indptr_in, prefix_lens_in, num_tokens, words);

  const c10::cuda::CUDAGuard guard(custom_mask_in.device());
  const at::Tensor custom_mask = custom_mask_in.contiguous();
  const at::Tensor mask_indptr = mask_indptr_in.contiguous();
  const at::Tensor qo_indptr = qo_indptr_in.contiguous();
  const at::Tensor prefix_lens = prefix_lens_in.contiguous();
  if (cuda_value_checks_wanted()) {
    check_tree_mask_from_dense_values(custom_mask.numel(), mask_indptr, qo_indptr, prefix_lens, num_tokens, words);
  }

  at::Tensor mask = at::empty({num_tokens, words}, qo_indptr.options().dtype(at::kInt));
  if (num_tokens == 0 || words == 0) return mask;
  const int64_t dense_len = custom_mask.numel();
  // bool and uint8 share a 1-byte layout: read both as uint8.
  const uint8_t* dense = static_cast<const uint8_t*>(custom_mask.data_ptr());
  auto launch = [&](auto offset_tag, auto prefix_tag) {
    using OffsetT = decltype(offset_tag);
    using PrefixT = decltype(prefix_tag);
    mask_from_dense_kernel<uint8_t, OffsetT, PrefixT>
        <<<grid_for_rows(num_tokens), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
            dense, mask_indptr.data_ptr<OffsetT>(), qo_indptr.data_ptr<int32_t>(), prefix_lens.data_ptr<PrefixT>(),
            mask.data_ptr<int32_t>(), static_cast<int>(batch), num_tokens, static_cast<int>(words), dense_len);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  const bool offset64 = mask_indptr.scalar_type() == at::kLong;
  const bool prefix64 = prefix_lens.scalar_type() == at::kLong;
  if (offset64 && prefix64) launch(int64_t{}, int64_t{});
  else if (offset64) launch(int64_t{}, int32_t{});
  else if (prefix64) launch(int32_t{}, int64_t{});
  else launch(int32_t{}, int32_t{});
  return mask;
}

}  // namespace

TORCH_LIBRARY_IMPL(kdtree, CUDA, m) {
  m.impl("tree_mask_from_parents", &tree_mask_from_parents_cuda);
  m.impl("tree_mask_from_dense", &tree_mask_from_dense_cuda);
}

}  // namespace kdtree
