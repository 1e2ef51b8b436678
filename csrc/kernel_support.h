// What tree_verify_attention can run, per device: the one answer that the CUDA dispatch, its launch checks and
// Python's has_kernel_for (and through it the SGLang backend's routing) all take. CPU builds answer for the CPU;
// the CUDA translation units register the CUDA answer at load, so a build without CUDA kernels says no for CUDA.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace kdtree {

// One layer configuration as a caller describes it, without tensors.
struct KernelQuery {
  c10::Device device;         // cpu, or cuda:i
  c10::ScalarType q_dtype;    // dtype of q (and of the output)
  c10::ScalarType kv_dtype;   // dtype of k_cache / v_cache
  int64_t head_dim_qk;        // Dqk
  int64_t head_dim_v;         // Dv
  int64_t num_kv_heads;       // Hkv
};

// Why the op has no kernel for `query` on its device; "" when it has one.
std::string kernel_unsupported_reason(const KernelQuery& query);

// The CUDA answer, registered by the CUDA translation units when the library loads (none in a CPU-only build).
using CudaKernelSupport = std::string (*)(const KernelQuery& query);
void register_cuda_kernel_support(CudaKernelSupport support);

// The architecture class a launch on CUDA device `device` runs as (arch_classes.h: its own, or the emulated one),
// by name; registered likewise.
using CudaLaunchClassName = std::string (*)(int device);
void register_cuda_launch_class_name(CudaLaunchClassName name);

}  // namespace kdtree
