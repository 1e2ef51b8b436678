#include "verified_families.h"

#include <cstdlib>
#include <cstring>

namespace kdtree {
namespace {

// Per class: sm_90a, sm_100, sm_80, 99 KB. The evidence of each true entry is named beside it (examples/results/).
constexpr VerifiedFamily kFamilies[] = {
    // Caches of q's dtype on sm_90a: the GPU suite of 2c2408e (307/307) and the H200 run of 6633749, the kernels'
    // SASS unchanged between them. fp8 caches and the other classes' configurations are new source.
    {"tree_verify_attention hd64", "same", {true, false, false, false}},
    {"tree_verify_attention hd128", "same", {true, false, false, false}},
    {"tree_verify_attention hd256", "same", {true, false, false, false}},
    {"tree_verify_attention mla", "same", {true, false, false, false}},
    {"tree_verify_attention hd64", "fp8", {false, false, false, false}},
    {"tree_verify_attention hd128", "fp8", {false, false, false, false}},
    {"tree_verify_attention hd256", "fp8", {false, false, false, false}},
    {"tree_verify_attention mla", "fp8", {false, false, false, false}},
    // The DDTree round. accept_greedy: bit-equal to the CPU on the H200 (2026-12-02, 6633749), unchanged since;
    // build_tree's tie path and commit_kv's range guards are new source.
    {"ddtree_build_tree", "", {false, false, false, false}},
    {"ddtree_accept_greedy", "", {true, false, false, false}},
    {"ddtree_commit_kv", "", {false, false, false, false}},
    // The sampled targets of a DDTree round at temperature > 0: new source.
    {"ddtree_sample_targets", "", {false, false, false, false}},
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
  const std::string over = std::strcmp(cache, "fp8") == 0 ? " over an fp8 KV cache" : "";
  return std::string("the CUDA kernel of ") + family + over + " for the " + limits_of(cls).name + " class" +
         (emulated ? " (emulated)" : "") + " is not yet verified on a GPU: it is built, but no run of the GPU suite " +
         "has passed this source (KDTREE_OPS_UNVERIFIED=1 runs it anyway)";
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
