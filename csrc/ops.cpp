// The kdtree op schemas: the one place they are written. Implementations register per dispatch key in
// csrc/cpu/*.cpp and csrc/cuda/*.cu; fake (meta) implementations live in kdtree_ops/ops.py.
#include <torch/library.h>

TORCH_LIBRARY(kdtree, m) {
  // Fakes are Python (`register_fake`): loading this library without importing that module would leave
  // torch.compile without them, so say where they are.
  m.set_python_module("kdtree_ops.ops");

  // Attention of every draft token over its request's committed prefix plus its tree ancestors.
  m.def(
      "tree_verify_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor qo_indptr, Tensor kv_indptr, "
      "Tensor kv_indices, Tensor tree_mask, float sm_scale, float logit_cap=0.0, Tensor? k_draft=None, "
      "Tensor? v_draft=None) -> Tensor");
  // The same, written into a caller-owned `out` (CUDA-graph static buffers, SGLang's output tensor).
  m.def(
      "tree_verify_attention_out(Tensor q, Tensor k_cache, Tensor v_cache, Tensor qo_indptr, Tensor kv_indptr, "
      "Tensor kv_indices, Tensor tree_mask, float sm_scale, float logit_cap=0.0, Tensor? k_draft=None, "
      "Tensor? v_draft=None, *, Tensor(a!) out) -> ()");
  // Packed ancestor bitmask from parent indices (-1 for a root), for every request at once.
  m.def("tree_mask_from_parents(Tensor parents, Tensor qo_indptr, SymInt words) -> Tensor");
  // Packed bitmask from SGLang's dense FULL_MASK layout (the draft columns of each request's rows).
  m.def(
      "tree_mask_from_dense(Tensor custom_mask, Tensor mask_indptr, Tensor qo_indptr, Tensor prefix_lens, "
      "SymInt num_tokens, SymInt words) -> Tensor");
  // Device-side divergence statistics of `out` against `ref`, accumulated into float32 stats[3].
  m.def("record_divergence(Tensor out, Tensor ref, Tensor(a!) stats) -> ()");
}
