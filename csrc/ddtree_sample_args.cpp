#include "ddtree_sample_args.h"

#include <c10/util/irange.h>

#include <cmath>

namespace kdtree {
namespace {

constexpr const char* kOp = "ddtree_sample_targets";

// A per-request parameter: [B] of one of `dtypes` on the device of logits; `layout` names the expected form.
void check_param(const at::Tensor& t, const at::Tensor& logits, int64_t batch, const char* name,
                 std::initializer_list<at::ScalarType> dtypes, const char* dtype_names) {
  bool dtype_ok = false;
  for (const auto d : dtypes) dtype_ok = dtype_ok || t.scalar_type() == d;
  TORCH_CHECK(t.dim() == 1 && t.size(0) == batch && dtype_ok, kOp, ": ", name, " must be [B] = [", batch, "] ",
              dtype_names, ", got shape ", t.sizes(), " ", t.scalar_type());
  TORCH_CHECK(t.device() == logits.device(), kOp, ": ", name, " must be on the device of logits (", logits.device(),
              "), got ", t.device());
}

}  // namespace

SampleTargetsDims check_sample_targets_args(const at::Tensor& logits, const at::Tensor& positions,
                                            const at::Tensor& temperatures, const at::Tensor& top_ks,
                                            const at::Tensor& top_ps, const at::Tensor& min_ps,
                                            const at::Tensor& seeds) {
  const auto dtype = logits.scalar_type();
  TORCH_CHECK(logits.dim() == 2 && (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf), kOp,
              ": logits must be [B*T, V] Float, BFloat16 or Half, got shape ", logits.sizes(), " ", dtype);
  TORCH_CHECK(positions.dim() == 2 && positions.scalar_type() == at::kLong, kOp,
              ": positions must be [B, T] Long, got shape ", positions.sizes(), " ", positions.scalar_type());
  const int64_t batch = positions.size(0), nodes = positions.size(1), vocab = logits.size(1);
  TORCH_CHECK(logits.size(0) == batch * nodes, kOp, ": logits must be [B*T, V] with B*T = ", batch, "*", nodes,
              " = ", batch * nodes, " rows (positions is [B, T] = ", positions.sizes(), "), got ", logits.sizes());
  TORCH_CHECK(vocab >= 1 && vocab <= kMaxSampleVocab, kOp, ": logits must have 1 <= V <= 2^22 columns, got ", vocab);
  TORCH_CHECK(positions.device() == logits.device(), kOp, ": positions must be on the device of logits (",
              logits.device(), "), got ", positions.device());
  const bool temperature_column = temperatures.dim() == 2 && temperatures.size(1) == 1;
  check_param(temperature_column ? temperatures.squeeze(1) : temperatures, logits, batch, "temperatures",
              {at::kFloat}, "(or [B, 1]) Float");
  check_param(top_ks, logits, batch, "top_ks", {at::kInt, at::kLong}, "Int or Long");
  check_param(top_ps, logits, batch, "top_ps", {at::kFloat}, "Float");
  check_param(min_ps, logits, batch, "min_ps", {at::kFloat}, "Float");
  check_param(seeds, logits, batch, "seeds", {at::kLong}, "Long");
  return {batch, nodes, vocab};
}

SampleTargetsInputs sample_targets_inputs(const at::Tensor& logits, const at::Tensor& positions,
                                          const at::Tensor& temperatures, const at::Tensor& top_ks,
                                          const at::Tensor& top_ps, const at::Tensor& min_ps, const at::Tensor& seeds) {
  return {logits.stride(1) == 1 ? logits : logits.contiguous(),
          positions.reshape({-1}).contiguous(),
          temperatures.reshape({-1}).contiguous(),
          top_ks.to(at::kLong).contiguous(),
          top_ps.contiguous(),
          min_ps.contiguous(),
          seeds.contiguous()};
}

void check_sample_targets_values(const SampleTargetsInputs& inputs) {
  const at::Tensor temperatures = inputs.temperatures.cpu(), top_ps = inputs.top_ps.cpu(),
                   min_ps = inputs.min_ps.cpu();
  const float* t = temperatures.const_data_ptr<float>();
  const float* p = top_ps.const_data_ptr<float>();
  const float* m = min_ps.const_data_ptr<float>();
  for (const auto b : c10::irange(temperatures.numel())) {
    TORCH_CHECK(std::isfinite(t[b]) && t[b] >= 0.0f, kOp, ": temperatures[", b, "] = ", t[b],
                " must be finite and >= 0 (0: greedy)");
    TORCH_CHECK(p[b] > 0.0f && p[b] <= 1.0f, kOp, ": top_ps[", b, "] = ", p[b], " must be in (0, 1] (1: off)");
    TORCH_CHECK(m[b] >= 0.0f && m[b] <= 1.0f, kOp, ": min_ps[", b, "] = ", m[b], " must be in [0, 1] (0: off)");
  }
}

}  // namespace kdtree
