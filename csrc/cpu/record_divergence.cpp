// CPU implementation of kdtree::record_divergence: divergence of `out` from `ref` accumulated into
// stats[3] in place (the CUDA version does the same on the device so a validate mode never syncs).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>

#include "record_divergence_args.h"

namespace kdtree {
namespace {

// out, ref: same shape, floating point. stats: [3] float32 = (running max |out - ref| over finite elements of
// out, count of non-finite elements of out, number of calls).
void record_divergence_cpu(const at::Tensor& out, const at::Tensor& ref, at::Tensor stats) {
  check_record_divergence_args(out, ref, stats);

  // float64 differences: exact for every input dtype, so the max is the true one.
  double max_diff = 0.0;
  double non_finite = 0.0;
  if (out.numel() > 0) {
    const at::Tensor o = out.to(at::kDouble);
    const at::Tensor finite = at::isfinite(o);
    const at::Tensor diff = at::where(finite, (o - ref.to(at::kDouble)).abs(), at::zeros({}, o.options()));
    max_diff = diff.max().item<double>();  // CPU tensors: no device sync involved
    non_finite = static_cast<double>(out.numel() - finite.sum().item<int64_t>());
  }
  float* s = stats.data_ptr<float>();
  const int64_t step = stats.stride(0);
  // NaN-safe: a NaN difference (only with a non-finite ref) never replaces the running max.
  s[0] = std::max(s[0], static_cast<float>(max_diff));
  s[step] += static_cast<float>(non_finite);
  s[2 * step] += 1.f;
}

}  // namespace

TORCH_LIBRARY_IMPL(kdtree, CPU, m) { m.impl("record_divergence", &record_divergence_cpu); }

}  // namespace kdtree
