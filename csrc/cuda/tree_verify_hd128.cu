// Instances of the tree-verify kernel for the Hd128 family: portable, wgmma and narrow wgmma (bf16, fp16).
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_hd128(const TreeVerifyParams& p, const at::Tensor& q) {
  launch_tree_verify_family<Hd128Config, Hd128Wgmma, Hd128WgmmaNarrow>(p, q);
}
std::string tree_verify_hd128_blocker(int device, bool bf16) {
  return family_blocker<Hd128Config, Hd128Wgmma, Hd128WgmmaNarrow>(device, bf16);
}
}  // namespace kdtree::cuda
