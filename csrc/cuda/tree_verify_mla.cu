// Instances of the tree-verify kernel for the MLA family: each architecture class's portable configuration, the
// wgmma paired and key-split ones (tile_configs.h), bf16 and fp16, over caches of q's dtype and fp8.
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_mla(const TreeVerifyParams& p, const at::Tensor& q, bool fp8) {
  // The paired kernel reads V from the K tile; otherwise the key-split one loads V over K after S.
  if (use_mla_paired_tiles(p)) launch_tree_verify_family<MlaPairedFamily>(p, q, fp8);
  else launch_tree_verify_family<MlaKeySplitFamily>(p, q, fp8);
}
// Both MLA kernels: which one a call takes depends on how its V aliases K, not on the layer's configuration.
std::string tree_verify_mla_blocker(int device, bool bf16, bool fp8) {
  const std::string paired = family_blocker<MlaPairedFamily>(device, bf16, fp8);
  return paired.empty() ? family_blocker<MlaKeySplitFamily>(device, bf16, fp8) : paired;
}
}  // namespace kdtree::cuda
