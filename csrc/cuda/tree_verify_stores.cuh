// What the tree-verify CTA writes: finished rows, the normalized partials of split row tiles, and their
// merge by the last-arriving CTA; plus the zeroed padding rows of a graph bucket.
#pragma once

#include "tree_verify_cta.cuh"

namespace kdtree::cuda {

template <class C>
__device__ void TreeVerifyCta<C>::store_output(const RequestInfo& r, int h, int m0, const float (&o)[NO][4],
                                               const float (&l_run)[2]) {
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int packed = m0 + wm * 16 + (lane >> 2) + 8 * half;
    if (packed >= r.tree_len * p.group) continue;
    const float inv = l_run[half] > 0.f ? 1.f / l_run[half] : 0.f;  // sees nothing: zeros
    T* dst = out + out_offset(r, h, packed);
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      const int col = wn * C::kDvPerWarp + n * 8 + 2 * (lane & 3);
      *reinterpret_cast<uint32_t*>(dst + col) = pack2<T>(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
  }
}

template <class C>
__device__ void TreeVerifyCta<C>::store_partial(const float (&o)[NO][4], const float (&m_run)[2],
                                                const float (&l_run)[2], long long slot) {
  float* po = p.partial_out + static_cast<int64_t>(slot) * C::kBlockM * C::kDv;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = wm * 16 + (lane >> 2) + 8 * half;
    const float l = l_run[half];
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      const int col = wn * C::kDvPerWarp + n * 8 + 2 * (lane & 3);
      *reinterpret_cast<float2*>(po + row * C::kDv + col) = make_float2(o[n][2 * half] * inv,
                                                                        o[n][2 * half + 1] * inv);
    }
    if (wn == 0 && (lane & 3) == 0)
      p.partial_lse[slot * C::kBlockM + row] = l > 0.f ? m_run[half] + __log2f(l) : -INFINITY;
  }
}

template <class C>
__device__ void TreeVerifyCta<C>::combine(const RequestInfo& r, int h, int m0, long long first_piece, int pieces) {
  auto slot_of = [&](int k) { return first_piece + k; };
  constexpr int kColVecs = C::kDv / 4;
  constexpr int kPerThread = C::kBlockM * kColVecs / C::kMathThreads;  // float4 outputs per thread
  static_assert(C::kBlockM * kColVecs % C::kMathThreads == 0, "threads tile the output");
  constexpr int kMaxPieces = C::kStages * (C::kKBytes + C::kVBytes) / (4 * C::kBlockM);
  float* weight = reinterpret_cast<float*>(sK);  // [pieces of this round][BLOCK_M]
  float* row_max = sRed;                         // [BLOCK_M] max log-sum-exp over the pieces

  math_sync();
  for (int row = tid; row < C::kBlockM; row += C::kMathThreads) {
    float mx = -INFINITY;
    for (int k = 0; k < pieces; ++k) mx = fmaxf(mx, __ldcg(p.partial_lse + slot_of(k) * C::kBlockM + row));
    row_max[row] = mx;
  }
  // Outputs in groups of at most 8 float4 per thread, to bound the registers this tail needs.
  constexpr int kGroup = kPerThread < 8 ? kPerThread : 8;
  static_assert(kPerThread % kGroup == 0, "whole groups");
  T* out = static_cast<T*>(p.out);
  for (int g = 0; g < kPerThread; g += kGroup) {
    float4 acc[kGroup];
    float weight_sum[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f), weight_sum[i] = 0.f;
    for (int k0 = 0; k0 < pieces; k0 += kMaxPieces) {
      const int round = min(kMaxPieces, pieces - k0);
      math_sync();  // row_max is written / the previous round's weights are consumed
      for (int i = tid; i < round * C::kBlockM; i += C::kMathThreads) {
        const int row = i % C::kBlockM;
        const float lse = __ldcg(p.partial_lse + slot_of(k0 + i / C::kBlockM) * C::kBlockM + row);
        weight[i] = lse == -INFINITY ? 0.f : exp2f(lse - row_max[row]);
      }
      math_sync();
      // Four pieces' loads in flight at once (MLA M1: 107 -> 99 us against one piece of 16 loads at a time).
#pragma unroll 4
      for (int k = 0; k < round; ++k) {
        const float4* src = reinterpret_cast<const float4*>(
            p.partial_out + static_cast<int64_t>(slot_of(k0 + k)) * C::kBlockM * C::kDv);
#pragma unroll
        for (int i = 0; i < kGroup; ++i) {
          const int item = tid + (g + i) * C::kMathThreads;
          const float w = weight[k * C::kBlockM + item / kColVecs];
          const float4 v = __ldcg(src + item);  // written by other CTAs: read from L2, never a stale L1 line
          acc[i].x += w * v.x, acc[i].y += w * v.y, acc[i].z += w * v.z, acc[i].w += w * v.w;
          weight_sum[i] += w;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int item = tid + (g + i) * C::kMathThreads, row = item / kColVecs, col = (item % kColVecs) * 4;
      const int packed = m0 + row;
      if (packed >= r.tree_len * p.group) continue;
      const float inv = weight_sum[i] > 0.f ? 1.f / weight_sum[i] : 0.f;  // nothing visible: zeros
      T* dst = out + out_offset(r, h, packed) + col;
      *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(acc[i].x * inv, acc[i].y * inv),
                                                  pack2<T>(acc[i].z * inv, acc[i].w * inv));
    }
  }
}

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

}  // namespace kdtree::cuda
