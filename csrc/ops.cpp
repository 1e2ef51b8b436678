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
      "Tensor? v_draft=None, float k_scale=1.0, float v_scale=1.0) -> Tensor");
  // The same, written into a caller-owned `out` (CUDA-graph static buffers, SGLang's output tensor).
  m.def(
      "tree_verify_attention_out(Tensor q, Tensor k_cache, Tensor v_cache, Tensor qo_indptr, Tensor kv_indptr, "
      "Tensor kv_indices, Tensor tree_mask, float sm_scale, float logit_cap=0.0, Tensor? k_draft=None, "
      "Tensor? v_draft=None, float k_scale=1.0, float v_scale=1.0, *, Tensor(a!) out) -> ()");
  // Packed ancestor bitmask from parent indices (-1 for a root), for every request at once.
  m.def("tree_mask_from_parents(Tensor parents, Tensor qo_indptr, SymInt words) -> Tensor");
  // Packed bitmask from SGLang's dense FULL_MASK layout (the draft columns of each request's rows).
  m.def(
      "tree_mask_from_dense(Tensor custom_mask, Tensor mask_indptr, Tensor qo_indptr, Tensor prefix_lens, "
      "SymInt num_tokens, SymInt words) -> Tensor");
  // Device-side divergence statistics of `out` against `ref`, accumulated into float32 stats[3].
  m.def("record_divergence(Tensor out, Tensor ref, Tensor(a!) stats) -> ()");

  // ---- The DDTree round: its fakes, and each argument's shape and dtype, are in kdtree_ops/ddtree/ops.py ----
  m.set_python_module("kdtree_ops.ddtree.ops");  // for the defs below
  // Best-first draft tree from the block drafter's top-k: tokens, parents, depths and the packed ancestor mask.
  m.def(
      "ddtree_build_tree(Tensor logprobs, Tensor tokens, Tensor root_tokens, SymInt budget) -> (Tensor tree_tokens, "
      "Tensor parents, Tensor depths, Tensor tree_mask)");
  // Greedy acceptance: the longest root path the target's argmax agrees with, its length and the bonus token.
  m.def(
      "ddtree_accept_greedy(Tensor tree_tokens, Tensor parents, Tensor target_tokens, SymInt max_depth) -> "
      "(Tensor accepted, Tensor accept_len, Tensor next_tokens)");
  // Copies the accepted nodes' K/V rows to their destination slots (reads of a request before its writes).
  m.def(
      "ddtree_commit_kv(Tensor(a!) k_cache, Tensor(b!)? v_cache, Tensor accepted, Tensor node_slots, "
      "Tensor dest_slots) -> ()");

  // The target's token after every node, drawn with noise keyed by (seed, position, vocab id) under SGLang's
  // temperature, top-k, top-p and min-p (fakes and arguments: kdtree_ops/ddtree/sampling.py). It feeds
  // ddtree_accept_greedy: a lossless sampled acceptance.
  m.set_python_module("kdtree_ops.ddtree.sampling");  // for the def below
  m.def(
      "ddtree_sample_targets(Tensor logits, Tensor positions, Tensor temperatures, Tensor top_ks, Tensor top_ps, "
      "Tensor min_ps, Tensor seeds) -> Tensor");
}
