// The dtypes the CUDA tree-verify kernels take, in one place: the op's CUDA entry raises this reason and the
// kernel-support answer (has_kernel_for) returns it.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

namespace kdtree::cuda {

// "" when q (bfloat16 or float16) and a KV cache of `kv` (q's dtype, float8_e4m3fn or float8_e5m2) have kernels.
inline std::string cuda_dtype_unsupported_reason(c10::ScalarType q, c10::ScalarType kv) {
  if (q != c10::kBFloat16 && q != c10::kHalf)
    return std::string("on CUDA, q must be bfloat16 or float16, got ") + c10::toString(q);
  if (kv != q && kv != c10::ScalarType::Float8_e4m3fn && kv != c10::ScalarType::Float8_e5m2)
    return std::string("no CUDA kernel for a ") + c10::toString(kv) + " KV cache with " + c10::toString(q) +
           " queries (the cache must have q's dtype, or be float8_e4m3fn or float8_e5m2)";
  return "";
}

}  // namespace kdtree::cuda
