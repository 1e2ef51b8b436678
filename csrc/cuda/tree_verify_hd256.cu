// Instances of the tree-verify kernel for the Hd256Config family (bf16 and fp16).
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_hd256(const TreeVerifyParams& p, const at::Tensor& q) { launch_tree_verify_family<Hd256Config>(p, q); }
}  // namespace kdtree::cuda
