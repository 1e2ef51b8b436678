// Instances of the tree-verify kernel for the MLA family: portable and wgmma (bf16, fp16).
#include "tree_verify_launch.cuh"

namespace kdtree::cuda {
void tree_verify_mla(const TreeVerifyParams& p, const at::Tensor& q) {
  // The paired kernel reads V from the K tile; otherwise the key-split one loads V over K after S.
  const bool v_in_k = p.cache_v_aliases_k && (p.k_draft == nullptr || p.draft_v_aliases_k);
  if (v_in_k) launch_tree_verify_family<MlaConfig, MlaWgmma>(p, q);
  else launch_tree_verify_family<MlaConfig, MlaWgmmaKeySplit>(p, q);
}
}  // namespace kdtree::cuda
