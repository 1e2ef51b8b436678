#include "launch_class.h"

#include "verified_families.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace kdtree::cuda {
namespace {

// KDTREE_OPS_EMULATE_ARCH: "80", "86", "89", "100", "120", "121" (sm_ and a dot allowed); nullptr when unset.
const char* emulation_request() {
  const char* v = std::getenv("KDTREE_OPS_EMULATE_ARCH");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0 ? v : nullptr;
}

ArchClass emulated_class(const char* request) {
  std::string digits;
  for (const char* c = request; *c != '\0'; ++c)
    if (*c >= '0' && *c <= '9') digits += *c;
  const int cc = digits.empty() ? -1 : std::atoi(digits.c_str());
  switch (cc) {
    case 80: case 87: return ArchClass::kSm80;
    case 86: case 89: case 120: case 121: return ArchClass::k99KB;
    case 100: case 103: return ArchClass::kSm100;
    default:
      TORCH_CHECK(false, "KDTREE_OPS_EMULATE_ARCH=", request, " names no architecture class: use 80, 86, 89, 100, "
                  "120 or 121");
  }
  return ArchClass::kSm90a;
}

}  // namespace

ArchClass launch_class(int device) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  const ArchClass own = arch_class_of(prop->major, prop->minor, prop->sharedMemPerBlockOptin);
  const char* request = emulation_request();
  if (request == nullptr) return own;
  TORCH_CHECK(own == ArchClass::kSm90a, "KDTREE_OPS_EMULATE_ARCH=", request, " emulates an architecture class on an "
              "sm_90 GPU only; ", prop->name, " is sm_", prop->major, prop->minor);
  return emulated_class(request);
}

bool emulating(int device) {
  return emulation_request() != nullptr && launch_class(device) != ArchClass::kSm90a;
}

std::string unverified_reason_on(const char* family, const char* cache, int device) {
  return unverified_reason(family, cache, launch_class(device), emulating(device));
}

void check_verified(const char* op, const char* family, const char* cache, int device) {
  const std::string reason = unverified_reason_on(family, cache, device);
  TORCH_CHECK(reason.empty(), op, ": ", reason);
}

}  // namespace kdtree::cuda
