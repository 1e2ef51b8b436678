#include "gpu_verified.h"

#include <cstdlib>
#include <cstring>

namespace kdtree::cuda {

bool unverified_families_allowed() {
  const char* v = std::getenv("KDTREE_OPS_UNVERIFIED");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

std::string unverified_reason(const std::string& family, bool verified) {
  if (verified || unverified_families_allowed()) return "";
  return "the CUDA kernel of " + family + " is not yet verified on a GPU (it is built, but no run of the GPU suite "
         "has passed this source; KDTREE_OPS_UNVERIFIED=1 runs it anyway)";
}

}  // namespace kdtree::cuda
