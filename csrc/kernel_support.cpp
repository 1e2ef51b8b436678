#include "kernel_support.h"

#include "cuda/fp8_path.h"
#include "tree_verify_args.h"

#include <atomic>
#include <cstring>

namespace kdtree {
namespace {

std::atomic<CudaKernelSupport> cuda_support{nullptr};
std::atomic<CudaLaunchClassName> cuda_launch_class_name{nullptr};

// Dtypes by their torch names ("bfloat16": str(torch.bfloat16) without "torch."), as the C entry point takes them.
bool parse_dtype(const char* name, c10::ScalarType* out) {
  static constexpr std::pair<const char*, c10::ScalarType> kNames[] = {
      {"float32", c10::kFloat}, {"bfloat16", c10::kBFloat16}, {"float16", c10::kHalf},
      {"float8_e4m3fn", c10::ScalarType::Float8_e4m3fn}, {"float8_e5m2", c10::ScalarType::Float8_e5m2}};
  for (const auto& [n, t] : kNames) {
    if (std::strcmp(n, name) == 0) {
      *out = t;
      return true;
    }
  }
  return false;
}

std::string cpu_unsupported_reason(const KernelQuery& q) {
  if (!query_dtype_supported(q.q_dtype))
    return std::string("q must be float32, bfloat16 or float16, not ") + c10::toString(q.q_dtype);
  // fp8 caches (stored value x k_scale/v_scale) with any q dtype above: the CPU kernel converts cache rows as read.
  if (!cache_dtype_supported(q.q_dtype, q.kv_dtype))
    return std::string("no kernel for a ") + c10::toString(q.kv_dtype) + " KV cache with " +
           c10::toString(q.q_dtype) + " queries (the cache must have q's dtype, or be float8_e4m3fn or float8_e5m2)";
  return "";
}

}  // namespace

void register_cuda_kernel_support(CudaKernelSupport support) { cuda_support.store(support); }
void register_cuda_launch_class_name(CudaLaunchClassName name) { cuda_launch_class_name.store(name); }

std::string kernel_unsupported_reason(const KernelQuery& query) {
  if (query.head_dim_qk <= 0 || query.head_dim_v <= 0 || query.num_kv_heads <= 0)
    return "head dims and KV heads must be positive";
  if (query.device.is_cpu()) return cpu_unsupported_reason(query);
  if (query.device.is_cuda()) {
    const CudaKernelSupport support = cuda_support.load();
    if (support == nullptr)
      return "this build of kdtree_ops has no CUDA kernels (it was built CPU only: no nvcc found, "
             "KDTREE_OPS_CPU_ONLY=1, or no CUDA target named on a machine without a GPU)";
    return support(query);
  }
  return std::string("no kernels for device type ") + c10::DeviceTypeName(query.device.type());
}

}  // namespace kdtree

// C entry point for Python (kdtree_ops.ops.kernel_unsupported_reason, through ctypes): a host-only query that
// must not be a dispatcher op (it takes no tensors and is never traced). The returned text lives until the
// calling thread's next call.
extern "C" const char* kdtree_tree_verify_unsupported_reason(const char* device_type, int device_index,
                                                             const char* q_dtype, const char* kv_dtype,
                                                             int64_t head_dim_qk, int64_t head_dim_v,
                                                             int64_t num_kv_heads) {
  thread_local std::string reason;
  try {  // nothing may leave a C entry point as an exception: the caller (ctypes) would abort the process
    c10::ScalarType q{}, kv{};
    if (!kdtree::parse_dtype(q_dtype, &q)) {
      reason = std::string("no kernel for q of dtype ") + q_dtype;
    } else if (!kdtree::parse_dtype(kv_dtype, &kv)) {
      reason = std::string("no kernel for a KV cache of dtype ") + kv_dtype;
    } else if (std::strcmp(device_type, "cpu") != 0 && std::strcmp(device_type, "cuda") != 0) {
      reason = std::string("no kernels for device type ") + device_type;
    } else {
      const bool cpu = std::strcmp(device_type, "cpu") == 0;
      const c10::Device device(cpu ? c10::DeviceType::CPU : c10::DeviceType::CUDA,
                               static_cast<c10::DeviceIndex>(cpu ? -1 : device_index));
      reason = kdtree::kernel_unsupported_reason({device, q, kv, head_dim_qk, head_dim_v, num_kv_heads});
    }
  } catch (const std::exception& e) {
    reason = std::string("the kernel-support query failed: ") + e.what();
  } catch (...) {
    reason = "the kernel-support query failed";
  }
  return reason.c_str();
}

// C entry point for Python (kdtree_ops.ops.cuda_launch_class): the class name a launch on CUDA device `device` runs
// as, "" in a build without CUDA kernels, or "error: ..." (e.g. KDTREE_OPS_EMULATE_ARCH naming no class).
extern "C" const char* kdtree_cuda_launch_class(int device) {
  thread_local std::string name;
  try {
    const kdtree::CudaLaunchClassName query = kdtree::cuda_launch_class_name.load();
    name = query == nullptr ? "" : query(device);
  } catch (const std::exception& e) {
    name = std::string("error: ") + e.what();
  } catch (...) {
    name = "error: the launch-class query failed";
  }
  return name.c_str();
}

// C entry point for Python (kdtree_ops.ops.fp8_path): the fp8 path KDTREE_OPS_FP8_PATH names now ("widen" or
// "overlap"), or "error: ..." for a value that names none (what an fp8 call on CUDA raises). Host-only, plain C++.
extern "C" const char* kdtree_fp8_path() {
  thread_local std::string answer;
  try {
    answer = kdtree::cuda::fp8_path() == kdtree::cuda::Fp8Path::kOverlap ? "overlap" : "widen";
  } catch (const c10::Error& e) {
    answer = std::string("error: ") + e.msg();
  }
  return answer.c_str();
}
