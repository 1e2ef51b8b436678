// Instances of the tree-verify kernel for the MlaConfig and MlaWgmma families (bf16 and fp16).
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_mla(const TreeVerifyParams& p, const at::Tensor& q) { launch_tree_verify_family<MlaConfig, MlaWgmma>(p, q); }
}  // namespace kdtree::cuda
