// Value checks read indices back to the host (a sync). On CUDA they run only with KDTREE_OPS_DEBUG=1, and never
// while the current stream is capturing a graph.
#pragma once

#include <ATen/cuda/CUDAGraphsUtils.cuh>

#include "tree_verify_args.h"

namespace kdtree {

inline bool cuda_value_checks_wanted() {
  return debug_checks_enabled() && at::cuda::currentStreamCaptureStatus() == at::cuda::CaptureStatus::None;
}

}  // namespace kdtree
