// Argument checks of tree_mask_from_parents and tree_mask_from_dense, shared by the CPU and CUDA
// implementations so that both reject the same inputs with the same messages (as tree_verify_args.h does
// for the attention op). The *_args checks read shapes, dtypes and devices only: free under CUDA-graph
// capture. The *_values checks read the index tensors (a host sync on CUDA): the CPU path always runs them,
// the CUDA path only with KDTREE_OPS_DEBUG=1 outside graph capture.
#pragma once

#include <ATen/ATen.h>

namespace kdtree {

// Shapes/dtypes/devices of tree_mask_from_parents and words >= 0. Returns B.
int64_t check_tree_mask_from_parents_args(
    const at::Tensor& parents,    // [N] int32
    const at::Tensor& qo_indptr,  // [B+1] int32, on the device of parents
    int64_t words);

// qo_indptr starts at 0, is non-decreasing, qo_indptr[B] <= N, T_b <= 32 * words; every parent is -1 or an
// earlier token of its request. Takes tensors on any device (copied to the CPU when they are not there).
void check_tree_mask_from_parents_values(
    const at::Tensor& parents,    // [N] int32
    const at::Tensor& qo_indptr,  // [B+1] int32
    int64_t words);

// Shapes/dtypes/devices of tree_mask_from_dense, num_tokens >= 0 and words >= 0. Returns B.
int64_t check_tree_mask_from_dense_args(
    const at::Tensor& custom_mask,  // [*] uint8 | bool, flat FULL_MASK
    const at::Tensor& mask_indptr,  // [>= B] int32 | int64
    const at::Tensor& qo_indptr,    // [B+1] int32
    const at::Tensor& prefix_lens,  // [>= B] int32 | int64
    int64_t num_tokens, int64_t words);

// The qo_indptr checks above (with num_tokens rows), prefix_lens[b] >= 0, and each request's
// [T_b, L_b + T_b] mask inside custom_mask. Takes index tensors on any device (copied to the CPU).
void check_tree_mask_from_dense_values(
    int64_t custom_mask_numel,
    const at::Tensor& mask_indptr,  // [>= B] int32 | int64
    const at::Tensor& qo_indptr,    // [B+1] int32
    const at::Tensor& prefix_lens,  // [>= B] int32 | int64
    int64_t num_tokens, int64_t words);

}  // namespace kdtree
