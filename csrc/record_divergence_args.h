// Argument checks of record_divergence, shared by the CPU and CUDA implementations so that both reject the
// same inputs with the same messages. Shapes, dtypes and devices only: free under CUDA-graph capture.
#pragma once

#include <ATen/ATen.h>

namespace kdtree {

// out and ref floating point, ref of out's shape, stats float32 [3], all on the device of out.
void check_record_divergence_args(
    const at::Tensor& out,     // [*] floating
    const at::Tensor& ref,     // [*] floating, shape of out
    const at::Tensor& stats);  // [3] float32

}  // namespace kdtree
