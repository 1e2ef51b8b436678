// The level-synchronous CUDA build of ddtree_build_tree (ddtree_build_levels.cu): its gate family, the shapes it
// takes, and its launch. ddtree.cu's op runs it where it may and the serial one-warp kernel elsewhere.
#pragma once

#include <ATen/ATen.h>

#include "ddtree_args.h"

namespace kdtree::cuda {

// Its name in the table of verified families (verified_families.cpp). While unverified for the launch's class, the
// op runs the serial kernel instead (KDTREE_OPS_UNVERIFIED=1 lifts that, as for every family).
constexpr const char* kBuildLevelsFamily = "ddtree_build_tree levels";

// Launches the level-synchronous build of dims.batch requests into the four outputs (sized by the caller) and
// returns true; or launches nothing and returns false where it does not run: a shape past its limits (budget
// > 2047, K > 255, k > 256, more shared memory than the launch's class has), the gate, or
// KDTREE_OPS_SERIAL_TREE_BUILD=1 (the serial kernel asked for, e.g. to compare them; read at each call).
bool launch_build_tree_levels(const BuildTreeDims& dims, const at::Tensor& logprobs, const at::Tensor& tokens,
                              const at::Tensor& root_tokens, at::Tensor& tree_tokens, at::Tensor& parents,
                              at::Tensor& depths, at::Tensor& tree_mask);

}  // namespace kdtree::cuda
