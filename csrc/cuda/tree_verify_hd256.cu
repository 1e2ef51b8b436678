// Instances of the tree-verify kernel for the Hd256 family: each architecture class's portable configuration, the
// wgmma and narrow wgmma ones (tile_configs.h), bf16 and fp16, over caches of q's dtype and fp8.
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_hd256(const TreeVerifyParams& p, const at::Tensor& q, bool fp8) {
  launch_tree_verify_family<Hd256Family>(p, q, fp8);
}
std::string tree_verify_hd256_blocker(int device, bool bf16, bool fp8) {
  return family_blocker<Hd256Family>(device, bf16, fp8);
}
}  // namespace kdtree::cuda
