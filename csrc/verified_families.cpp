#include "verified_families.h"

#include <cstdlib>
#include <cstring>

namespace kdtree {
namespace {

// Per class: sm_90a, sm_100, sm_80, 99 KB. The evidence of each true entry is named beside it (examples/results/).
constexpr VerifiedFamily kFamilies[] = {
    // Caches of q's dtype. sm_90a: the GPU suite of 2c2408e (307/307) and of 24c73ad (test_cuda_numerics 227/227,
    // graphs, error paths, has-kernel answers; examples/results/2026-12-02-24c73ad-native). sm_80 and 99 KB: their
    // configurations on the H200 under their limits, the CUDA tests 668/668 per class
    // (examples/results/2026-12-02-ab5d900-emulated). sm_100: not built.
    {"tree_verify_attention hd64", "same", {true, false, true, true}},
    {"tree_verify_attention hd128", "same", {true, false, true, true}},
    {"tree_verify_attention hd256", "same", {true, false, true, true}},
    {"tree_verify_attention mla", "same", {true, false, true, true}},
    // fp8 caches (e4m3, e5m2). sm_90a: test_cuda_fp8 77/77 (with the accuracy against SGLang's Triton fp8 path),
    // memcheck and racecheck clean on fp8 calls (24c73ad); sm_80 and 99 KB: test_cuda_fp8 within the 668 per class
    // (ab5d900). The verify kernels' source is the same at 24c73ad, ab5d900 and 4cd8dc0.
    {"tree_verify_attention hd64", "fp8", {true, false, true, true}},
    {"tree_verify_attention hd128", "fp8", {true, false, true, true}},
    {"tree_verify_attention hd256", "fp8", {true, false, true, true}},
    {"tree_verify_attention mla", "fp8", {true, false, true, true}},
    // fp8 caches on the overlap path (KDTREE_OPS_FP8_PATH=overlap: the landing ring, scales folded into the softmax
    // and O; issue 47). sm_90a: on an H100 (examples/results/2026-12-06-gpu), test_cuda_fp8's overlap half 83/87 (the
    // four others: 8-byte-stride pools, which the path refused then and hands to the widen path since), memcheck and
    // racecheck clean on the overlap calls of sanitize_case.py, the bench's fp8 column on it correct for G1-G5, M1-M5.
    // sm_80 and 99 KB: built (examples/TUNING.md, "fp8 KV caches"), their emulated runs not yet made.
    {"tree_verify_attention hd64", "fp8 overlap", {true, false, false, false}},
    {"tree_verify_attention hd128", "fp8 overlap", {true, false, false, false}},
    {"tree_verify_attention hd256", "fp8 overlap", {true, false, false, false}},
    {"tree_verify_attention mla", "fp8 overlap", {true, false, false, false}},
    // The DDTree round, which has no per-class configuration (its shared memory is checked against the device's own
    // limit at every launch, and every tested shape fits the 99 KB class). sm_90a: test_ddtree_ops (its CUDA cases
    // and bad inputs), test_cuda_ddtree 8/8 (commit tiles and grid stride, a 52 KB build in a graph, 1024-node rounds),
    // the DDTree loops, racecheck clean on rounds with tied scores (24c73ad, 4cd8dc0). sm_80 and 99 KB: the same tests
    // with the class emulated (ab5d900). ddtree_sample_targets: all of its CUDA tests under both emulated classes
    // (the same sm_90a kernel), 59 of them again natively, memcheck and racecheck clean (4cd8dc0); its 17 bad-input
    // cases on CUDA did not run (the suite's call ended first).
    {"ddtree_build_tree", "", {true, false, true, true}},
    // The level-synchronous build of ddtree_build_tree (csrc/cuda/ddtree_build_levels.cu). sm_90a: on an H100,
    // test_cuda_ddtree_levels 23/23 (bit-equal to the CPU op, graphs, budgets to 2047) served by the binary wheel,
    // memcheck and racecheck clean on sanitize_case.py's DDTree rounds (examples/results/2026-12-06-gpu). While
    // unverified for a class, ddtree_build_tree runs the serial kernel above there instead of raising.
    {"ddtree_build_tree levels", "", {true, false, false, false}},
    {"ddtree_accept_greedy", "", {true, false, true, true}},
    {"ddtree_commit_kv", "", {true, false, true, true}},
    {"ddtree_sample_targets", "", {true, false, true, true}},
};

}  // namespace

const VerifiedFamily* verified_families(int* count) {
  *count = static_cast<int>(sizeof(kFamilies) / sizeof(kFamilies[0]));
  return kFamilies;
}

bool unverified_families_allowed() {
  const char* v = std::getenv("KDTREE_OPS_UNVERIFIED");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

std::string unverified_reason(const char* family, const char* cache, ArchClass cls, bool emulated) {
  bool verified = false;
  for (const VerifiedFamily& f : kFamilies)
    if (std::strcmp(f.family, family) == 0 && std::strcmp(f.cache, cache) == 0)
      verified = f.verified[static_cast<int>(cls)];
  if (verified || unverified_families_allowed()) return "";
  const bool overlap = std::strcmp(cache, "fp8 overlap") == 0;
  const std::string over = std::strcmp(cache, "fp8") == 0 ? " over an fp8 KV cache"
                           : overlap ? " over an fp8 KV cache by the fp8 overlap path (KDTREE_OPS_FP8_PATH=overlap)"
                                     : "";
  return std::string("the CUDA kernel of ") + family + over + " for the " + limits_of(cls).name + " class" +
         (emulated ? " (emulated)" : "") + " is not yet verified on a GPU: it is built, but no run of the GPU suite " +
         "has passed this source (KDTREE_OPS_UNVERIFIED=1 runs it anyway" +
         (overlap ? "; KDTREE_OPS_FP8_PATH=widen, the default, takes the verified kernels)" : ")");
}

}  // namespace kdtree

// C entry point for Python (kdtree_ops.ops.verified_families): the table as text, one family a line,
// "family<TAB>cache<TAB>v v v v" (1/0 per class in kArchLimits order), after a header line of the class names.
extern "C" const char* kdtree_verified_families() {
  static const std::string text = [] {
    std::string s;
    for (int c = 0; c < kdtree::kArchClasses; ++c)
      s += std::string(c ? "\t" : "") + kdtree::kArchLimits[c].name;
    s += "\n";
    int count = 0;
    const kdtree::VerifiedFamily* families = kdtree::verified_families(&count);
    for (int i = 0; i < count; ++i) {
      s += std::string(families[i].family) + "\t" + families[i].cache + "\t";
      for (int c = 0; c < kdtree::kArchClasses; ++c) s += std::string(c ? " " : "") + (families[i].verified[c] ? "1" : "0");
      s += "\n";
    }
    return s;
  }();
  return text.c_str();
}

// C entry point for Python (kdtree_ops.ops.unverified_reason): the gate's answer for `family` over `cache` as class
// `class_name` (a kArchLimits name), "" where it may run; "error: ..." for a class that names none. Host-only: the CPU
// tests ask it for the families no GPU here can run.
extern "C" const char* kdtree_unverified_reason(const char* family, const char* cache, const char* class_name) {
  thread_local std::string reason;
  for (int c = 0; c < kdtree::kArchClasses; ++c)
    if (std::strcmp(kdtree::kArchLimits[c].name, class_name) == 0)
      return (reason = kdtree::unverified_reason(family, cache, static_cast<kdtree::ArchClass>(c), false)).c_str();
  return (reason = std::string("error: no architecture class ") + class_name).c_str();
}
