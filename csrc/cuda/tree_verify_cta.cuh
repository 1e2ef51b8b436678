// Tree-verify attention kernel: wgmma on sm_90a, mma.sync m16n8k16 (the portable path) on sm_80, sm_90a, sm_120.
//
// One CTA runs a contiguous range of (row tile, KV tile) units from the device-side work split
// (work_split.cuh). A row tile packs BLOCK_M rows of (draft token x query head of one KV head), so one read
// of a KV tile serves every head of the group. Per KV tile: S = Q Kᵀ on tensor cores, the tree mask only on
// tiles that reach the draft columns (prefix tiles are mask-free), online softmax in fp32, O += P V.
// Warps are laid out WARPS_M x WARPS_N: in the S phase the WARPS_N warps of a row group split the tile's
// keys; in the PV phase they split the output columns (MLA's Dv = 512 does not fit one warp's registers),
// exchanging row maxima and P through shared memory. With WARPS_N = 1 P stays in registers.
// Warps come in groups of four (a warpgroup, wgmma's unit): the group shares one key/column split, each warp
// owns 16 consecutive rows. wgmma leaves its accumulators in the same per-warp layout as mma.sync, so the
// two paths differ only in how the two GEMMs are issued; the softmax, mask, stores and merge are shared.
// A row tile split over several CTAs leaves normalized partial outputs and their log-sum-exp in the
// workspace, in slices of rows with an arrival counter each; the CTA that completes a slice's count merges
// that slice, reading the pieces in a fixed order (deterministic); where the launch is in clusters of two, the
// two pieces of a row tile on one cluster merge through distributed shared memory instead.
// On the wgmma path with P in registers (GQA, Dv <= 128), and for MLA with V in K (paired tiles: the two math
// warpgroups take the KV tiles in turns), the CTA is warp-specialized: the math warpgroups compute while one
// more warpgroup gathers K/V tiles into a ring of buffers tracked by mbarriers.
// This file: one CTA's state, its shared-memory plan, the barriers it uses and run_segment, which picks the
// tile loop of its configuration. The member functions are defined by role, as FlashAttention 3's hopper/
// and FlashInfer's attention/hopper/ split theirs: the tile loops in tree_verify_mainloop.cuh (each GEMM
// waited for: the portable path, Dv 256 and MLA's key split), tree_verify_mainloop_overlapped.cuh (GQA on wgmma) and
// tree_verify_mainloop_paired.cuh (MLA's paired tiles); the softmax in tree_verify_softmax.cuh; the GEMMs in
// tree_verify_gemm.cuh; the loads in tree_verify_loads.cuh; the stores and the merge of split pieces in
// tree_verify_stores.cuh; over an fp8 cache on the overlap path (tree_verify_config.h), the landing ring in
// tree_verify_fp8_ring.cuh, its scales in tree_verify_fp8_scales.cuh and the tile loop of the math warps that load
// their own tiles in tree_verify_mainloop_fp8.cuh. tree_verify_kernel.cuh includes them all.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cluster.cuh"
#include "fp8_cache.cuh"
#include "mbarrier.cuh"
#include "mma.cuh"
#include "tree_mask_bits.cuh"
#include "tree_verify_config.h"
#include "tree_verify_params.h"
#include "wgmma.cuh"
#include "work_split.cuh"

namespace kdtree::cuda {

// 2^x in one MUFU instruction (flushes subnormal results to zero; exp2f adds range fix-ups around it).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <class C>
struct TreeVerifyCta {
  using T = typename C::T;
  static constexpr int NS = C::kKeysPerWarp / 8;  // S n-tiles per warp
  static constexpr int NO = C::kDvPerWarp / 8;    // O n-tiles per warp

  const TreeVerifyParams& p;
  T* sQ;
  T* sK;
  T* sV;
  uint8_t* sLandK;  // fp8 overlap: the landing ring of fp8 K tiles, then V's (tree_verify_fp8_ring.cuh)
  uint8_t* sLandV;
  T* sZero;
  T* sP;
  float* sRed;
  // Warp-specialized CTAs: per K and per V buffer, "full" (its copiers' copies landed: kCopiersPerSide arrivals)
  // and "empty" (the math warps are done reading it; kMathThreads arrivals). Paired tiles have no V tiles: their
  // full_v[x] announces the P of the pair's tile x (run_tiles_paired).
  uint64_t* full_k;
  uint64_t* full_v;
  uint64_t* empty_k;
  uint64_t* empty_v;
  // A cluster pair's merge (merge_pair): "ready" (piece 1's staged output, 1 arrival from the other CTA) and
  // "done" (piece 0 has read it, likewise).
  uint64_t* pair_ready;
  uint64_t* pair_done;
  const T** sKRow;  // [stages][BLOCK_N] where each key's K row is (key_rows); nullptr: past the keys
  const T** sVRow;  // same for V rows (configurations with V tiles)
  int* sFlag;
  const int tid = threadIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  static constexpr int G = C::kWarpsPerGroup;
  const int wn = (warp / G) % C::kWarpsN;                  // key split (S) / column split (PV)
  const int wm = (warp / G / C::kWarpsN) * G + warp % G;  // row group: rows [16 * wm, +16)
  // The warpgroup, broadcast from lane 0 so the compiler sees it warp-uniform: the wgmma descriptors built
  // from it then live in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
  const int wg_row0 = wg / C::kWarpsN * 64, wg_n = wg % C::kWarpsN;  // first row; key / column split

  __device__ TreeVerifyCta(const TreeVerifyParams& params, char* smem) : p(params) {
    sQ = reinterpret_cast<T*>(smem);
    sK = reinterpret_cast<T*>(smem + C::kQBytes);
    sV = reinterpret_cast<T*>(smem + C::kQBytes + C::kStages * C::kKBytes);
    sLandK = reinterpret_cast<uint8_t*>(smem + C::kQBytes + C::kStages * (C::kKBytes + C::kVBytes));
    sLandV = sLandK + C::kLandStagesK * C::kLandTileK;
    sZero = reinterpret_cast<T*>(sLandK + C::kLandBytes);
    sP = reinterpret_cast<T*>(reinterpret_cast<char*>(sZero) + C::kZeroBytes);
    sRed = reinterpret_cast<float*>(reinterpret_cast<char*>(sP) + C::kPBytes);
    full_k = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(sRed) + C::kRedBytes);
    full_v = full_k + C::kStages;
    empty_k = full_v + C::kStages;
    empty_v = empty_k + C::kStages;
    pair_ready = empty_v + C::kStages;
    pair_done = pair_ready + 1;
    sKRow = reinterpret_cast<const T**>(smem + C::kFixedSmem - 16 - C::kSrcBytes);
    sVRow = sKRow + C::kStages * C::kBlockN;
    sFlag = reinterpret_cast<int*>(smem + C::kFixedSmem - 16);
  }

  // Before the first segment, every thread: the barriers of a warp-specialized CTA, and its zero tile.
  __device__ void init_pipeline() {
    if constexpr (C::kLoadThreads > 0) {
      if (tid == 0)
        for (int s = 0; s < C::kStages; ++s) {
          mbarrier_init(full_k + s, kCopiersPerSide);
          mbarrier_init(full_v + s, C::kPairedTiles ? C::kMathThreads / 2 : kCopiersPerSide);
          mbarrier_init(empty_k + s, C::kMathThreads);
          mbarrier_init(empty_v + s, C::kMathThreads);
        }
      if constexpr (C::kClusterPairs)
        if (tid == 0) {
          mbarrier_init(pair_ready, 1);
          mbarrier_init(pair_done, 1);
          fence_barrier_init();
        }
      for (int i = tid; i < C::kZeroBytes / 16; i += C::kThreads)
        reinterpret_cast<uint4*>(sZero)[i] = make_uint4(0, 0, 0, 0);
      fence_proxy_async();
      __syncthreads();
      if constexpr (C::kClusterPairs)
        if (p.cluster_pairs) cluster_arrive();  // this CTA's barriers are ready for the other's arrivals
    }
  }

  // A barrier of the math warps alone (the gathering warpgroup, if any, does not take part).
  __device__ __forceinline__ void math_sync() {
    if constexpr (C::kLoadThreads == 0) __syncthreads();
    else named_barrier_sync<C::kMathThreads>(kMathBarrier);
  }
  // Named barriers: 1 and 2 per math warpgroup (barrier_after), 3 the math warps, 4 and 5 the two copier
  // groups, 6 and 7 the math warpgroups' turns at the tensor cores.
  static constexpr int kMathBarrier = 3, kLoadBarrier = 4, kTurnBarrier = 6;

  __device__ int64_t slot(int i) const {
    return p.kv_indices_int64 ? static_cast<const int64_t*>(p.kv_indices)[i]
                              : static_cast<int64_t>(static_cast<const int32_t*>(p.kv_indices)[i]);
  }

  // Q rows of the tile: row r is token (m0 + r) / G, query head h * G + (m0 + r) % G.
  __device__ void load_q(const RequestInfo& r, int h, int m0);
  // The same, landed and visible to every math warp's wgmma (the warp-specialized loops: the gatherers' copies
  // are tracked by mbarriers, so nothing else is in flight here).
  __device__ __forceinline__ void load_q_landed(const RequestInfo& r, int h, int m0) {
    load_q(r, h, m0);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    math_sync();
  }

  struct KeyRows {
    const T* k;
    const T* v;
  };
  // Where the K and V rows (KV head h) of key j of the request are: cache slot kv_indices[kv_start + j] for
  // j < L_b (for every key, with draft K/V in the cache), else row qo_start + j - L_b of k_draft/v_draft;
  // nullptr past the keys (zero-filled).
  __device__ KeyRows key_rows(const RequestInfo& r, int h, int j) const;
  __device__ void stage_rows(int i, const KeyRows& rows) {
    sKRow[i] = rows.k;
    if constexpr (C::kVTile) sVRow[i] = rows.v;
  }

  // KV tile into `stage`, from the row pointers staged in shared memory (found an iteration ahead, so the
  // index reads hide behind the tensor cores): one pointer read and one 16-byte copy per chunk.
  __device__ void load_kv(int stage, bool v_from_k);

  // kCopiers threads (`copier` is this one's index) copy a swizzled tile of kRows rows, row i from
  // row_source(i) (nullptr: zeros). Eight threads copy a row (a warp: four full 128-byte lines per instruction);
  // thread q takes chunk q of each 64-column block. Rows of one thread are kCopiers / 8 apart, a multiple of 8,
  // so its swizzled position is the same in every row and block: one source per row, constant offsets otherwise.
  // kKv: K/V rows, which may be fp8 cache rows (tagged; fp8_cache.cuh); Q rows never are.
  template <int kRows, int kChunks, int kCopiers, bool kKv, class RowSource>
  __device__ __forceinline__ void copy_rows(RowSource row_source, T* dst, int copier);
  // After copy_rows' copies landed, the same thread's chunks of fp8 rows widened in place to T times `scale`
  // (fp8_cache.cuh); rows of T are left as they are.
  template <int kRows, int kChunks, int kCopiers, class RowSource>
  __device__ __forceinline__ void widen_rows(RowSource row_source, T* dst, int copier, float scale);
  // A K or V tile (BLOCK_N rows) from the row pointers staged in `rows`.
  template <int kChunks, int kCopiers>
  __device__ __forceinline__ void load_rows(const T* const* rows, T* dst, int copier) {
    copy_rows<C::kBlockN, kChunks, kCopiers, true>([&](int row) { return rows[row]; }, dst, copier);
  }

  // The fp8 overlap path's landing ring (tree_verify_fp8_ring.cuh): a copier's chunks of an fp8 tile, its copies of
  // a tile into the ring, and the exact conversion of its chunks into a T tile.
  template <int kD, int kCopiers, int kUnroll, class F>
  __device__ __forceinline__ void for_each_fp8_chunk(int copier, F&& f);
  template <int kD, int kCopiers, int kLandUnroll = 2>
  __device__ __forceinline__ void land_fp8_tile(const T* const* rows, uint8_t* land, int copier);
  template <int kD, int kCopiers, bool kV, int kConvertUnroll = 2>
  __device__ __forceinline__ void convert_fp8_tile(const RequestInfo& r, int h, int kt, const uint8_t* land, T* dst,
                                                   int copier);
  // Its scales, folded into the softmax and O (tree_verify_fp8_scales.cuh).
  __device__ __forceinline__ int first_draft_tile(const RequestInfo& r) const;
  __device__ __forceinline__ void unscale_draft_scores(const RequestInfo& r, int kt, float (&s)[NS][4]) const;
  __device__ __forceinline__ bool scale_cache_columns(const RequestInfo& r, int kt, float (&s)[NS][4],
                                                      float (&corrections)[2]) const;
  __device__ __forceinline__ void fold_v_scale(const RequestInfo& r, int kt1, float (&o)[NO][4]) const;

  // Any valid global address: a zero-filling copy reads nothing from it.
  __device__ const T* dst_fallback() const { return static_cast<const T*>(p.q); }

  // V rows of draft tile kt over the K tile's first Dv columns, for configurations without V tiles where V
  // does not alias K there. Every warp calls it, after its S GEMM; a rare path (separate draft V only).
  __device__ void load_v_over_k(const RequestInfo& r, int h, int kt, T* k_tile);

  // V of tile `kt` is the K tile's first Dv columns (MLA's latent cache), so it needs no load of its own.
  __device__ bool v_from_k(const RequestInfo& r, int kt) const {
    if (!p.cache_v_aliases_k) return false;
    return !tile_masked(r, kt) || p.k_draft == nullptr || p.draft_v_aliases_k;  // a prefix tile, or V aliases K
  }

  // The math warps' side of a segment: a whole row tile is written out; a part leaves a partial in slot
  // first_piece + split. The caller has synchronized the CTA since the previous segment.
  __device__ void run_segment(const Segment& sg) {
    const RequestInfo& r = sg.r;
    const int h = sg.h, kt0 = sg.kt0, kt1 = sg.kt1, pieces = sg.pieces;
    const int m0 = sg.mt * C::kBlockM;
    float o[NO][4];
    float m_run[2], l_run[2];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.f;
    // Mask row of each of this thread's rows (nullptr: padding row past T_b * G, sees nothing).
    const uint32_t* mask_row[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int packed = m0 + wm * 16 + (lane >> 2) + 8 * half;
      mask_row[half] = packed < r.rows
                           ? p.tree_mask + query_row(r, h, packed).token * p.mask_row_stride
                           : nullptr;
    }

    if constexpr (C::kOverlapPv) run_tiles_overlapped(r, h, m0, kt0, kt1, sg.tiles_before, o, m_run, l_run, mask_row);
    else if constexpr (C::kPairedTiles) run_tiles_paired(r, h, m0, kt0, kt1, sg.tiles_before, o, m_run, l_run, mask_row);
    else if constexpr (C::kFp8Overlap) run_tiles_fp8(r, h, m0, kt0, kt1, o, m_run, l_run, mask_row);
    else run_tiles(r, h, m0, kt0, kt1, o, m_run, l_run, mask_row);
    if constexpr (C::kFp8Overlap) fold_v_scale(r, kt1, o);

    // Row sums: each thread summed its own columns; add the quad's, then the other WARPS_N warps'.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = l_run[half];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      l_run[half] = l;
    }
    if constexpr (C::kWarpsN > 1) {
      math_sync();  // the last tile's maxima are read
      across_warps(l_run, 0.f, [](float a, float b) { return a + b; });
    }

    if (pieces == 1) store_output(r, h, m0, o, l_run);
    else if (C::kClusterPairs && sg.cluster_pair) merge_pair(sg, m0, o, m_run, l_run);
    else store_partial(sg, m0, o, m_run, l_run);
  }

  // Row pointers of the tiles [kt0, kt0 + n) into slots 0..n-1 (nullptr past kt1).
  __device__ void stage_first_rows(const RequestInfo& r, int h, int kt0, int kt1, int n) {
    for (int i = tid; i < n * C::kBlockN; i += C::kMathThreads) {
      const int kt = kt0 + i / C::kBlockN;
      stage_rows(i, kt < kt1 ? key_rows(r, h, kt * C::kBlockN + i % C::kBlockN) : KeyRows{nullptr, nullptr});
    }
  }

  // The tile loops: a segment's KV tiles, one loop per kind of configuration (run_segment picks it).
  // Each GEMM waited for where it is issued (tree_verify_mainloop.cuh).
  __device__ void run_tiles(const RequestInfo& r, int h, int m0, int kt0, int kt1, float (&o)[NO][4],
                            float (&m_run)[2], float (&l_run)[2], const uint32_t* const (&mask_row)[2]);
  // `during(0)` runs while the tile's S GEMM does (between its issue and its wait on wgmma, after the mma.sync loop),
  // `during(1)` likewise with the PV GEMM: the fp8 overlap path converts the next tile there (run_tiles_fp8).
  struct NoWork {
    __device__ void operator()(int) const {}
  };
  template <class During = NoWork>
  __device__ void compute_tile(const RequestInfo& r, int h, int kt, int stage, float (&o)[NO][4],
                               float (&m_run)[2], float (&l_run)[2],
                               const uint32_t* const (&mask_row)[2], During&& during = During{});
  // The same loop over the fp8 overlap path: tiles land in the fp8 ring two ahead, and the math warps convert tile
  // kt + 1 into the other T stage during tile kt's GEMMs (tree_verify_mainloop_fp8.cuh).
  __device__ void run_tiles_fp8(const RequestInfo& r, int h, int m0, int kt0, int kt1, float (&o)[NO][4],
                                float (&m_run)[2], float (&l_run)[2], const uint32_t* const (&mask_row)[2]);
  // wgmma with P in registers, the PV GEMM overlapping the next softmax (tree_verify_mainloop_overlapped.cuh).
  __device__ void run_tiles_overlapped(const RequestInfo& r, int h, int m0, int kt0, int kt1, int tiles_before,
                                       float (&o)[NO][4], float (&m_run)[2], float (&l_run)[2],
                                       const uint32_t* const (&mask_row)[2]);
  // MLA's paired tiles, the two math warpgroups taking the tiles in turns (tree_verify_mainloop_paired.cuh).
  __device__ void run_tiles_paired(const RequestInfo& r, int h, int m0, int kt0, int kt1, int tiles_before,
                                   float (&o)[NO][4], float (&m_run)[2], float (&l_run)[2],
                                   const uint32_t* const (&mask_row)[2]);

  // The gatherers that fill the K tiles (and as many the V tiles).
  static constexpr int kCopiersPerSide = C::kPairedTiles ? C::kLoadThreads : C::kLoadThreads / 2;
  // The gathering warpgroup (tree_verify_loads.cuh): its side of a segment, and the copies of one side.
  __device__ void produce_tiles(const Segment& sg);
  template <bool kV>
  __device__ __forceinline__ void produce(const Segment& sg, int copier);
  template <bool kV>
  __device__ __forceinline__ void produce_fp8(const Segment& sg, int copier);  // through the landing ring

  // Tile t of the CTA uses buffer t % STAGES; a buffer's barriers complete one phase per use.
  static __device__ __forceinline__ uint32_t phase_parity(int t) { return (t / C::kStages) & 1; }

  // Two math warpgroups take turns issuing their GEMMs (ping-pong): while one waits for its S GEMM and runs its
  // softmax, the tensor cores work on the other's GEMMs. Warpgroup w waits on barrier kTurnBarrier + w until
  // the other has passed it the turn; warpgroup 1 passes the first one, once per kernel (first_tensor_turn).
  // Both issue the same number of GEMM groups per segment, so the turns stay paired across segments.
  static constexpr bool kPingPong = C::kOverlapPv && C::kMathThreads == 256;
  __device__ __forceinline__ void first_tensor_turn() {
    if constexpr (kPingPong)
      if (wg == 1) named_barrier_arrive<256>(kTurnBarrier);
  }
  __device__ __forceinline__ void take_tensor_turn() {
    if constexpr (kPingPong) named_barrier_sync<256>(kTurnBarrier + wg);
  }
  __device__ __forceinline__ void pass_tensor_turn() {
    if constexpr (kPingPong) named_barrier_arrive<256>(kTurnBarrier + 1 - wg);
  }

  // A barrier of this warp's warpgroup (id 1 + wg) that takes x as an input: whatever computes x happens
  // before it, and ptxas keeps a wgmma wait that follows after it.
  __device__ __forceinline__ void barrier_after(float x) {
    asm volatile("{\n.reg .pred p, q;\nsetp.ge.f32 p, %0, 0f00000000;\nbar.red.or.pred q, %1, 128, p;\n}\n"
                 ::"f"(x), "r"(1 + wg) : "memory");
  }

  // Folds a per-row value (each quad's copy) over the WARPS_N warps of the row group with `op`, through sRed.
  // The caller orders it after the previous readers of sRed.
  template <class Op>
  __device__ __forceinline__ void across_warps(float (&v)[2], float init, Op op) {
    auto at = [&](int w, int half) -> float& {
      return sRed[w * C::kBlockM + wm * 16 + (lane >> 2) + 8 * half];
    };
    if ((lane & 3) == 0)
#pragma unroll
      for (int half = 0; half < 2; ++half) at(wn, half) = v[half];
    math_sync();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float acc = init;
      for (int w = 0; w < C::kWarpsN; ++w) acc = op(acc, at(w, half));
      v[half] = acc;
    }
  }

  // Tile kt reaches the draft columns or the end of the keys: the tree mask applies (prefix tiles are mask-free).
  __device__ bool tile_masked(const RequestInfo& r, int kt) const { return (kt + 1) * C::kBlockN > r.prefix_len; }

  // The softmax (tree_verify_softmax.cuh): the tree mask's visibility of a tile, the online-softmax update of
  // the rows' reference maxima and sums, and the rescale of O.
  static constexpr int kVisWords = (C::kKeysPerWarp + 63) / 64;
  __device__ bool tile_visibility(const RequestInfo& r, int kt, const uint32_t* const (&mask_row)[2],
                                  uint64_t (&vis)[2][kVisWords]) const;
  __device__ bool softmax_tile(const RequestInfo& r, int kt, bool masked, bool warp_sees,
                               const uint64_t (&vis)[2][kVisWords], float (&s)[NS][4],
                               float (&m_run)[2], float (&l_run)[2], float (&corrections)[2]);
  __device__ float scale_and_mask(bool masked, bool warp_sees, const uint64_t (&vis)[2][kVisWords],
                                  float (&s)[NS][4]);
  __device__ __forceinline__ void row_max(const float (&s)[NS][4], float (&tile_max)[2]);
  static __device__ __forceinline__ float raised_reference(float m_ref, float m_tile);
  static __device__ __forceinline__ bool move_reference(const float (&m_new)[2], const float (&sums)[2],
                                                        float (&m_run)[2], float (&l_run)[2],
                                                        float (&corrections)[2]);
  __device__ __forceinline__ void probabilities(float score_scale, const float (&m_new)[2], float (&s)[NS][4],
                                                float (&sums)[2]);
  static __device__ __forceinline__ float usable(float m);
  __device__ __forceinline__ void rescale_o(float (&o)[NO][4], const float (&corrections)[2],
                                            bool rescale);

  // The GEMMs (tree_verify_gemm.cuh): P into the PV GEMM's operand, and S = Q Kᵀ and O += P V on wgmma or
  // mma.sync.
  __device__ __forceinline__ void p_fragments(const float (&s)[NS][4], uint32_t (&a)[C::kBlockN / 16][4]);
  __device__ __forceinline__ void store_p(const float (&s)[NS][4], T* p_tile, int key0);
  // wgmma GEMMs of this warp's warpgroup: rows [64 * (wm / 4), +64), the warpgroup's keys (S) or output
  // columns (PV). Each is issued and committed as one group; the caller waits for it (wgmma_wait) before
  // reading its accumulators. Each GEMM builds its descriptors once and steps them by compile-time offsets
  // (a 14-bit address field in 16-byte units that shared memory never overflows).
  static constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static constexpr uint32_t kGroupBytes = 8 * 128;  // 8 swizzled rows of 128 bytes
  // Descriptor step to k-slice kk (16 columns) of a K-major tile with `rows` rows: 64-column blocks are
  // `rows` x 128 bytes apart, 16-column slices 32 bytes apart within a block.
  static constexpr uint64_t k_major_step(int kk, int rows) { return ((kk / 4) * rows * 128 + (kk % 4) * 32) >> 4; }
  __device__ __forceinline__ void issue_qk(const T* k_tile, float (&s)[NS][4]);
  __device__ __forceinline__ uint64_t v_desc(const T* v_tile) const;
  static constexpr uint64_t v_step(int kk) { return (kk * 2 * kGroupBytes) >> 4; }
  __device__ __forceinline__ void issue_pv_regs(const uint32_t (&a)[C::kBlockN / 16][4], const T* v_tile,
                                                float (&o)[NO][4]);
  __device__ __forceinline__ void issue_pv_smem(const T* p_tile, const T* v_tile, float (&o)[NO][4]);
  __device__ __forceinline__ void pv_step(const uint32_t (&a)[4], const T* v_tile, int kk,
                                          float (&o)[NO][4]);

  // The query of packed row `packed` of KV head h: token packed / G of the request, query head h * G + packed % G.
  struct QueryRow {
    int token, head;
  };
  __device__ QueryRow query_row(const RequestInfo& r, int h, int packed) const {
    return {r.qo_start + packed / p.group, h * p.group + packed % p.group};
  }
  // Offset in `out` of packed row `packed`.
  __device__ int64_t out_offset(const RequestInfo& r, int h, int packed) const {
    const QueryRow row = query_row(r, h, packed);
    return (static_cast<int64_t>(row.token) * p.num_q_heads + row.head) * C::kDv;
  }

  // The epilogue (tree_verify_stores.cuh). O, normalized, is staged in the K/V buffers in T.
  __device__ T* staged_chunk(int row, int chunk) const;
  __device__ void stage_output(const float (&o)[NO][4], const float (&l_run)[2]);
  // The rows' log-sum-exps (log2; -inf where a row sees no key) into dst[row], from the lane that holds each.
  __device__ void store_row_lse(float* dst, const float (&m_run)[2], const float (&l_run)[2]) const;
  // A whole row tile: its rows of `out`.
  __device__ void store_output(const RequestInfo& r, int h, int m0, const float (&o)[NO][4],
                               const float (&l_run)[2]);
  // A piece of a split row tile: its partial and log-sum-exps in slot first_piece + split, published slice by
  // slice; the slices whose count this CTA completes are merged into `out` (merge_slices).
  static constexpr int kSlices = 4;
  __device__ void store_partial(const Segment& sg, int m0, const float (&o)[NO][4], const float (&m_run)[2],
                                const float (&l_run)[2]);
  __device__ void merge_slices(const Segment& sg, int m0, uint32_t slices);
  // A row tile of two pieces on the two CTAs of a cluster (sg.cluster_pair): piece 0 merges piece 1's output
  // from the other CTA's shared memory and writes the rows.
  __device__ void merge_pair(const Segment& sg, int m0, const float (&o)[NO][4], const float (&m_run)[2],
                             const float (&l_run)[2]);
};

}  // namespace kdtree::cuda
