// The gate for CUDA code that no GPU run has passed yet (DESIGN.md, "Verified and unverified CUDA code"), and the
// one table of what the GPU suite has verified. CUDA code lands compiled for every target and checked statically,
// but a family reaches users only once the GPU suite has passed it on its source: until its entry here says so, the
// kernel-support answer (has_kernel_for) says no and a call raises, naming the family and the class. The commit that
// records the passing results (examples/results/) flips the entry. KDTREE_OPS_UNVERIFIED=1 (set by
// examples/gpu_suite.sh) lifts the gate. Plain C++ (the CPU build serves the table to Python and the README test).
#pragma once

#include <string>

#include "arch_classes.h"

namespace kdtree {

// One family of CUDA code: an op's kernels (for tree_verify_attention, one head-dim family over one kind of cache),
// verified or not per architecture class. The gate covers the verify kernels and the DDTree round; the mask helpers
// and record_divergence, small kernels with no per-class configuration, are not gated (arch_classes.h; a class other than sm_90a by running its configurations
// on the H200 under its limits, KDTREE_OPS_EMULATE_ARCH).
struct VerifiedFamily {
  const char* family;  // "tree_verify_attention hd128", "ddtree_build_tree"
  // tree_verify_attention: "same" (q's dtype), "fp8" (the widen path, the default) or "fp8 overlap"
  // (KDTREE_OPS_FP8_PATH=overlap, cuda/fp8_path.h); "" for the other ops
  const char* cache;
  bool verified[kArchClasses];  // sm_90a, sm_100, sm_80, 99 KB
};

// Every CUDA family, in the order the README's support matrix lists them.
const VerifiedFamily* verified_families(int* count);

// KDTREE_OPS_UNVERIFIED=1: unverified families run. Read at each call (a host getenv, no device work).
bool unverified_families_allowed();

// "" when `family` (over `cache`) may run as class `cls` (verified, or the gate lifted); otherwise the reason,
// naming the family, the class and the switch. A family missing from the table is unverified.
std::string unverified_reason(const char* family, const char* cache, ArchClass cls, bool emulated);

}  // namespace kdtree
