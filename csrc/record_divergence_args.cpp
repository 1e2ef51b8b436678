#include "record_divergence_args.h"

namespace kdtree {

void check_record_divergence_args(const at::Tensor& out, const at::Tensor& ref, const at::Tensor& stats) {
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
}

}  // namespace kdtree
