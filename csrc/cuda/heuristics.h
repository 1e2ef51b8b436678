// The host's choices among the tree-verify kernels and their launch shapes, gathered in one place (as
// FlashAttention 3's hopper/heuristics.h): each is a function of the shapes and the device only, so one
// captured graph always takes the same kernel. Each names the measurement that chose it; the runs behind the
// numbers (H200, bf16, the workloads G1-G5 / M1-M5 of DESIGN.md) are in examples/TUNING.md.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "launch_class.h"
#include "tree_verify_params.h"

namespace kdtree::cuda {

// A CTA takes at least this many KV tiles: a split piece's partial write and read (about two KV tiles of
// traffic) cost more than the parallelism of shorter pieces gains.
constexpr int kMinUnitsPerCta = 4;

// The sm_90a wgmma kernels where the class has wgmma (sm_90 itself), the portable mma.sync ones elsewhere: wgmma took
// G2 from the portable kernel's 280 us to 159 at first (use_wgmma lets KDTREE_OPS_PORTABLE_MMA=1 force the portable
// path).
inline bool prefers_wgmma(ArchClass cls) { return limits_of(cls).wgmma; }

// Short trees (at most 64 packed rows per request on average) take the narrow wgmma configuration, 64-row
// tiles: G4 (16 tokens x 4 heads, half of a 128-row tile) 159 -> 103 us.
inline bool use_narrow_wgmma(int num_tokens, int group, int batch) {
  return static_cast<int64_t>(num_tokens) * group <= 64ll * batch;
}

// MLA takes the paired kernel (the math warpgroups take the tiles in turns, V read from the K tile) where V is
// K's first columns in the cache and in the draft keys: M5 366 -> 313 us over the key split, which serves the rest.
inline bool use_mla_paired_tiles(const TreeVerifyParams& p) {
  return p.cache_v_aliases_k && (p.k_draft == nullptr || p.draft_v_aliases_k);
}

// Clusters of two where equal trees make row tiles of two pieces, one per CTA (grid / 3 < row tiles <= grid / 2),
// merged through distributed shared memory: G3 91.2 -> 87.5, G5 75.1 -> 74.1 us; elsewhere the cluster launch
// costs more than it gains (G2 81.6 -> 86.6 us). `even_row_tiles`: the row tiles of the N tokens as one request;
// `cluster_grid`: the CTAs of the grid in clusters, 0 where the configuration does not launch in clusters.
inline bool use_cluster_pairs(int64_t even_row_tiles, int cluster_grid) {
  return cluster_grid > 0 && 3 * even_row_tiles > cluster_grid && 2 * even_row_tiles <= cluster_grid;
}

}  // namespace kdtree::cuda
