// Instances of the tree-verify kernel for the Hd128 family: portable, wgmma and narrow wgmma (bf16, fp16).
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_hd128(const TreeVerifyParams& p, const at::Tensor& q) {
  launch_tree_verify_family<Hd128Config, Hd128Wgmma, Hd128WgmmaNarrow>(p, q);
}
}  // namespace kdtree::cuda
