// The CUDA half of the kernel-support answer (csrc/kernel_support.h): which (dtype, head dims, KV heads, KV dtype)
// the CUDA kernels have on a given device, from the family table that the op's dispatch uses: the family, whether
// the GPU suite has verified it for the device's architecture class and cache kind (verified_families.h), its launch
// blocker (kernel image for the device's architecture, shared memory against the class's per-block limit).
#include <c10/cuda/CUDAFunctions.h>

#include <string>

#include "fp8_path.h"
#include "kernel_support.h"
#include "tree_verify_dtypes.h"
#include "verified_families.h"
#include "tree_verify_families.h"

namespace kdtree::cuda {

namespace {

constexpr TreeVerifyFamily kFamilies[] = {
    {"hd64", 64, 64, false, &tree_verify_hd64, &tree_verify_hd64_blocker, "tree_verify_attention hd64"},
    {"hd128", 128, 128, false, &tree_verify_hd128, &tree_verify_hd128_blocker, "tree_verify_attention hd128"},
    {"hd256", 256, 256, false, &tree_verify_hd256, &tree_verify_hd256_blocker, "tree_verify_attention hd256"},
    {"mla", 576, 512, true, &tree_verify_mla, &tree_verify_mla_blocker, "tree_verify_attention mla"},
};

std::string dims_text(int64_t dqk, int64_t dv) { return "(" + std::to_string(dqk) + ", " + std::to_string(dv) + ")"; }

std::string cuda_unsupported_reason(const KernelQuery& q) {
  const std::string dtypes = cuda_dtype_unsupported_reason(q.q_dtype, q.kv_dtype);
  if (!dtypes.empty()) return dtypes;
  const TreeVerifyFamily* family = find_tree_verify_family(q.head_dim_qk, q.head_dim_v, q.num_kv_heads);
  if (family == nullptr)
    return "no CUDA kernel for head dims " + dims_text(q.head_dim_qk, q.head_dim_v) + " with " +
           std::to_string(q.num_kv_heads) + " KV heads; the CUDA kernels take " + kTreeVerifyHeadDims;
  const int count = c10::cuda::device_count();
  if (count == 0) return "no CUDA device is visible";
  if (q.device.index() >= count)
    return "cuda:" + std::to_string(q.device.index()) + " does not exist (" + std::to_string(count) +
           " CUDA devices visible)";
  const int device = q.device.has_index() ? q.device.index() : c10::cuda::current_device();
  const bool fp8 = q.kv_dtype != q.q_dtype;
  try {
    const std::string unverified = tree_verify_unverified_reason(*family, device, fp8, fp8_path());
    if (!unverified.empty()) return unverified;
    return family->blocker(device, q.q_dtype == c10::kBFloat16, fp8);
  } catch (const c10::Error& e) {  // e.g. KDTREE_OPS_EMULATE_ARCH naming no class: the answer is no, and why
    return e.what_without_backtrace();
  }
}

std::string launch_class_name(int device) { return limits_of(launch_class(device)).name; }

// Registered when the library loads, before any query can come.
const bool registered = (register_cuda_kernel_support(&cuda_unsupported_reason),
                         register_cuda_launch_class_name(&launch_class_name), true);

}  // namespace

const char* const kTreeVerifyHeadDims = "(Dqk, Dv) = (64, 64), (128, 128), (256, 256), or (576, 512) with one KV head (MLA)";

const TreeVerifyFamily* find_tree_verify_family(int64_t head_dim_qk, int64_t head_dim_v, int64_t num_kv_heads) {
  for (const TreeVerifyFamily& f : kFamilies) {
    if (f.head_dim_qk == head_dim_qk && f.head_dim_v == head_dim_v && (!f.one_kv_head || num_kv_heads == 1))
      return &f;
  }
  return nullptr;
}

std::string tree_verify_unverified_reason(const TreeVerifyFamily& family, int device, bool fp8, Fp8Path path) {
  // The fp8 overlap path (KDTREE_OPS_FP8_PATH=overlap) has rows of its own in the table ("fp8 overlap").
  if (fp8 && path == Fp8Path::kOverlap) return unverified_reason_on(family.verified_as, "fp8 overlap", device);
  return unverified_reason_on(family.verified_as, fp8 ? "fp8" : "same", device);
}

}  // namespace kdtree::cuda
