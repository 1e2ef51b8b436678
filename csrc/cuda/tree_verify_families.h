// The head-dim families of the CUDA tree-verify kernel (one translation unit each): their shapes, entry points
// and launch blockers. The op's dispatch (tree_verify_attention.cu) and its kernel-support answer
// (kernel_support.cu) both read this table, so what has_kernel_for advertises is what the op runs.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "fp8_path.h"
#include "launch_class.h"
#include "tree_verify_params.h"

namespace kdtree::cuda {

struct TreeVerifyFamily {
  const char* name;  // "hd128", "mla"
  int64_t head_dim_qk, head_dim_v;
  bool one_kv_head;  // absorbed MLA: a single latent KV head
  // Launches the family's kernel for a validated call (bf16 or fp16 by q's dtype; fp8: the caches are fp8).
  void (*launch)(const TreeVerifyParams& p, const at::Tensor& q, bool fp8);
  // Why some configuration the launch may choose on `device` cannot run there (no kernel image for its
  // architecture, more shared memory than a block may have); "" when every one can.
  std::string (*blocker)(int device, bool bf16, bool fp8);
  const char* verified_as;  // its name in the table of verified families (verified_families.h)
};

// The family of (Dqk, Dv) with Hkv KV heads, or nullptr when the CUDA kernels have none.
const TreeVerifyFamily* find_tree_verify_family(int64_t head_dim_qk, int64_t head_dim_v, int64_t num_kv_heads);

// "" when `family` may run on `device` over this cache kind (verified for the class the launch runs as, or the gate
// lifted: verified_families.h); otherwise the reason, naming the family, the class and the cache. `path`: the fp8
// path the call takes (fp8 caches only).
std::string tree_verify_unverified_reason(const TreeVerifyFamily& family, int device, bool fp8, Fp8Path path);

// The head dims the CUDA kernels take, for messages.
extern const char* const kTreeVerifyHeadDims;

// Per family, in its translation unit (tree_verify_<family>.cu).
void tree_verify_hd64(const TreeVerifyParams& p, const at::Tensor& q, bool fp8);
void tree_verify_hd128(const TreeVerifyParams& p, const at::Tensor& q, bool fp8);
void tree_verify_hd256(const TreeVerifyParams& p, const at::Tensor& q, bool fp8);
void tree_verify_mla(const TreeVerifyParams& p, const at::Tensor& q, bool fp8);
std::string tree_verify_hd64_blocker(int device, bool bf16, bool fp8);
std::string tree_verify_hd128_blocker(int device, bool bf16, bool fp8);
std::string tree_verify_hd256_blocker(int device, bool bf16, bool fp8);
std::string tree_verify_mla_blocker(int device, bool bf16, bool fp8);

}  // namespace kdtree::cuda
