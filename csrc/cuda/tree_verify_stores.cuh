// What the tree-verify CTA writes: finished rows, the normalized partials of split row tiles, and their
// merge; plus the zeroed padding rows of a graph bucket.
//
// O leaves the registers through shared memory (the idle K/V buffers), so that every global write is a
// whole 16-byte vector of a contiguous row: written straight from the MMA fragments, each warp instruction
// would touch eight rows with 8- or 16-byte pieces (MLA M5's output took 8.8 us that way, M1's fp32 partials
// 12 us). Partials are in T, as the output (their log-sum-exps in fp32): half the bytes of fp32 to write and
// to merge, and the merging CTA adds its own piece from the staged copy that it published.
//
// A split row tile's partials are published in kSlices slices of rows, each with its own arrival counter, and
// whoever completes a slice's count merges that slice. The pieces publish their slices in rotated orders
// (piece k starts at slice k % kSlices), so pieces that finish together complete different slices and share
// the merge; a single last piece merges everything. (One CTA merging the whole tile read 1 MB for MLA M1's
// eight pieces: 22 us.) The merge of a slice reads the pieces in a fixed order, so results are deterministic.
// A row tile of two pieces on the two CTAs of a cluster skips the workspace: one reads the other's staged
// output through distributed shared memory (merge_pair).
#pragma once

#include "tree_verify_cta.cuh"

namespace kdtree::cuda {

// Arrival on a counter of the work split, a release: this CTA's writes, ordered before it by a barrier, are
// visible before the count moves. Returns the count before; the arriving thread does not wait for it until it
// reads it, so the slices' arrivals overlap the next slices' stores.
__device__ __forceinline__ int arrive_counter(int* counter) {
  int before;
  asm volatile("atom.release.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(counter) : "memory");
  return before;
}

// After the arrivals that completed a count: the writes of the earlier arrivals are visible to this thread
// (and, after a barrier, to its CTA).
__device__ __forceinline__ void acquire_arrivals() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

// The counters are zeroed by the kernel launched just before this one, which this grid may overlap
// (split_counters.cu): wait for that kernel before the first arrival.
__device__ __forceinline__ void wait_for_zeroed_counters() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Eight T values of a 16-byte chunk, as floats.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& chunk, float (&v)[8]) {
  const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    float2 f;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[w]));
    else f = __half22float2(*reinterpret_cast<const __half2*>(&words[w]));
    v[2 * w] = f.x, v[2 * w + 1] = f.y;
  }
}

// Eight floats times `scale`, as the T values of a 16-byte chunk.
template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&v)[8], float scale) {
  return make_uint4(pack2<T>(v[0] * scale, v[1] * scale), pack2<T>(v[2] * scale, v[3] * scale),
                    pack2<T>(v[4] * scale, v[5] * scale), pack2<T>(v[6] * scale, v[7] * scale));
}

// Staged O: [BLOCK_M][Dv] of T at the start of the K/V buffers in the tiles' swizzled layout (mma.cuh): the
// fragment writes (eight rows per instruction) and the row reads are both free of bank conflicts.
template <class C>
__device__ __forceinline__ typename C::T* TreeVerifyCta<C>::staged_chunk(int row, int chunk) const {
  return sK + swizzle(row, chunk, C::kBlockM) * 8;
}

template <class C>
__device__ void TreeVerifyCta<C>::stage_output(const float (&o)[NO][4], const float (&l_run)[2]) {
  math_sync();  // every warp is done with the K/V buffers
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = wm * 16 + (lane >> 2) + 8 * half;
    const float inv = l_run[half] > 0.f ? 1.f / l_run[half] : 0.f;  // sees nothing: zeros
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      const int col = wn * C::kDvPerWarp + n * 8 + 2 * (lane & 3);
      *reinterpret_cast<uint32_t*>(staged_chunk(row, col / 8) + col % 8) =
          pack2<T>(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
  }
  math_sync();
}

template <class C>
__device__ __forceinline__ void TreeVerifyCta<C>::store_row_lse(float* dst, const float (&m_run)[2],
                                                                const float (&l_run)[2]) const {
  if (wn == 0 && (lane & 3) == 0)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float l = l_run[half];
      dst[wm * 16 + (lane >> 2) + 8 * half] = l > 0.f ? m_run[half] + __log2f(l) : -INFINITY;
    }
}

template <class C>
__device__ void TreeVerifyCta<C>::store_output(const RequestInfo& r, int h, int m0, const float (&o)[NO][4],
                                               const float (&l_run)[2]) {
  stage_output(o, l_run);
  constexpr int kChunks = C::kDv / 8;
  T* out = static_cast<T*>(p.out);
  // Eight threads to a row (a warp: four whole 128-byte lines per instruction), so each thread finds a row's
  // offset, a division by the group, once for all of its chunks of the row (cold code: its length is its time).
  constexpr int kRowsPerPass = C::kMathThreads / 8;
  static_assert(C::kBlockM % kRowsPerPass == 0 && kChunks % 8 == 0, "threads tile the rows");
#pragma unroll
  for (int pass = 0; pass < C::kBlockM / kRowsPerPass; ++pass) {
    const int row = tid / 8 + pass * kRowsPerPass;
    if (m0 + row >= r.rows) break;  // padding rows of the tile, and so are this thread's next
    T* const dst = out + out_offset(r, h, m0 + row);
#pragma unroll
    for (int j = 0; j < kChunks / 8; ++j) {
      const int chunk = tid % 8 + 8 * j;
      *reinterpret_cast<uint4*>(dst + chunk * 8) = *reinterpret_cast<const uint4*>(staged_chunk(row, chunk));
    }
  }
}

template <class C>
__device__ void TreeVerifyCta<C>::store_partial(const Segment& sg, int m0, const float (&o)[NO][4],
                                                const float (&m_run)[2], const float (&l_run)[2]) {
  const long long slot = sg.first_piece + sg.split;  // of this piece's partial and log-sum-exps
  store_row_lse(p.partial_lse + slot * C::kBlockM, m_run, l_run);
  stage_output(o, l_run);

  constexpr int kRows = C::kBlockM / kSlices, kChunks = C::kDv / 8;  // a slice; chunks per row
  T* partial = static_cast<T*>(p.partial_out) + slot * C::kBlockM * C::kDv;
  int* counters = p.row_tile_counters + static_cast<int64_t>(sg.row_tile) * kSlices;
  int before[kSlices];  // thread 0: each arrival's count before it, read only after the last arrival
  if (tid == 0) wait_for_zeroed_counters();
#pragma unroll
  for (int j = 0; j < kSlices; ++j) {
    const int slice = (sg.split + j) % kSlices;
    for (int i = tid; i < kRows * kChunks; i += C::kMathThreads) {
      const int row = slice * kRows + i / kChunks, chunk = i % kChunks;
      __stcg(reinterpret_cast<uint4*>(partial + row * C::kDv) + chunk,
             *reinterpret_cast<const uint4*>(staged_chunk(row, chunk)));
    }
    math_sync();  // the slice is written (and, the first time, the log-sum-exps)
    if (tid == 0) before[j] = arrive_counter(counters + slice);
  }
  if (tid == 0) {
    uint32_t completed = 0;  // the slices whose count this CTA completed
#pragma unroll
    for (int j = 0; j < kSlices; ++j)
      if (before[j] == sg.pieces - 1) completed |= 1u << ((sg.split + j) % kSlices);
    if (completed != 0) acquire_arrivals();
    *sFlag = static_cast<int>(completed);
  }
  math_sync();
  const uint32_t completed = static_cast<uint32_t>(*sFlag);
  if (completed != 0) merge_slices(sg, m0, completed);
}

template <class C>
__device__ void TreeVerifyCta<C>::merge_slices(const Segment& sg, int m0, uint32_t slices) {
  const RequestInfo& r = sg.r;
  const int h = sg.h;
  const long long first_piece = sg.first_piece;
  const int pieces = sg.pieces, own = sg.split;
  constexpr int kRows = C::kBlockM / kSlices, kChunks = C::kDv / 8;
  // Each thread adds kPerThread 16-byte chunks of one row of the slice (`row`), so one weight per part serves
  // them all; consecutive threads take consecutive chunks, so each warp instruction reads whole lines.
  constexpr int kPerThread = kRows * kChunks / C::kMathThreads, kThreadsPerRow = kChunks / kPerThread;
  static_assert(kRows * kChunks % C::kMathThreads == 0 && kChunks % kPerThread == 0, "threads tile a slice's rows");
  const int row = tid / kThreadsPerRow;
  auto item = [&](int i) { return row * kChunks + tid % kThreadsPerRow + i * kThreadsPerRow; };  // in the slice
  // Part j is piece j % pieces of the (j / pieces)-th slice to merge. This CTA's own piece is still staged;
  // the others' stream through a ring behind the staged tile, kRing - 1 parts ahead and across slices: each
  // thread copies what it adds (cp.async), its chunks and the 16 bytes that hold its row's log-sum-exp (into
  // a slot of its own in the Q buffer), so it waits only for its own copies, with no barrier, and holds no loads
  // in registers (with the loads in registers, ptxas spilled in the tile loop).
  constexpr int kPartElems = kRows * C::kDv;
  // The ring of parts: behind the staged tile in the K/V buffers, four parts (two where only two fit: the 99 KB
  // class's MLA); where not even two fit there (sm_80's MLA, without V tiles), in the Q buffer with the log-sum-exp
  // slots behind it, as many parts as fit (three).
  constexpr size_t kKvBytes = C::kStages * (C::kKBytes + C::kVBytes), kStaged = C::kBlockM * C::kDv * sizeof(T);
  constexpr size_t kPartBytes = kPartElems * sizeof(T), kLseBytes = C::kMathThreads * 16;
  constexpr bool kRingInKv = kStaged + 2 * kPartBytes <= kKvBytes;
  constexpr int kRing = kRingInKv ? (kStaged + 4 * kPartBytes <= kKvBytes ? 4 : 2)
                                  : (4 * (kPartBytes + kLseBytes) <= C::kQBytes ? 4 : 3);
  static_assert(kRingInKv ? kStaged + kRing * kPartBytes <= kKvBytes && kRing * kLseBytes <= C::kQBytes
                          : kStaged <= kKvBytes && kRing * (kPartBytes + kLseBytes) <= C::kQBytes,
                "the staged tile, the ring and the log-sum-exp slots fit");
  static_assert(kRows % 4 == 0, "a row's log-sum-exp in one 16-byte slot");
  T* ring = kRingInKv ? sK + C::kBlockM * C::kDv : sQ;
  // Part j's log-sum-exps: lse[(j % kRing) * kMathThreads], a slot a thread, in the Q buffer (behind the ring there).
  float4* lse = reinterpret_cast<float4*>(kRingInKv ? sQ : sQ + kRing * kPartElems) + tid;
  const int parts = __popc(slices) * pieces;
  auto slice_of = [&](int j) {  // the (j / pieces)-th set bit of `slices`
    uint32_t rest = slices;
    for (int n = j / pieces; n > 0; --n) rest &= rest - 1;
    return __ffs(rest) - 1;
  };
  auto copy_part = [&](int j) {  // into ring slot j % kRing; a group either way
    if (j < parts) {
      const long long piece = first_piece + j % pieces;
      const int slice = slice_of(j);
      const float* lse_src = p.partial_lse + piece * C::kBlockM + slice * kRows + row / 4 * 4;  // 16-byte aligned
      cp_async_16(lse + (j % kRing) * C::kMathThreads, lse_src, true);
      if (j % pieces != own) {
        const T* src = static_cast<const T*>(p.partial_out) + piece * C::kBlockM * C::kDv + slice * kPartElems;
#pragma unroll
        for (int i = 0; i < kPerThread; ++i)
          cp_async_16(ring + (j % kRing) * kPartElems + item(i) * 8, src + item(i) * 8, true);
      }
    }
    cp_async_commit();
  };

  math_sync();  // the publication is done with the K/V buffers and Q's
#pragma unroll
  for (int j = 0; j < kRing - 1; ++j) copy_part(j);
  T* out = static_cast<T*>(p.out);
  int j = 0;
#pragma unroll 1
  for (uint32_t rest = slices; rest != 0; rest &= rest - 1) {
    const int row0 = (__ffs(rest) - 1) * kRows;
    // The row's pieces so far, summed at the reference m (online, like the softmax).
    float acc[kPerThread][8], m = -INFINITY, weight_sum = 0.f;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[i][e] = 0.f;
    for (int k = 0; k < pieces; ++k, ++j) {
      copy_part(j + kRing - 1);
      cp_async_wait<kRing - 1>();  // this thread's copies of part j landed
      const float x = reinterpret_cast<const float*>(lse + (j % kRing) * C::kMathThreads)[row % 4];
      const float m_new = fmaxf(m, x), ref = usable(m_new);  // -inf: nothing visible so far, weights 0
      const float keep = fast_exp2(m - ref), w = fast_exp2(x - ref);
      weight_sum = weight_sum * keep + w;
      m = m_new;
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {  // branch-free: the merge is bound by instruction latency
        const T* chunk = k == own ? staged_chunk(row0 + row, item(i) % kChunks)
                                  : ring + (j % kRing) * kPartElems + item(i) * 8;
        float v[8];
        unpack8<T>(*reinterpret_cast<const uint4*>(chunk), v);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i][e] = acc[i][e] * keep + w * v[e];
      }
    }
    if (m0 + row0 + row < r.rows) {  // else a padding row of the tile
      const float inv = weight_sum > 0.f ? 1.f / weight_sum : 0.f;  // nothing visible: zeros
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
        *reinterpret_cast<uint4*>(out + out_offset(r, h, m0 + row0 + row) + (item(i) % kChunks) * 8) =
            pack8<T>(acc[i], inv);
    }
  }
  cp_async_wait<0>();
}

// The two pieces of a row tile on the two CTAs of a cluster, piece k on rank k (Segment::cluster_pair). Both stage
// their normalized output as for a store and their rows' log-sum-exps in sRed (unused with WARPS_N = 1). Piece 1
// announces its staged copy on piece 0's "ready" barrier and stays until piece 0 has read it ("done"); piece 0
// reads it through distributed shared memory, adds it to its own with the same weights as merge_slices, and
// writes the rows: no partial in the workspace, no counters, one pass over the output.
template <class C>
__device__ void TreeVerifyCta<C>::merge_pair(const Segment& sg, int m0, const float (&o)[NO][4],
                                             const float (&m_run)[2], const float (&l_run)[2]) {
  if constexpr (C::kClusterPairs) {
    static_assert(C::kWarpsN == 1, "sRed holds a log-sum-exp per row, and nothing else, with WARPS_N = 1");
    store_row_lse(sRed, m_run, l_run);
    stage_output(o, l_run);  // its closing barrier orders the log-sum-exps too
    const uint32_t other = 1 - sg.split;  // the other piece's rank
    if (sg.split == 1) {
      if (tid == 0) {
        cluster_wait();  // the other CTA's barriers are initialized
        mbarrier_arrive_remote(cluster_addr(pair_ready, other));
        mbarrier_wait<true>(pair_done, 0);  // one pair per launch: phase 0. Then this shared memory may go.
      }
      return;
    }
    mbarrier_wait<true>(pair_ready, 0);
    const uint32_t their_sK = cluster_addr(sK, other), their_lse = cluster_addr(sRed, other);
    constexpr int kChunks = C::kDv / 8, kRowsPerPass = C::kMathThreads / 8;  // eight threads to a row
    static_assert(C::kBlockM % kRowsPerPass == 0 && kChunks % 8 == 0, "threads tile the rows");
    const RequestInfo& r = sg.r;
    T* out = static_cast<T*>(p.out);
#pragma unroll 1
    for (int pass = 0; pass < C::kBlockM / kRowsPerPass; ++pass) {
      const int row = tid / 8 + pass * kRowsPerPass;
      const float mine = sRed[row], theirs = load_cluster_f32(their_lse + row * 4);
      const float ref = usable(fmaxf(mine, theirs));  // -inf: neither piece sees a key, zeros
      const float w_mine = fast_exp2(mine - ref), w_theirs = fast_exp2(theirs - ref);
      const float inv = w_mine + w_theirs > 0.f ? 1.f / (w_mine + w_theirs) : 0.f;
#pragma unroll
      for (int j = 0; j < kChunks / 8; ++j) {
        const T* own = staged_chunk(row, tid % 8 + 8 * j);
        float a[8], b[8];
        unpack8<T>(*reinterpret_cast<const uint4*>(own), a);
        unpack8<T>(load_cluster_16(their_sK + static_cast<uint32_t>((own - sK) * sizeof(T))), b);
        if (m0 + row < r.rows) {  // else a padding row of the tile
#pragma unroll
          for (int e = 0; e < 8; ++e) a[e] = a[e] * w_mine + b[e] * w_theirs;
          *reinterpret_cast<uint4*>(out + out_offset(r, sg.h, m0 + row) + (tid % 8 + 8 * j) * 8) = pack8<T>(a, inv);
        }
      }
    }
    math_sync();  // every read of the other CTA's shared memory has returned
    if (tid == 0) {
      cluster_wait();
      mbarrier_arrive_remote(cluster_addr(pair_done, other));
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
