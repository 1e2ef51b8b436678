// Instances of the tree-verify kernel for the Hd64 family: portable, wgmma and narrow wgmma (bf16, fp16).
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_hd64(const TreeVerifyParams& p, const at::Tensor& q) {
  launch_tree_verify_family<Hd64Config, Hd64Wgmma, Hd64WgmmaNarrow>(p, q);
}
std::string tree_verify_hd64_blocker(int device, bool bf16) {
  return family_blocker<Hd64Config, Hd64Wgmma, Hd64WgmmaNarrow>(device, bf16);
}
}  // namespace kdtree::cuda
