// The architecture classes the CUDA kernels are configured for, and their limits (DESIGN.md, "Architectures").
// Every configuration a class launches is checked against its class's row here at compile time (tile_configs.h) and
// against the device at launch (tree_verify_launch.cuh); the dispatch, the kernel-support answer and the verified
// states (verified_families.h) take the class from the same function. Plain C++: the CPU build reads it too.
#pragma once

#include <cstddef>

namespace kdtree {

enum class ArchClass : int { kSm90a = 0, kSm100 = 1, kSm80 = 2, k99KB = 3 };
constexpr int kArchClasses = 4;

struct ArchLimits {
  const char* name;          // for messages and the support matrix
  const char* gpus;
  size_t smem_per_block;     // the opt-in maximum a block may have
  size_t smem_per_sm;        // what all of an SM's blocks share (each also costs the driver's 1 KB)
  int threads_per_sm;
  bool wgmma;                // sm_90a's warpgroup MMA (the tile loops that use it); elsewhere mma.sync
  bool clusters;             // thread-block clusters (distributed shared memory)
  bool programmatic_launch;  // programmatic dependent launch (griddepcontrol)
};

constexpr ArchLimits kArchLimits[kArchClasses] = {
    {"sm_90a", "H100, H200, H800", 232448, 233472, 2048, true, true, true},
    {"sm_100", "B200, GB200 (mma.sync; tcgen05 not written)", 232448, 233472, 2048, false, false, true},
    {"sm_80", "A100, A800 (and sm_87)", 166912, 167936, 2048, false, false, false},
    {"99 KB", "sm_86 (A10, A6000), sm_89 (L40S, RTX 4090), sm_120/121 (RTX PRO 6000, RTX 5090, DGX Spark)",
     101376, 102400, 1536, false, false, false},
};

constexpr const ArchLimits& limits_of(ArchClass c) { return kArchLimits[static_cast<int>(c)]; }

// The class of a device by its compute capability; one this table does not name takes the class of its shared
// memory (so that no configuration it is given can exceed it).
inline ArchClass arch_class_of(int major, int minor, size_t smem_per_block) {
  if (major == 9 && minor == 0) return ArchClass::kSm90a;
  if (major == 10) return ArchClass::kSm100;
  if (major == 8 && (minor == 0 || minor == 7)) return ArchClass::kSm80;
  if ((major == 8 && (minor == 6 || minor == 9)) || major == 12) return ArchClass::k99KB;
  if (smem_per_block >= limits_of(ArchClass::kSm100).smem_per_block) return ArchClass::kSm100;
  if (smem_per_block >= limits_of(ArchClass::kSm80).smem_per_block) return ArchClass::kSm80;
  return ArchClass::k99KB;
}

}  // namespace kdtree
