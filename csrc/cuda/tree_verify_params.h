// Everything one tree_verify_attention launch reads: a plain struct filled by the host wrapper.
// Strides are in elements. Per-request lengths are NOT here: the kernel reads them from the indptr arrays
// on the device, so one captured launch serves every replay.
#pragma once

#include <cstdint>

namespace kdtree::cuda {

struct TreeVerifyParams {
  const void* q;        // [N, Hq, Dqk]
  int64_t q_row_stride, q_head_stride;
  const void* k_cache;  // [S, Hkv, Dqk]
  int64_t k_row_stride, k_head_stride;
  const void* v_cache;  // [S, Hkv, Dv]
  int64_t v_row_stride, v_head_stride;
  const void* k_draft;  // [N, Hkv, Dqk], or nullptr: draft K/V are the last T_b slots of each request
  int64_t kd_row_stride, kd_head_stride;
  const void* v_draft;  // [N, Hkv, Dv], or nullptr
  int64_t vd_row_stride, vd_head_stride;
  void* out;            // [N, Hq, Dv], contiguous

  const int32_t* qo_indptr;   // [B+1]
  const int32_t* kv_indptr;   // [B+1]
  const void* kv_indices;     // int32 or int64 slots
  bool kv_indices_int64;
  const uint32_t* tree_mask;  // [N, W] rows of packed bits
  int64_t mask_row_stride;
  int mask_words;             // W <= 32 (trees of up to 1024 tokens)

  int num_tokens;    // N
  int num_q_heads;   // Hq
  int num_kv_heads;  // Hkv
  int group;         // Hq / Hkv: query heads packed into the rows of one KV head's tile
  int batch;         // B

  // fp8 caches (configurations with kFp8Cache): a cache row's key / value is its stored value times k_scale /
  // v_scale; e5m2 or e4m3 storage. Draft rows (k_draft/v_draft) are never scaled.
  float k_scale, v_scale;
  bool kv_fp8_e5m2;
  bool fp8_overlap;  // fp8 caches: the overlap path (KDTREE_OPS_FP8_PATH=overlap and strides it takes), else widen

  // Configurations of the fp8 overlap path take both times k_scale (launch_tree_verify, tree_verify_fp8_scales.cuh).
  float scale_log2;  // sm_scale * log2(e): scores go straight into exp2
  float sm_scale;
  float logit_cap;   // > 0: score = cap * tanh(score * sm_scale / cap)

  // V row s is the first Dv elements of K row s (MLA's latent cache): prefix tiles then read V from the
  // K tile already in shared memory instead of loading it again.
  bool cache_v_aliases_k;
  bool draft_v_aliases_k;

  // Split-KV workspace (device-side work split, fused combine).
  void* partial_out;       // [pieces bound, BLOCK_M, Dv] of q's dtype: normalized partial outputs of split row tiles
  float* partial_lse;      // [pieces bound, BLOCK_M]: their log2-sum-exp
  int* row_tile_counters;  // [>= row tile bound, slices]: arrivals per slice of a split row tile, zeroed per launch
  long long* schedule;     // [grid, kScheduleArrays * (B+1)]: each CTA's work split (work_split.cuh)
  int min_units_per_cta;   // a piece has at least this many KV tiles (bounds split overhead)
  bool cluster_pairs;      // launched in clusters of two CTAs (kClusterPairs configurations, some shapes)
};

}  // namespace kdtree::cuda
