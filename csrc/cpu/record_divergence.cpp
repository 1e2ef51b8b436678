// CPU implementation of kdtree::record_divergence: divergence of `out` from `ref` accumulated into
// stats[3] in place (the CUDA version does the same on the device so a validate mode never syncs).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>

namespace kdtree {
namespace {

// out, ref: same shape, floating point. stats: [3] float32 = (running max |out - ref| over finite elements of
// out, count of non-finite elements of out, number of calls).
void record_divergence_cpu(const at::Tensor& out, const at::Tensor& ref, at::Tensor stats) {
  constexpr const char* op = "record_divergence";
  TORCH_CHECK(at::isFloatingType(out.scalar_type()), op, ": out must be floating point, got ", out.scalar_type());
  TORCH_CHECK(at::isFloatingType(ref.scalar_type()), op, ": ref must be floating point, got ", ref.scalar_type());
  TORCH_CHECK(out.sizes() == ref.sizes(), op, ": ref must have the shape of out ", out.sizes(), ", got ",
              ref.sizes());
  TORCH_CHECK(stats.scalar_type() == at::kFloat && stats.dim() == 1 && stats.size(0) == 3, op,
              ": stats must be float32 [3], got ", stats.scalar_type(), " ", stats.sizes());
  TORCH_CHECK(ref.device() == out.device() && stats.device() == out.device(), op,
              ": ref and stats must be on the device of out (", out.device(), "), got ", ref.device(), " and ",
              stats.device());

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
