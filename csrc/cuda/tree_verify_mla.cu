// Instances of the tree-verify kernel for the MLA family: portable and wgmma (bf16, fp16).
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_mla(const TreeVerifyParams& p, const at::Tensor& q) {
  launch_tree_verify_family<MlaConfig, MlaWgmma>(p, q);
}
}  // namespace kdtree::cuda
