// Which path an fp8 KV cache takes (tree_verify_config.h): KDTREE_OPS_FP8_PATH=widen (the default, the verified
// kernels) or overlap (the landing ring: the conversion off the math's path). Read at each call, a host getenv, like
// KDTREE_OPS_PORTABLE_MMA: the A/B of the two paths runs in one process, and a captured graph keeps the kernel it
// was captured with. Plain C++: the launch and the kernel-support answer read it alike.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

namespace kdtree::cuda {

enum class Fp8Path { kWiden, kOverlap };

inline Fp8Path fp8_path() {
  const char* v = std::getenv("KDTREE_OPS_FP8_PATH");
  if (v == nullptr || v[0] == '\0' || std::strcmp(v, "widen") == 0) return Fp8Path::kWiden;
  if (std::strcmp(v, "overlap") == 0) return Fp8Path::kOverlap;
  TORCH_CHECK(false, "KDTREE_OPS_FP8_PATH=", v, " names no fp8 path: use widen (the default) or overlap");
  return Fp8Path::kWiden;
}

}  // namespace kdtree::cuda
