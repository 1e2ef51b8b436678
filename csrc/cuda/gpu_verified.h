// The gate for CUDA code that no GPU run has passed yet (DESIGN.md, "Verified and unverified CUDA code"). Such code
// lands compiled for every target and checked statically, but reaches no user until the GPU suite has passed it
// on its source: the family tables (kernel_support.cu for tree_verify_attention, each op's translation unit for
// the rest) mark each family verified or not, the commit that records the passing results flips the mark, and
// until then the kernel-support answer says no and a call raises with the reason. KDTREE_OPS_UNVERIFIED=1 (set by
// examples/gpu_suite.sh) lifts the gate.
#pragma once

#include <c10/util/Exception.h>

#include <string>

namespace kdtree::cuda {

// KDTREE_OPS_UNVERIFIED=1: unverified families run. Read at each call (a host getenv, no device work).
bool unverified_families_allowed();

// "" when `family` may run (verified, or the gate lifted); otherwise the reason, naming the family.
std::string unverified_reason(const std::string& family, bool verified);

// Raises `op`: <the reason> when `family` may not run; for ops that have no kernel-support query.
inline void check_verified(const char* op, const char* family, bool verified) {
  const std::string reason = unverified_reason(family, verified);
  TORCH_CHECK(reason.empty(), op, ": ", reason);
}

}  // namespace kdtree::cuda
