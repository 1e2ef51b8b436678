// Argument checks of ddtree_sample_targets, shared by the CPU and CUDA implementations so that both reject the same
// inputs with the same messages. check_sample_targets_args reads shapes, dtypes and devices only (free under CUDA-graph
// capture); check_sample_targets_values reads the sampling parameters (a host sync on CUDA: the CPU path always runs
// it, the CUDA path only with KDTREE_OPS_DEBUG=1 outside graph capture). Semantics: kdtree_ops/ddtree/sampling.py.
#pragma once

#include <ATen/ATen.h>

namespace kdtree {

// Rows beyond 2^22 tokens would take the integer masses past 2^53 (ddtree_sample_math.h): larger than any vocabulary.
constexpr int64_t kMaxSampleVocab = int64_t{1} << 22;

struct SampleTargetsDims {
  int64_t batch;  // B
  int64_t nodes;  // T: tree nodes per request (rows of logits per request)
  int64_t vocab;  // V
};

// The inputs in the layout the kernels read: logits with a contiguous last dimension, positions [B*T] int64, and the
// per-request parameters as contiguous [B] tensors: temperatures float32, top_ks int64, top_ps and min_ps float32,
// seeds int64. Conversions are device ops (no host sync); for SGLang's own dtypes they are views.
struct SampleTargetsInputs {
  at::Tensor logits, positions, temperatures, top_ks, top_ps, min_ps, seeds;
};

// logits [B*T, V] float32 | bfloat16 | float16, 1 <= V <= 2^22; positions [B, T] int64; temperatures [B] or [B, 1]
// float32 (SamplingBatchInfo.temperatures is [B, 1]); top_ks [B] int32 | int64; top_ps [B] float32; min_ps [B]
// float32; seeds [B] int64; all on the device of logits.
SampleTargetsDims check_sample_targets_args(const at::Tensor& logits, const at::Tensor& positions,
                                            const at::Tensor& temperatures, const at::Tensor& top_ks,
                                            const at::Tensor& top_ps, const at::Tensor& min_ps,
                                            const at::Tensor& seeds);

SampleTargetsInputs sample_targets_inputs(const at::Tensor& logits, const at::Tensor& positions,
                                          const at::Tensor& temperatures, const at::Tensor& top_ks,
                                          const at::Tensor& top_ps, const at::Tensor& min_ps, const at::Tensor& seeds);

// Every temperature is finite and >= 0, every top_p in (0, 1], every min_p in [0, 1] (SGLang's own validation of a
// request's parameters). Takes tensors on any device.
void check_sample_targets_values(const SampleTargetsInputs& inputs);

}  // namespace kdtree
