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
// This file: one CTA's state and its per-tile work (run_segment, the tile loops, the softmax, the GEMMs). Its
// loads are in tree_verify_loads.cuh, its stores and the merge of split pieces in tree_verify_stores.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cluster.cuh"
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
  const int wn = (warp / 4) % C::kWarpsN;                  // key split (S) / column split (PV)
  const int wm = (warp / 4 / C::kWarpsN) * 4 + warp % 4;  // row group: rows [16 * wm, +16)
  // The warpgroup, broadcast from lane 0 so the compiler sees it warp-uniform: the wgmma descriptors built
  // from it then live in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
  const int wg_row0 = wg / C::kWarpsN * 64, wg_n = wg % C::kWarpsN;  // first row; key / column split

  __device__ TreeVerifyCta(const TreeVerifyParams& params, char* smem) : p(params) {
    sQ = reinterpret_cast<T*>(smem);
    sK = reinterpret_cast<T*>(smem + C::kQBytes);
    sV = reinterpret_cast<T*>(smem + C::kQBytes + C::kStages * C::kKBytes);
    sZero = reinterpret_cast<T*>(smem + C::kQBytes + C::kStages * (C::kKBytes + C::kVBytes));
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
  template <int kRows, int kChunks, int kCopiers, class RowSource>
  __device__ __forceinline__ void copy_rows(RowSource row_source, T* dst, int copier);
  // A K or V tile (BLOCK_N rows) from the row pointers staged in `rows`.
  template <int kChunks, int kCopiers>
  __device__ __forceinline__ void load_rows(const T* const* rows, T* dst, int copier) {
    copy_rows<C::kBlockN, kChunks, kCopiers>([&](int row) { return rows[row]; }, dst, copier);
  }

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
    else run_tiles(r, h, m0, kt0, kt1, o, m_run, l_run, mask_row);

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

  // The KV tiles of a segment, each GEMM waited for where it is issued: STAGES-deep cp.async of whole K/V tiles,
  // one CTA barrier per tile (the portable path, and MLA, whose P goes through shared memory).
  __device__ void run_tiles(const RequestInfo& r, int h, int m0, int kt0, int kt1, float (&o)[NO][4],
                            float (&m_run)[2], float (&l_run)[2], const uint32_t* const (&mask_row)[2]) {
    // Row pointers of the first STAGES tiles; later ones are found one iteration ahead.
    stage_first_rows(r, h, kt0, kt1, C::kStages);
    __syncthreads();
    load_q(r, h, m0);
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) {
      if (kt0 + s < kt1) load_kv(s, v_from_k(r, kt0 + s));
      cp_async_commit();
    }

    for (int kt = kt0; kt < kt1; ++kt) {
      const int stage = (kt - kt0) % C::kStages;
      cp_async_wait<C::kStages - 2>();
      if constexpr (C::kWgmma) fence_proxy_async();  // wgmma reads the landed tile through the async proxy
      __syncthreads();  // tile kt landed for everyone; everyone is done with tile kt - 1
      {
        const int next = kt + C::kStages - 1;
        if (next < kt1) load_kv((next - kt0) % C::kStages, v_from_k(r, next));
        cp_async_commit();
      }
      // The rows of tile kt + STAGES go where tile kt's were (its loads are issued); stored after the compute,
      // so the index read is in flight meanwhile.
      const int ahead = kt + C::kStages;
      KeyRows ahead_rows{nullptr, nullptr};
      if (tid < C::kBlockN && ahead < kt1) ahead_rows = key_rows(r, h, ahead * C::kBlockN + tid);
      compute_tile(r, h, kt, stage, o, m_run, l_run, mask_row);
      if (tid < C::kBlockN) stage_rows(stage * C::kBlockN + tid, ahead_rows);
    }
    cp_async_wait<0>();
  }

  // The KV tiles of a segment on the wgmma path with P in registers, on the math warps. S of tile kt and then
  // O += P V of tile kt - 1 are issued together; the softmax of tile kt runs on the CUDA cores while the
  // tensor cores still compute that PV GEMM, and O is rescaled after it. The gathering warpgroup fills the
  // K and V buffers (produce_tiles): tile t of the CTA (t = tiles_before + kt - kt0) is in buffer t % STAGES
  // of each, signalled on full_k / full_v and handed back on empty_k / empty_v once read (K right after its S
  // GEMM, so its copies for a later tile start while the softmax runs).
  __device__ void run_tiles_overlapped(const RequestInfo& r, int h, int m0, int kt0, int kt1, int tiles_before,
                                       float (&o)[NO][4], float (&m_run)[2], float (&l_run)[2],
                                       const uint32_t* const (&mask_row)[2]) {
    constexpr int kKTile = C::kBlockN * C::kDqk, kVTileElems = C::kBlockN * C::kDv;
    // The first PV GEMM ("tile kt0 - 1") multiplies zero P by the zero tile: every iteration then issues the
    // same GEMMs (a wgmma behind a branch makes ptxas serialize them all).
    uint32_t p_prev[C::kBlockN / 16][4];  // P of tile kt - 1 (A fragments): its PV GEMM reads them
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk) p_prev[kk][0] = p_prev[kk][1] = p_prev[kk][2] = p_prev[kk][3] = 0;
    load_q_landed(r, h, m0);

    const T* v_prev = sZero;
    for (int kt = kt0; kt < kt1; ++kt) {
      // Warp-uniform for the compiler (see wg): the GEMMs' descriptors then step in uniform registers.
      const int t = __shfl_sync(0xffffffffu, tiles_before + kt - kt0, 0), buf = t % C::kStages;
      uint64_t vis[2][kVisWords];
      const bool masked = tile_masked(r, kt);
      const bool warp_sees = masked ? tile_visibility(r, kt, mask_row, vis) : true;
      const int prev = (t + C::kStages - 1) % C::kStages;  // buffer of tile t - 1
      mbarrier_wait(full_k + buf, phase_parity(t));
      if (kt > kt0) mbarrier_wait(full_v + prev, phase_parity(t - 1));
      float s[NS][4];
      take_tensor_turn();
      issue_qk(sK + buf * kKTile, s);
      issue_pv_regs(p_prev, v_prev, o);
      pass_tensor_turn();

      wgmma_wait<1>();  // S of tile kt
      fence_registers<NS * 4>(&s[0][0]);
      mbarrier_arrive(empty_k + buf);  // K of tile kt is read: its buffer may take the next
      float corrections[2];
      const bool rescale = softmax_tile(r, kt, masked, warp_sees, vis, s, m_run, l_run, corrections);
      // ptxas hoists a wait above independent arithmetic, which would leave no softmax to overlap the PV GEMM
      // with: a barrier that reduces the row sums (every probability) keeps the softmax before the wait.
      barrier_after(l_run[0] + l_run[1]);
      wgmma_wait<0>();
      fence_registers<NO * 4>(&o[0][0]);
      fence_registers<C::kBlockN / 16 * 4>(&p_prev[0][0]);
      if (kt > kt0) mbarrier_arrive(empty_v + prev);
      p_fragments(s, p_prev);  // packed in place once the PV GEMM that read the previous P is done
      rescale_o(o, corrections, rescale);
      v_prev = sV + buf * kVTileElems;
    }
    // PV of the last tile (of zeros by zeros in an empty segment).
    const int t_last = tiles_before + kt1 - 1 - kt0;
    if (kt1 > kt0) mbarrier_wait(full_v + t_last % C::kStages, phase_parity(t_last));
    take_tensor_turn();
    issue_pv_regs(p_prev, v_prev, o);
    pass_tensor_turn();
    wgmma_wait<0>();
    fence_registers<NO * 4>(&o[0][0]);
    if (kt1 > kt0) mbarrier_arrive(empty_v + t_last % C::kStages);
  }

  // The KV tiles of a segment with paired tiles (MLA on the wgmma path). Both math warpgroups hold the same 64
  // rows and each owns 256 of O's columns. They take the segment's tiles in pairs (A, B): warpgroup 0 computes
  // S of A and its softmax, warpgroup 1 those of B (a missing last B is all zeros, masked out), and each puts
  // its P in its tile's columns past Dv (which S has finished with) with the tile's reference maxima (s_ref):
  // A's from the previous pair's, B's from A's. Each warpgroup moves its O to A's reference and adds A's P V,
  // then to B's and adds B's P V (both from shared memory, so the two sides issue the same PV GEMMs). So a tile
  // goes back to the copiers as soon as both have multiplied it, and the copies of the next A overlap B's
  // softmax and GEMMs. Tile t of the CTA is in buffer t % 2 (tiles_before is even), filled by the gathering
  // warpgroup.
  __device__ void run_tiles_paired(const RequestInfo& r, int h, int m0, int kt0, int kt1, int tiles_before,
                                   float (&o)[NO][4], float (&m_run)[2], float (&l_run)[2],
                                   const uint32_t* const (&mask_row)[2]) {
    constexpr int kKTile = C::kBlockN * C::kDqk;
    auto p_of = [&](int x) { return sK + x * kKTile + C::kBlockN * C::kDv; };  // tile x's last 64 columns
    auto s_ref = [&](int x) { return sRed + x * C::kBlockM; };  // tile x's reference maxima, one per row
    load_q_landed(r, h, m0);

    const int row0 = wm * 16 + (lane >> 2);  // this thread's rows: row0, row0 + 8
    // With no V tiles, full_v[x] announces tile x's P and reference maxima: its owner's 128 arrivals.
    uint64_t* const p_ready = full_v;
    const int n = C::turn_tiles(kt1 - kt0);
    for (int i = 0; i < n; i += 2) {
      const uint32_t parity = phase_parity(__shfl_sync(0xffffffffu, tiles_before + i, 0));  // of both tiles
      const int kt = kt0 + i + wg;  // this warpgroup's tile: buffer wg
      uint64_t vis[2][kVisWords];
      const bool masked = kt >= kt1 || tile_masked(r, kt);
      const bool warp_sees = kt < kt1 && (!masked || tile_visibility(r, kt, mask_row, vis));
      float s[NS][4];
      auto issue_own_s = [&] {
        mbarrier_wait(full_k + wg, parity);
        issue_qk(sK + wg * kKTile, s);
      };
      // The owner's softmax of its tile against the previous tile's reference maxima (m_run: warpgroup 0's O is
      // at the previous B's, warpgroup 1's at this A's); P and the tile's maxima go where the other reads them.
      float own_sums[2], m_tile[2];
      auto own_softmax = [&] {
        const float score_scale = scale_and_mask(masked, warp_sees, vis, s);
        float tile_max[2];
        row_max(s, tile_max);
#pragma unroll
        for (int half = 0; half < 2; ++half) m_tile[half] = raised_reference(m_run[half], tile_max[half] * score_scale);
        probabilities(score_scale, m_tile, s, own_sums);
        if ((lane & 3) == 0) {
          s_ref(wg)[row0] = m_tile[0];
          s_ref(wg)[row0 + 8] = m_tile[1];
        }
        store_p(s, p_of(wg), 0);
        fence_proxy_async();  // the wgmma reads of both warpgroups see P through the async proxy
        mbarrier_arrive(p_ready + wg);
      };
      // Tile x (0: A, 1: B) of the pair: O moves to its reference maxima, then its P V is issued.
      auto multiply = [&](int x) {
        float m_x[2], sums[2] = {0.f, 0.f};
        if (x == wg) {
          m_x[0] = m_tile[0], m_x[1] = m_tile[1];
          sums[0] = own_sums[0], sums[1] = own_sums[1];
        } else {
          mbarrier_wait(p_ready + x, parity);
          m_x[0] = s_ref(x)[row0], m_x[1] = s_ref(x)[row0 + 8];
        }
        float step[2];  // this warpgroup's O and row sums move to tile x's reference maxima
        rescale_o(o, step, move_reference(m_x, sums, m_run, l_run, step));
        issue_pv_smem(p_of(x), sK + x * kKTile, o);
      };

      // Warpgroup 1 multiplies A's P before it computes S of B, so that B's copies (begun when the previous pair
      // was done with its buffer) have A's S, softmax and PV GEMMs to land behind.
      if (wg == 0) {
        issue_own_s();
        wgmma_wait<0>();
        fence_registers<NS * 4>(&s[0][0]);
        own_softmax();
        multiply(0);
        wgmma_wait<0>();
      } else {
        multiply(0);
        issue_own_s();
        wgmma_wait<0>();
        fence_registers<NS * 4>(&s[0][0]);
      }
      fence_registers<NO * 4>(&o[0][0]);
      mbarrier_arrive(empty_k);  // A: this warpgroup's reads are done
      if (wg == 1) own_softmax();
      multiply(1);
      wgmma_wait<0>();
      fence_registers<NO * 4>(&o[0][0]);
      mbarrier_arrive(empty_k + 1);
    }
  }

  // The gatherers that fill the K tiles (and as many the V tiles).
  static constexpr int kCopiersPerSide = C::kPairedTiles ? C::kLoadThreads : C::kLoadThreads / 2;

  // The gathering warpgroup's side of a segment (run_tiles_overlapped, run_tiles_paired). With V tiles, two
  // groups of two warps, each on its own: the first copies the K tiles, the second the V tiles (a K tile never
  // waits for a V tile's copies or buffer; one stream of all gatherers, K then V of each tile: G2 90 -> 99 us,
  // G5 86 -> 95). Paired tiles have no V tiles: all four warps copy the K tiles, in the order the buffers come
  // back (two groups of 64, one per buffer: M2 183 -> 160 us, M5 306 -> 265 as one stream).
  __device__ void produce_tiles(const Segment& sg) {
    const int g = tid - C::kMathThreads;  // 0 .. kLoadThreads - 1
    if constexpr (C::kPairedTiles) {
      produce<false>(sg, g);
    } else {
      if (g < kCopiersPerSide) produce<false>(sg, g);
      else produce<true>(sg, g - kCopiersPerSide);
    }
  }

  // kCopiersPerSide gatherers (`copier` is this one's index) fill the K (kV: V) buffers: tile t of the CTA into
  // buffer t % STAGES, zeros past kt1 (a missing last B of paired tiles). Each copier waits for its own copies,
  // makes them visible to the tensor cores' reads (fence_proxy_async) and arrives on the full barrier.
  template <bool kV>
  __device__ __forceinline__ void produce(const Segment& sg, int copier) {
    constexpr int kCopiers = kCopiersPerSide;
    constexpr int kRowsEach = (C::kBlockN + kCopiers - 1) / kCopiers;
    constexpr int kTileElems = C::kBlockN * (kV ? C::kDv : C::kDqk);
    T* const tiles = kV ? sV : sK;
    const T** const slots = kV ? sVRow : sKRow;
    uint64_t* const full = kV ? full_v : full_k;
    uint64_t* const empty = kV ? empty_v : empty_k;
    const RequestInfo& r = sg.r;
    const int kt0 = sg.kt0, kt1 = sg.kt1;
    // This copier's keys of a tile: copier + e * kCopiers for e < kRowsEach, those within the tile.
    auto has_key = [&](int e) { return C::kBlockN % kCopiers == 0 || copier + e * kCopiers < C::kBlockN; };
    // Where they are in tile kt: read a tile ahead, so the index reads hide behind the copies.
    auto rows_of = [&](int kt, const T* (&rows)[kRowsEach]) {
#pragma unroll
      for (int e = 0; e < kRowsEach; ++e) {
        const KeyRows kr = has_key(e) && kt < kt1 ? key_rows(r, sg.h, kt * C::kBlockN + copier + e * kCopiers)
                                                  : KeyRows{nullptr, nullptr};
        rows[e] = kV ? kr.v : kr.k;
      }
    };
    const T* next[kRowsEach];
    rows_of(kt0, next);
    const int end = kt0 + C::turn_tiles(kt1 - kt0);
    for (int kt = kt0; kt < end; ++kt) {
      const int t = sg.tiles_before + kt - kt0, buf = t % C::kStages;
      // A slot of row pointers per buffer: it was last read STAGES tiles ago, before the previous barrier.
      const T** const rows = slots + buf * C::kBlockN;
#pragma unroll
      for (int e = 0; e < kRowsEach; ++e)
        if (has_key(e)) rows[copier + e * kCopiers] = next[e];
      named_barrier_sync<kCopiers>(kLoadBarrier + kV);  // the staged rows are visible to every copier
      mbarrier_wait(empty + buf, phase_parity(t) ^ 1);  // a fresh barrier's "previous phase" counts as done
      load_rows<kV ? C::kChunksV : C::kChunksQK, kCopiers>(rows, tiles + buf * kTileElems, copier);
      cp_async_commit();
      rows_of(kt + 1, next);
      // This copier's copies landed: visible to wgmma, announced on `full`.
      cp_async_wait<0>();
      fence_proxy_async();
      mbarrier_arrive(full + buf);
    }
  }

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

  // Visibility of this warp's keys of tile kt (64-column windows from its first key) for each of this thread's
  // rows. Returns whether the warp's rows see anything there.
  static constexpr int kVisWords = (C::kKeysPerWarp + 63) / 64;
  __device__ bool tile_visibility(const RequestInfo& r, int kt, const uint32_t* const (&mask_row)[2],
                                  uint64_t (&vis)[2][kVisWords]) const {
    const int key0 = kt * C::kBlockN + (C::kPairedTiles ? 0 : wn * C::kKeysPerWarp);
    bool any = false;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int w = 0; w < kVisWords; ++w) {
        const uint64_t bits = mask_row[half] == nullptr ? 0ull
                                                        : visible_columns(mask_row[half], p.mask_words,
                                                                          key0 + 64 * w, r.prefix_len, r.kv_len);
        vis[half][w] = bits;
        any |= (C::kKeysPerWarp >= 64 ? bits : (bits & ((1ull << C::kKeysPerWarp) - 1))) != 0;
      }
    return __any_sync(0xffffffffu, any);
  }

  // Scores of tile kt (s) into unnormalized probabilities: into the log2 domain, the tree mask (on masked
  // tiles: `vis`, nothing where the warp sees nothing), and the online-softmax update of the rows' reference
  // maxima and sums. `corrections` rescale what O accumulated; returns whether any reference of the warp moved.
  __device__ bool softmax_tile(const RequestInfo& r, int kt, bool masked, bool warp_sees,
                               const uint64_t (&vis)[2][kVisWords], float (&s)[NS][4],
                               float (&m_run)[2], float (&l_run)[2], float (&corrections)[2]) {
    const float score_scale = scale_and_mask(masked, warp_sees, vis, s);
    float tile_max[2];
    row_max(s, tile_max);
    if constexpr (C::kWarpsN > 1) across_warps(tile_max, -INFINITY, [](float a, float b) { return fmaxf(a, b); });
    float m_new[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) m_new[half] = raised_reference(m_run[half], tile_max[half] * score_scale);
    float sums[2];
    probabilities(score_scale, m_new, s, sums);
    return move_reference(m_new, sums, m_run, l_run, corrections);
  }

  // Scores into the log2 domain and the tree mask. Returns the scale still to apply: a positive scale is
  // folded into the exponent's FMA instead (the max commutes with it), one instruction per score. Uniform
  // branches: each variant is one tight loop.
  __device__ float scale_and_mask(bool masked, bool warp_sees, const uint64_t (&vis)[2][kVisWords],
                                  float (&s)[NS][4]) {
    float score_scale = 1.f;
    if (p.logit_cap > 0.f) {
      const float inner = p.sm_scale / p.logit_cap, outer = p.logit_cap * 1.4426950408889634f;
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = outer * tanhf(s[n][e] * inner);
    } else if (p.scale_log2 > 0.f) {
      score_scale = p.scale_log2;
    } else {
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= p.scale_log2;
    }
    if (masked) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // Bit (n % 8) * 8 + e of mine[n / 8] is this thread's key n * 8 + 2 * (lane % 4) + e of the warp.
        uint64_t mine[kVisWords];
#pragma unroll
        for (int w = 0; w < kVisWords; ++w) mine[w] = warp_sees ? vis[half][w] >> (2 * (lane & 3)) : 0ull;
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (!((mine[n / 8] >> ((n % 8) * 8 + e)) & 1ull)) s[n][2 * half + e] = -INFINITY;
      }
    }
    return score_scale;
  }

  // The maximum of each of this thread's two rows over the warp's keys of the tile (its quad's).
  __device__ __forceinline__ void row_max(const float (&s)[NS][4], float (&tile_max)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      tile_max[half] = mx;
    }
  }

  // A row's reference maximum moves only when the tile's (m_tile, log2 units) exceeds it by more than 8:
  // probabilities up to 2^8 lose nothing in T or in the fp32 sums, and most tiles then rescale nothing.
  static __device__ __forceinline__ float raised_reference(float m_ref, float m_tile) {
    return m_tile > m_ref + 8.f ? m_tile : m_ref;
  }

  // The running reference maxima m_run move to m_new (>= m_run): the sums l_run follow and take `sums`
  // (probabilities against m_new); `corrections` rescale what O accumulated. Returns whether any moved.
  static __device__ __forceinline__ bool move_reference(const float (&m_new)[2], const float (&sums)[2],
                                                        float (&m_run)[2], float (&l_run)[2],
                                                        float (&corrections)[2]) {
    bool rescale = false;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      corrections[half] = fast_exp2(m_run[half] - usable(m_new[half]));  // 0 while m_run saw nothing: zeros
      m_run[half] = m_new[half];
      l_run[half] = l_run[half] * corrections[half] + sums[half];
      rescale |= corrections[half] != 1.f;
    }
    return rescale;
  }

  // s into probabilities against the reference maxima m_new (a row with nothing visible yet: zeros, no NaN),
  // and each row's sum over this thread's columns.
  __device__ __forceinline__ void probabilities(float score_scale, const float (&m_new)[2], float (&s)[NS][4],
                                                float (&sums)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float m_use = usable(m_new[half]);
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = fast_exp2(fmaf(s[n][2 * half + e], score_scale, -m_use));
          s[n][2 * half + e] = pv;
          sum += pv;
        }
      sums[half] = sum;
    }
  }

  // A reference maximum to subtract: a row with nothing visible yet (-inf) uses 0, so its zeros stay zeros
  // and nothing turns NaN.
  static __device__ __forceinline__ float usable(float m) { return m == -INFINITY ? 0.f : m; }

  // Once the reference maxima settle, most tiles move none of them: the warp then skips rescaling O.
  __device__ __forceinline__ void rescale_o(float (&o)[NO][4], const float (&corrections)[2],
                                            bool rescale) {
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          o[n][2 * half] *= corrections[half];
          o[n][2 * half + 1] *= corrections[half];
        }
    }
  }

  // P as A fragments of the PV GEMM: the S accumulator layout, rounded to T.
  __device__ __forceinline__ void p_fragments(const float (&s)[NS][4], uint32_t (&a)[C::kBlockN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk) {
      a[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      a[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      a[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  }

  // One KV tile with each GEMM waited for where it is issued (run_tiles).
  __device__ void compute_tile(const RequestInfo& r, int h, int kt, int stage, float (&o)[NO][4],
                               float (&m_run)[2], float (&l_run)[2],
                               const uint32_t* const (&mask_row)[2]) {
    stage = __shfl_sync(0xffffffffu, stage, 0);  // warp-uniform for the compiler (see wg)
    const bool masked = tile_masked(r, kt);
    const T* k_tile = sK + stage * (C::kBlockN * C::kDqk);
    const bool v_k = v_from_k(r, kt);
    // Same swizzle either way: V is K's first columns.
    const T* v_tile = v_k || !C::kVTile ? k_tile : sV + stage * (C::kBlockN * C::kDv);

    uint64_t vis[2][kVisWords];
    const bool warp_sees = masked ? tile_visibility(r, kt, mask_row, vis) : true;
    // A fully masked tree tile costs a warp no tensor-core work on the mma.sync path; wgmma is issued by the
    // whole warpgroup, so there every warp computes (the mask then hides what it must).
    const bool skip_tile = !C::kWgmma && !warp_sees;

    float s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    if constexpr (C::kWgmma) {
      issue_qk(k_tile, s);
      wgmma_wait<0>();
    } else if (!skip_tile) {
#pragma unroll
      for (int kk = 0; kk < C::kDqk / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, sQ + swizzle(wm * 16 + (lane & 15), kk * 2 + (lane >> 4), C::kBlockM) * 8);
#pragma unroll
        for (int nj = 0; nj < NS / 2; ++nj) {
          uint32_t b[4];
          const int key = wn * C::kKeysPerWarp + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(b, k_tile + swizzle(key, kk * 2 + ((lane >> 3) & 1), C::kBlockN) * 8);
          mma_16816<T>(s[2 * nj], a, b[0], b[1]);
          mma_16816<T>(s[2 * nj + 1], a, b[2], b[3]);
        }
      }
    }

    float corrections[2];
    const bool rescale = softmax_tile(r, kt, masked, warp_sees, vis, s, m_run, l_run, corrections);
    rescale_o(o, corrections, rescale);

    if constexpr (C::kWarpsN == 1) {
      if constexpr (!C::kVTile)
        if (!v_k) load_v_over_k(r, h, kt, sK + stage * (C::kBlockN * C::kDqk));
      if (skip_tile) return;  // P is all zeros
      uint32_t a[C::kBlockN / 16][4];
      p_fragments(s, a);
      if constexpr (C::kWgmma) {
        issue_pv_regs(a, v_tile, o);
        wgmma_wait<0>();
      } else {
#pragma unroll
        for (int kk = 0; kk < C::kBlockN / 16; ++kk) pv_step(a[kk], v_tile, kk, o);
      }
    } else {
      // Share P: the PV phase needs every key of the row group, the S phase split them across warps.
      store_p(s, sP, wn * C::kKeysPerWarp);
      if constexpr (C::kWgmma) fence_proxy_async();  // wgmma reads P through the async proxy
      __syncthreads();
      if constexpr (!C::kVTile)
        if (!v_k) load_v_over_k(r, h, kt, sK + stage * (C::kBlockN * C::kDqk));
      if constexpr (C::kWgmma) {
        issue_pv_smem(sP, v_tile, o);
        wgmma_wait<0>();
      } else {
#pragma unroll
        for (int kk = 0; kk < C::kBlockN / 16; ++kk) {
          uint32_t a[4];
          ldmatrix_x4(a, sP + swizzle(wm * 16 + (lane & 15), kk * 2 + (lane >> 4), C::kBlockM) * 8);
          pv_step(a, v_tile, kk, o);
        }
      }
    }
  }

  // This warp's P (s, its keys from column key0) into p_tile: BLOCK_M rows, swizzled K-major like Q (the A
  // operand of issue_pv_smem).
  __device__ __forceinline__ void store_p(const float (&s)[NS][4], T* p_tile, int key0) {
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = wm * 16 + (lane >> 2) + 8 * half;
        const int col = key0 + n * 8 + 2 * (lane & 3);
        *reinterpret_cast<uint32_t*>(p_tile + swizzle(row, col / 8, C::kBlockM) * 8 + col % 8) =
            pack2<T>(s[n][2 * half], s[n][2 * half + 1]);
      }
  }

  // wgmma GEMMs of this warp's warpgroup: rows [64 * (wm / 4), +64), the warpgroup's keys (S) or output
  // columns (PV). Each is issued and committed as one group; the caller waits for it (wgmma_wait) before
  // reading its accumulators. Each GEMM builds its descriptors once and steps them by compile-time offsets
  // (a 14-bit address field in 16-byte units that shared memory never overflows).
  static constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static constexpr uint32_t kGroupBytes = 8 * 128;  // 8 swizzled rows of 128 bytes
  // Descriptor step to k-slice kk (16 columns) of a K-major tile with `rows` rows: 64-column blocks are
  // `rows` x 128 bytes apart, 16-column slices 32 bytes apart within a block.
  static constexpr uint64_t k_major_step(int kk, int rows) { return ((kk / 4) * rows * 128 + (kk % 4) * 32) >> 4; }

  // S = Q Kᵀ: Q and K both K-major (rows of Dqk). Overwrites s.
  __device__ __forceinline__ void issue_qk(const T* k_tile, float (&s)[NS][4]) {
    const uint64_t q_desc = smem_desc(sQ + wg_row0 * 64, 16, kGroupBytes);
    const uint64_t k_desc = smem_desc(k_tile + (C::kPairedTiles ? 0 : wg_n) * C::kKeysPerWarp * 64, 16, kGroupBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kDqk / 16; ++kk)
      Wgmma<C::kKeysPerWarp>::template ss<kBf16, 0>(&s[0][0], q_desc + k_major_step(kk, C::kBlockM),
                                                    k_desc + k_major_step(kk, C::kBlockN), kk > 0);
    wgmma_commit();
  }

  // V as the N-major B operand: this warpgroup's Dv columns (64-column blocks C::kBlockN rows apart), 16 keys
  // (2 groups of 8 rows) per k-slice.
  __device__ __forceinline__ uint64_t v_desc(const T* v_tile) const {
    return smem_desc(v_tile + (wg_n * C::kDvPerWarp / 64) * C::kBlockN * 64, C::kBlockN * 128, kGroupBytes);
  }
  static constexpr uint64_t v_step(int kk) { return (kk * 2 * kGroupBytes) >> 4; }

  // O += P V with P in registers (WARPS_N = 1).
  __device__ __forceinline__ void issue_pv_regs(const uint32_t (&a)[C::kBlockN / 16][4], const T* v_tile,
                                                float (&o)[NO][4]) {
    // Warp-uniform for the compiler (see wg). Without it, ptxas may keep the descriptor of this loop-carried
    // pointer in ordinary registers and move it to uniform ones before each wgmma (G2 91 -> 94, G5 85 -> 88 us
    // after an unrelated change to load_q).
    const uint64_t desc = __shfl_sync(0xffffffffu, v_desc(v_tile), 0);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk)
      Wgmma<C::kDvPerWarp>::template rs<kBf16, 1>(&o[0][0], a[kk], desc + v_step(kk), 1);
    wgmma_commit();
  }

  // O += P V with P shared through shared memory (WARPS_N > 1; p_tile: BLOCK_M rows, K-major like Q).
  __device__ __forceinline__ void issue_pv_smem(const T* p_tile, const T* v_tile, float (&o)[NO][4]) {
    const uint64_t p_desc = smem_desc(p_tile + wg_row0 * 64, 16, kGroupBytes);
    const uint64_t desc = v_desc(v_tile);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk)
      Wgmma<C::kDvPerWarp>::template ss<kBf16, 1>(&o[0][0], p_desc + k_major_step(kk, C::kBlockM),
                                                  desc + v_step(kk), 1);
    wgmma_commit();
  }

  // O[:, this warp's Dv columns] += P[:, keys kk*16 .. +16] V[keys, columns].
  __device__ __forceinline__ void pv_step(const uint32_t (&a)[4], const T* v_tile, int kk,
                                          float (&o)[NO][4]) {
#pragma unroll
    for (int nd = 0; nd < NO / 2; ++nd) {
      uint32_t b[4];
      const int key = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
      const int chunk = (wn * C::kDvPerWarp + nd * 16) / 8 + (lane >> 4);
      ldmatrix_x4_trans(b, v_tile + swizzle(key, chunk, C::kBlockN) * 8);
      mma_16816<T>(o[2 * nd], a, b[0], b[1]);
      mma_16816<T>(o[2 * nd + 1], a, b[2], b[3]);
    }
  }

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
