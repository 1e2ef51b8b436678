// Tree-verify attention kernel (mma.sync m16n8k16: sm_80, sm_90a, sm_120).
//
// One CTA runs a contiguous range of (row tile, KV tile) units from the device-side work split
// (work_split.cuh). A row tile packs BLOCK_M rows of (draft token x query head of one KV head), so one read
// of a KV tile serves every head of the group. Per KV tile: S = Q Kᵀ on tensor cores, the tree mask only on
// tiles that reach the draft columns (prefix tiles are mask-free), online softmax in fp32, O += P V.
// Warps are laid out WARPS_M x WARPS_N: in the S phase the WARPS_N warps of a row group split the tile's
// keys; in the PV phase they split the output columns (MLA's Dv = 512 does not fit one warp's registers),
// exchanging row maxima and P through shared memory. With WARPS_N = 1 P stays in registers.
// A row tile split over several CTAs leaves normalized partial outputs and their log-sum-exp in the
// workspace; the CTA that finishes last (atomic counter) merges them in a fixed order (deterministic).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mma.cuh"
#include "tree_mask_bits.cuh"
#include "tree_verify_params.h"
#include "work_split.cuh"

namespace kdtree::cuda {

template <typename T_, int kDqk_, int kDv_, int kBlockM_, int kBlockN_, int kWarpsN_, int kMTilesPerWarp_,
          int kStages_>
struct TreeVerifyConfig {
  using T = T_;
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarpsN = kWarpsN_, kMTilesPerWarp = kMTilesPerWarp_, kStages = kStages_;
  static constexpr int kRowsPerWarp = 16 * kMTilesPerWarp;
  static constexpr int kWarpsM = kBlockM / kRowsPerWarp;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kKeysPerWarp = kBlockN / kWarpsN;  // S phase
  static constexpr int kDvPerWarp = kDv / kWarpsN;        // PV phase
  static constexpr int kChunksQK = kDqk / 8, kChunksV = kDv / 8;
  static constexpr int kPStride = kBlockN + 8;  // padded P rows (WARPS_N > 1)
  static_assert(kBlockM % kRowsPerWarp == 0 && kBlockN <= 64 && kBlockN % 16 == 0, "tile shape");
  static_assert(kKeysPerWarp % 16 == 0 && kDvPerWarp % 16 == 0 && kDqk % 64 == 0 && kDv % 64 == 0, "warp split");

  static constexpr int kQBytes = kBlockM * kDqk * 2;
  static constexpr int kKBytes = kBlockN * kDqk * 2;
  static constexpr int kVBytes = kBlockN * kDv * 2;
  static constexpr int kPBytes = kWarpsN > 1 ? kBlockM * kPStride * 2 : 0;
  static constexpr int kRedBytes = kWarpsN * kBlockM * 4;
  static constexpr int kFixedSmem = kQBytes + kStages * (kKBytes + kVBytes) + kPBytes + kRedBytes + 16;
  // Plus the schedule: (B+1) unit starts (int64) and (B+1) row-tile starts (int32).
  static size_t smem_bytes(int batch) { return kFixedSmem + (batch + 1) * 12 + 8; }
};

template <class C>
struct TreeVerifyCta {
  using T = typename C::T;
  static constexpr int MI = C::kMTilesPerWarp;
  static constexpr int NS = C::kKeysPerWarp / 8;  // S n-tiles per warp
  static constexpr int NO = C::kDvPerWarp / 8;    // O n-tiles per warp

  const TreeVerifyParams& p;
  T* sQ;
  T* sK;
  T* sV;
  T* sP;
  float* sRed;
  int* sFlag;
  const int tid = threadIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;

  __device__ TreeVerifyCta(const TreeVerifyParams& params, char* smem) : p(params) {
    sQ = reinterpret_cast<T*>(smem);
    sK = reinterpret_cast<T*>(smem + C::kQBytes);
    sV = reinterpret_cast<T*>(smem + C::kQBytes + C::kStages * C::kKBytes);
    sP = reinterpret_cast<T*>(smem + C::kQBytes + C::kStages * (C::kKBytes + C::kVBytes));
    sRed = reinterpret_cast<float*>(smem + C::kQBytes + C::kStages * (C::kKBytes + C::kVBytes) + C::kPBytes);
    sFlag = reinterpret_cast<int*>(smem + C::kFixedSmem - 16);
  }

  __device__ int64_t slot(int i) const {
    return p.kv_indices_int64 ? static_cast<const int64_t*>(p.kv_indices)[i]
                              : static_cast<int64_t>(static_cast<const int32_t*>(p.kv_indices)[i]);
  }

  // Q rows of the tile: row r is token (m0 + r) / G, query head h * G + (m0 + r) % G.
  __device__ void load_q(const RequestInfo& r, int h, int m0) {
    const T* q = static_cast<const T*>(p.q);
    for (int i = tid; i < C::kBlockM * C::kChunksQK; i += C::kThreads) {
      const int row = i / C::kChunksQK, chunk = i % C::kChunksQK;
      const int packed = m0 + row;
      const bool valid = packed < r.tree_len * p.group;
      const int token = valid ? packed / p.group : 0, head = h * p.group + (valid ? packed % p.group : 0);
      const T* src = q + (r.qo_start + token) * p.q_row_stride + head * p.q_head_stride + chunk * 8;
      cp_async_16(sQ + swizzle(row, chunk, C::kChunksQK) * 8, valid ? src : q, valid);
    }
  }

  // KV tile `kt` into `stage`. Key j < L_b (or every key, with draft K/V in the cache) comes from the cache
  // slot kv_indices[kv_start + j]; with k_draft/v_draft, draft key j - L_b is row qo_start + j - L_b there.
  __device__ void load_kv(const RequestInfo& r, int h, int kt, int stage, bool v_from_k) {
    const T* kc = static_cast<const T*>(p.k_cache);
    const T* vc = static_cast<const T*>(p.v_cache);
    T* dk = sK + stage * (C::kBlockN * C::kDqk);
    T* dv = sV + stage * (C::kBlockN * C::kDv);
    const int k0 = kt * C::kBlockN;
    constexpr int kChunks = C::kChunksQK + C::kChunksV;
    for (int i = tid; i < C::kBlockN * kChunks; i += C::kThreads) {
      const int row = i / kChunks, c = i % kChunks;
      const bool is_v = c >= C::kChunksQK;
      if (is_v && v_from_k) continue;
      const int chunk = is_v ? c - C::kChunksQK : c;
      const int j = k0 + row;
      const bool valid = j < r.kv_len;
      const T* src = kc;
      if (valid) {
        if (p.k_draft == nullptr || j < r.prefix_len) {
          const int64_t s = slot(r.kv_start + j);
          src = is_v ? vc + s * p.v_row_stride + h * p.v_head_stride
                     : kc + s * p.k_row_stride + h * p.k_head_stride;
        } else {
          const int64_t d = r.qo_start + j - r.prefix_len;
          src = is_v ? static_cast<const T*>(p.v_draft) + d * p.vd_row_stride + h * p.vd_head_stride
                     : static_cast<const T*>(p.k_draft) + d * p.kd_row_stride + h * p.kd_head_stride;
        }
        src += chunk * 8;
      }
      if (is_v) cp_async_16(dv + swizzle(row, chunk, C::kChunksV) * 8, src, valid);
      else cp_async_16(dk + swizzle(row, chunk, C::kChunksQK) * 8, src, valid);
    }
  }

  // V of tile `kt` is the K tile's first Dv columns (MLA's latent cache), so it needs no load of its own.
  __device__ bool v_from_k(const RequestInfo& r, int kt) const {
    if (!p.cache_v_aliases_k) return false;
    const bool reaches_draft = (kt + 1) * C::kBlockN > r.prefix_len;
    return !reaches_draft || p.k_draft == nullptr || p.draft_v_aliases_k;
  }

  __device__ void run_segment(const RequestInfo& r, int h, int mt, int kt0, int kt1, bool complete, int which,
                              int row_tile, int pieces, long long units_per_cta, long long rt_start_unit) {
    const int m0 = mt * C::kBlockM;
    float o[MI][NO][4];
    float m_run[MI][2], l_run[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int n = 0; n < NO; ++n) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.f;
      m_run[mi][0] = m_run[mi][1] = -INFINITY;
      l_run[mi][0] = l_run[mi][1] = 0.f;
    }
    // Mask row of each of this thread's rows (nullptr: padding row past T_b * G, sees nothing).
    const uint32_t* mask_row[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int packed = m0 + (wm * MI + mi) * 16 + (lane >> 2) + 8 * half;
        mask_row[mi][half] = packed < r.tree_len * p.group
                                 ? p.tree_mask + (r.qo_start + packed / p.group) * p.mask_row_stride
                                 : nullptr;
      }

    __syncthreads();  // the previous segment is done with shared memory
    load_q(r, h, m0);
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) {
      if (kt0 + s < kt1) load_kv(r, h, kt0 + s, s, v_from_k(r, kt0 + s));
      cp_async_commit();
    }

    for (int kt = kt0; kt < kt1; ++kt) {
      const int stage = (kt - kt0) % C::kStages;
      cp_async_wait<C::kStages - 2>();
      __syncthreads();  // tile kt landed for everyone; everyone is done with tile kt - 1
      {
        const int next = kt + C::kStages - 1;
        if (next < kt1) load_kv(r, h, next, (next - kt0) % C::kStages, v_from_k(r, next));
        cp_async_commit();
      }
      compute_tile(r, kt, stage, o, m_run, l_run, mask_row);
    }
    cp_async_wait<0>();

    // Row sums: each thread summed its own columns; add the quad's, then the other WARPS_N warps'.
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float l = l_run[mi][half];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        l_run[mi][half] = l;
      }
    if constexpr (C::kWarpsN > 1) {
      __syncthreads();
      if ((lane & 3) == 0)
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            sRed[wn * C::kBlockM + (wm * MI + mi) * 16 + (lane >> 2) + 8 * half] = l_run[mi][half];
      __syncthreads();
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float l = 0.f;
          for (int w = 0; w < C::kWarpsN; ++w) l += sRed[w * C::kBlockM + (wm * MI + mi) * 16 + (lane >> 2) + 8 * half];
          l_run[mi][half] = l;
        }
    }

    if (complete) {
      store_output(r, h, m0, o, l_run);
    } else {
      store_partial(r, m0, o, m_run, l_run, blockIdx.x * 2 + which);
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        const int done = atomicAdd(p.row_tile_counters + row_tile, 1);
        const bool last = done == pieces - 1;
        if (last) p.row_tile_counters[row_tile] = 0;  // ready for the next launch
        *sFlag = last;
      }
      __syncthreads();
      if (*sFlag) {
        __threadfence();
        combine(r, h, m0, pieces, units_per_cta, rt_start_unit);
      }
    }
  }

  __device__ void compute_tile(const RequestInfo& r, int kt, int stage, float (&o)[MI][NO][4],
                               float (&m_run)[MI][2], float (&l_run)[MI][2],
                               const uint32_t* const (&mask_row)[MI][2]) {
    const int k0 = kt * C::kBlockN;
    const bool masked = k0 + C::kBlockN > r.prefix_len;  // reaches draft columns or the end of the keys
    const T* k_tile = sK + stage * (C::kBlockN * C::kDqk);
    const bool v_k = v_from_k(r, kt);
    const T* v_tile = v_k ? k_tile : sV + stage * (C::kBlockN * C::kDv);
    const int v_chunks = v_k ? C::kChunksQK : C::kChunksV;

    // Visibility of this thread's columns, and whether the warp's rows see anything in its columns.
    uint64_t vis[MI][2];
    bool warp_sees = true;
    if (masked) {
      bool any = false;
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          vis[mi][half] = mask_row[mi][half] == nullptr
                              ? 0ull
                              : visible_columns(mask_row[mi][half], p.mask_words, k0, r.prefix_len, r.kv_len);
          const uint64_t mine = (vis[mi][half] >> (wn * C::kKeysPerWarp));
          any |= (C::kKeysPerWarp == 64 ? mine : (mine & ((1ull << C::kKeysPerWarp) - 1))) != 0;
        }
      warp_sees = __any_sync(0xffffffffu, any);
    }

    float s[MI][NS][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int n = 0; n < NS; ++n) s[mi][n][0] = s[mi][n][1] = s[mi][n][2] = s[mi][n][3] = 0.f;
    if (warp_sees) {  // a fully masked tree tile costs this warp no tensor-core work
#pragma unroll
      for (int kk = 0; kk < C::kDqk / 16; ++kk) {
        uint32_t a[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
          ldmatrix_x4(a[mi], sQ + swizzle((wm * MI + mi) * 16 + (lane & 15), kk * 2 + (lane >> 4), C::kChunksQK) * 8);
#pragma unroll
        for (int nj = 0; nj < NS / 2; ++nj) {
          uint32_t b[4];
          const int key = wn * C::kKeysPerWarp + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(b, k_tile + swizzle(key, kk * 2 + ((lane >> 3) & 1), C::kChunksQK) * 8);
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
            mma_16816<T>(s[mi][2 * nj], a[mi], b[0], b[1]);
            mma_16816<T>(s[mi][2 * nj + 1], a[mi], b[2], b[3]);
          }
        }
      }
    }

    // Scores into the log2 domain, masked, and the tile's row maxima.
    float tile_max[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = s[mi][n][2 * half + e];
            x = p.logit_cap > 0.f ? p.logit_cap * tanhf(x * p.sm_scale / p.logit_cap) * 1.4426950408889634f
                                  : x * p.scale_log2;
            const int col = wn * C::kKeysPerWarp + n * 8 + 2 * (lane & 3) + e;
            if (!warp_sees || (masked && !((vis[mi][half] >> col) & 1ull))) x = -INFINITY;
            s[mi][n][2 * half + e] = x;
            mx = fmaxf(mx, x);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        tile_max[mi][half] = mx;
      }
    if constexpr (C::kWarpsN > 1) {
      if ((lane & 3) == 0)
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            sRed[wn * C::kBlockM + (wm * MI + mi) * 16 + (lane >> 2) + 8 * half] = tile_max[mi][half];
      __syncthreads();
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float mx = -INFINITY;
          for (int w = 0; w < C::kWarpsN; ++w)
            mx = fmaxf(mx, sRed[w * C::kBlockM + (wm * MI + mi) * 16 + (lane >> 2) + 8 * half]);
          tile_max[mi][half] = mx;
        }
    }

    // Online softmax: rescale what was accumulated, exponentiate this tile.
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float m_new = fmaxf(m_run[mi][half], tile_max[mi][half]);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: keep zeros, no NaN
        const float correction = exp2f(m_run[mi][half] - m_use);
        m_run[mi][half] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = exp2f(s[mi][n][2 * half + e] - m_use);
            s[mi][n][2 * half + e] = pv;
            sum += pv;
          }
        l_run[mi][half] = l_run[mi][half] * correction + sum;
#pragma unroll
        for (int n = 0; n < NO; ++n) o[mi][n][2 * half] *= correction, o[mi][n][2 * half + 1] *= correction;
      }

    if constexpr (C::kWarpsN == 1) {
      if (!warp_sees) return;  // P is all zeros
#pragma unroll
      for (int kk = 0; kk < C::kBlockN / 16; ++kk) {
        uint32_t a[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          a[mi][0] = pack2<T>(s[mi][2 * kk][0], s[mi][2 * kk][1]);
          a[mi][1] = pack2<T>(s[mi][2 * kk][2], s[mi][2 * kk][3]);
          a[mi][2] = pack2<T>(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
          a[mi][3] = pack2<T>(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
        }
        pv_step(a, v_tile, v_chunks, kk, o);
      }
    } else {
      // Share P: the PV phase needs every key of the row group, the S phase split them across warps.
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = (wm * MI + mi) * 16 + (lane >> 2) + 8 * half;
            const int col = wn * C::kKeysPerWarp + n * 8 + 2 * (lane & 3);
            *reinterpret_cast<uint32_t*>(sP + row * C::kPStride + col) =
                pack2<T>(s[mi][n][2 * half], s[mi][n][2 * half + 1]);
          }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < C::kBlockN / 16; ++kk) {
        uint32_t a[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
          ldmatrix_x4(a[mi], sP + ((wm * MI + mi) * 16 + (lane & 15)) * C::kPStride + kk * 16 + (lane >> 4) * 8);
        pv_step(a, v_tile, v_chunks, kk, o);
      }
    }
  }

  // O[:, this warp's Dv columns] += P[:, keys kk*16 .. +16] V[keys, columns].
  __device__ __forceinline__ void pv_step(const uint32_t (&a)[MI][4], const T* v_tile, int v_chunks, int kk,
                                          float (&o)[MI][NO][4]) {
#pragma unroll
    for (int nd = 0; nd < NO / 2; ++nd) {
      uint32_t b[4];
      const int key = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
      const int chunk = (wn * C::kDvPerWarp + nd * 16) / 8 + (lane >> 4);
      ldmatrix_x4_trans(b, v_tile + swizzle(key, chunk, v_chunks) * 8);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        mma_16816<T>(o[mi][2 * nd], a[mi], b[0], b[1]);
        mma_16816<T>(o[mi][2 * nd + 1], a[mi], b[2], b[3]);
      }
    }
  }

  __device__ void store_output(const RequestInfo& r, int h, int m0, const float (&o)[MI][NO][4],
                               const float (&l_run)[MI][2]) {
    T* out = static_cast<T*>(p.out);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int packed = m0 + (wm * MI + mi) * 16 + (lane >> 2) + 8 * half;
        if (packed >= r.tree_len * p.group) continue;
        const float inv = l_run[mi][half] > 0.f ? 1.f / l_run[mi][half] : 0.f;  // sees nothing: zeros
        T* dst = out + (static_cast<int64_t>(r.qo_start + packed / p.group) * p.num_q_heads + h * p.group +
                        packed % p.group) * C::kDv;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          const int col = wn * C::kDvPerWarp + n * 8 + 2 * (lane & 3);
          *reinterpret_cast<uint32_t*>(dst + col) = pack2<T>(o[mi][n][2 * half] * inv, o[mi][n][2 * half + 1] * inv);
        }
      }
  }

  __device__ void store_partial(const RequestInfo& r, int m0, const float (&o)[MI][NO][4],
                                const float (&m_run)[MI][2], const float (&l_run)[MI][2], int slot) {
    float* po = p.partial_out + static_cast<int64_t>(slot) * C::kBlockM * C::kDv;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = (wm * MI + mi) * 16 + (lane >> 2) + 8 * half;
        const float l = l_run[mi][half];
        const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          const int col = wn * C::kDvPerWarp + n * 8 + 2 * (lane & 3);
          *reinterpret_cast<float2*>(po + row * C::kDv + col) = make_float2(o[mi][n][2 * half] * inv,
                                                                            o[mi][n][2 * half + 1] * inv);
        }
        if (wn == 0 && (lane & 3) == 0)
          p.partial_lse[slot * C::kBlockM + row] = l > 0.f ? m_run[mi][half] + __log2f(l) : -INFINITY;
      }
  }

  // Merge the pieces of a split row tile: CTAs c0..c1 each left one, in slot 2c (their first segment) or
  // 2c + 1 (their last segment: only c0 can hold this row tile in a later segment).
  __device__ void combine(const RequestInfo& r, int h, int m0, int pieces, long long units_per_cta,
                          long long rt_start_unit) {
    const int c0 = static_cast<int>(rt_start_unit / units_per_cta);
    const int first_slot = 2 * c0 + (static_cast<long long>(c0) * units_per_cta < rt_start_unit ? 1 : 0);
    T* out = static_cast<T*>(p.out);
    for (int i = tid; i < C::kBlockM * (C::kDv / 2); i += C::kThreads) {
      const int row = i / (C::kDv / 2), col = (i % (C::kDv / 2)) * 2;
      const int packed = m0 + row;
      if (packed >= r.tree_len * p.group) continue;
      float lse_max = -INFINITY;
      for (int k = 0; k < pieces; ++k) {
        const int slot = k == 0 ? first_slot : 2 * (c0 + k);
        lse_max = fmaxf(lse_max, __ldcg(p.partial_lse + slot * C::kBlockM + row));
      }
      float acc0 = 0.f, acc1 = 0.f, weight = 0.f;
      if (lse_max != -INFINITY) {
        for (int k = 0; k < pieces; ++k) {
          const int slot = k == 0 ? first_slot : 2 * (c0 + k);
          // __ldcg: other CTAs wrote these; read them from L2, never from a stale L1 line.
          const float w = exp2f(__ldcg(p.partial_lse + slot * C::kBlockM + row) - lse_max);
          const float2 v = __ldcg(reinterpret_cast<const float2*>(
              p.partial_out + (static_cast<int64_t>(slot) * C::kBlockM + row) * C::kDv + col));
          acc0 += w * v.x, acc1 += w * v.y, weight += w;
        }
      }
      const float inv = weight > 0.f ? 1.f / weight : 0.f;
      T* dst = out + (static_cast<int64_t>(r.qo_start + packed / p.group) * p.num_q_heads + h * p.group +
                      packed % p.group) * C::kDv;
      *reinterpret_cast<uint32_t*>(dst + col) = pack2<T>(acc0 * inv, acc1 * inv);
    }
  }
};

// Rows past qo_indptr[B] (padding of a graph bucket) are outputs nobody else writes: zero them.
template <typename T>
__device__ void zero_padding_rows(const TreeVerifyParams& p, int dv) {
  const int first = min(max(p.qo_indptr[p.batch], 0), p.num_tokens);
  const int64_t begin = static_cast<int64_t>(first) * p.num_q_heads * dv / 8;
  const int64_t end = static_cast<int64_t>(p.num_tokens) * p.num_q_heads * dv / 8;
  uint4* out = static_cast<uint4*>(p.out);
  for (int64_t i = begin + blockIdx.x * blockDim.x + threadIdx.x; i < end; i += gridDim.x * blockDim.x)
    out[i] = make_uint4(0, 0, 0, 0);
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1) tree_verify_attention_kernel(const __grid_constant__ TreeVerifyParams p) {
  extern __shared__ __align__(128) char smem[];
  zero_padding_rows<typename C::T>(p, C::kDv);
  long long* unit_start = reinterpret_cast<long long*>(smem + C::kFixedSmem);
  int* tile_start = reinterpret_cast<int*>(unit_start + p.batch + 1);
  build_schedule<C::kThreads, C::kBlockM, C::kBlockN>(p, unit_start, tile_start);

  const long long total = unit_start[p.batch];
  const long long per_cta = max((total + gridDim.x - 1) / gridDim.x, static_cast<long long>(p.min_units_per_cta));
  long long u = blockIdx.x * per_cta;
  const long long u_end = min(u + per_cta, total);
  if (u >= u_end) return;

  TreeVerifyCta<C> cta(p, smem);
  int b = find_request(unit_start, p.batch, u);
  int segment = 0;
  while (u < u_end) {
    const RequestInfo r = request_info<C::kBlockM, C::kBlockN>(p, b);
    const long long local = u - unit_start[b];
    const int rt = static_cast<int>(local / r.n_tiles);  // row tile within the request: (head, m tile)
    const int kt0 = static_cast<int>(local % r.n_tiles);
    const int kt1 = static_cast<int>(min(static_cast<long long>(r.n_tiles), kt0 + (u_end - u)));
    const long long rt_start = unit_start[b] + static_cast<long long>(rt) * r.n_tiles;
    const long long rt_end = rt_start + r.n_tiles;
    const int pieces = static_cast<int>((rt_end - 1) / per_cta - rt_start / per_cta + 1);
    cta.run_segment(r, rt / r.m_tiles, rt % r.m_tiles, kt0, kt1, pieces == 1, segment == 0 ? 0 : 1,
                    tile_start[b] + rt, pieces, per_cta, rt_start);
    u += kt1 - kt0;
    ++segment;
    while (b < p.batch && unit_start[b + 1] <= u) ++b;
  }
}

}  // namespace kdtree::cuda
