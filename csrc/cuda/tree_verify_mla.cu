// Instances of the tree-verify kernel for the MLA family: portable and wgmma (bf16, fp16).
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_mla(const TreeVerifyParams& p, const at::Tensor& q) {
  // The paired kernel reads V from the K tile; otherwise the key-split one loads V over K after S.
  if (use_mla_paired_tiles(p)) launch_tree_verify_family<MlaConfig, MlaWgmma>(p, q);
  else launch_tree_verify_family<MlaConfig, MlaWgmmaKeySplit>(p, q);
}
// Both MLA kernels: which one a call takes depends on how its V aliases K, not on the layer's configuration.
std::string tree_verify_mla_blocker(int device, bool bf16) {
  const std::string paired = family_blocker<MlaConfig, MlaWgmma>(device, bf16);
  return paired.empty() ? family_blocker<MlaConfig, MlaWgmmaKeySplit>(device, bf16) : paired;
}
}  // namespace kdtree::cuda
