// The CUDA half of the kernel-support answer (csrc/kernel_support.h): which (dtype, head dims, KV heads) the CUDA
// kernels have on a given device, from the family table that the op's dispatch uses and each family's launch
// blocker (kernel image for the device's architecture, shared memory against the device's per-block limit).
#include <c10/cuda/CUDAFunctions.h>

#include <string>

#include "kernel_support.h"
#include "tree_verify_families.h"

namespace kdtree::cuda {

namespace {

constexpr TreeVerifyFamily kFamilies[] = {
    {"hd64", 64, 64, false, &tree_verify_hd64, &tree_verify_hd64_blocker},
    {"hd128", 128, 128, false, &tree_verify_hd128, &tree_verify_hd128_blocker},
    {"hd256", 256, 256, false, &tree_verify_hd256, &tree_verify_hd256_blocker},
    {"mla", 576, 512, true, &tree_verify_mla, &tree_verify_mla_blocker},
};

std::string dims_text(int64_t dqk, int64_t dv) { return "(" + std::to_string(dqk) + ", " + std::to_string(dv) + ")"; }

std::string cuda_unsupported_reason(const KernelQuery& q) {
  if (q.q_dtype != c10::kBFloat16 && q.q_dtype != c10::kHalf)
    return std::string("on CUDA, q must be bfloat16 or float16, not ") + c10::toString(q.q_dtype);
  if (q.kv_dtype != q.q_dtype)
    return std::string("no CUDA kernel for a ") + c10::toString(q.kv_dtype) + " KV cache with " +
           c10::toString(q.q_dtype) + " queries (the cache must have q's dtype)";
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
  return family->blocker(device, q.q_dtype == c10::kBFloat16);
}

// Registered when the library loads, before any query can come.
const bool registered = (register_cuda_kernel_support(&cuda_unsupported_reason), true);

}  // namespace

const char* const kTreeVerifyHeadDims = "(Dqk, Dv) = (64, 64), (128, 128), (256, 256), or (576, 512) with one KV head (MLA)";

const TreeVerifyFamily* find_tree_verify_family(int64_t head_dim_qk, int64_t head_dim_v, int64_t num_kv_heads) {
  for (const TreeVerifyFamily& f : kFamilies) {
    if (f.head_dim_qk == head_dim_qk && f.head_dim_v == head_dim_v && (!f.one_kv_head || num_kv_heads == 1))
      return &f;
  }
  return nullptr;
}

}  // namespace kdtree::cuda
