// Instances of the tree-verify kernel for the Hd64Config and Hd64Wgmma families (bf16 and fp16).
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_hd64(const TreeVerifyParams& p, const at::Tensor& q) { launch_tree_verify_family<Hd64Config, Hd64Wgmma>(p, q); }
}  // namespace kdtree::cuda
