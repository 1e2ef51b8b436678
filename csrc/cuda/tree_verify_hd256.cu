// Instances of the tree-verify kernel for the Hd256 family: portable, wgmma and narrow wgmma (bf16, fp16).
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_hd256(const TreeVerifyParams& p, const at::Tensor& q) {
  launch_tree_verify_family<Hd256Config, Hd256Wgmma, Hd256WgmmaNarrow>(p, q);
}
std::string tree_verify_hd256_blocker(int device, bool bf16) {
  return family_blocker<Hd256Config, Hd256Wgmma, Hd256WgmmaNarrow>(device, bf16);
}
}  // namespace kdtree::cuda
