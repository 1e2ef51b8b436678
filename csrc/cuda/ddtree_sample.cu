// CUDA implementation of ddtree_sample_targets (schema in csrc/ops.cpp, semantics in kdtree_ops/ddtree/sampling.py,
// arithmetic in csrc/ddtree_sample_math.h; the CPU implementation in csrc/cpu/ddtree_sample.cpp gives the same
// tokens). Capture-safe: one CTA per row (grid from shapes), parameters read on the device, no host sync, the
// current stream under a device guard; value checks only with KDTREE_OPS_DEBUG=1 outside capture.
//
// One CTA of 256 threads per logits row, for vocabularies up to 2^22 (the rows of a ~256k vocabulary stay in L2
// between passes: 0.5 MB in bf16). Passes over the row:
//   1. the most likely token (rank 0: a block max of 64-bit rank keys). Greedy rows stop here. Its noisy score
//      z_top + g is a lower bound on the winner's; only candidates — tokens with z + kGumbelMax >= that bound, a
//      prefix of the rank order — can win, and only their place in the top-k/top-p prefix matters;
//   2. the total mass (top-p: an integer sum, the same in any order), the candidates into shared memory (up to
//      kCandidates, in any order: everything after is order-free), and the histogram of their first key digit;
//   3. radix selection of the kept prefix's last candidate, without sorting: per 8-bit digit of the 64-bit rank key
//      (z's order key, then the vocab id), a histogram of counts and masses over the candidates within the prefix
//      chosen so far; one warp scans it from the top for the bin where the rank reaches top_k or the mass before
//      the next bin passes top_p x total. It stops at a bin of one candidate; digits of the id part above V's bit
//      length are skipped. Over shared memory when the candidates fit, else over the row again;
//   4. the draw: the largest z + g over the kept candidates (rank key >= the boundary, min-p), noise computed for
//      those only; a block max of 64-bit draw keys.
// Histogram updates are plain shared-memory atomics (counts 32-bit, masses 64-bit): candidates of one row cluster
// in few first-digit bins, so those serialize; a warp-aggregated update (__match_any_sync) is the first thing to
// try if a GPU profile shows it. Nothing here has been measured on a GPU yet.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <climits>
#include <cmath>

#include "ddtree_sample_args.h"
#include "ddtree_sample_math.h"
#include "launch_class.h"
#include "value_checks.cuh"

namespace kdtree {
namespace {

using namespace kdtree::sample;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;          // 8-bit digits: 8 levels for the 64-bit rank key at most, usually a few
constexpr int kCandidates = 4096;   // candidates kept in shared memory (32 KB); more: the passes reread the row
constexpr unsigned kFullWarp = 0xffffffffu;

struct SampleParamsPtrs {
  const int64_t* positions;   // [B*T]
  const float* temperatures;  // [B]
  const int64_t* top_ks;      // [B]
  const float* top_ps;        // [B]
  const float* min_ps;        // [B]
  const int64_t* seeds;       // [B]
};

struct SmemSample {  // 35.9 KB: static shared memory on every target
  float cand_z[kCandidates];
  uint32_t cand_id[kCandidates];
  uint32_t hist_count[kBins];
  unsigned long long hist_mass[kBins];
  unsigned long long reduce[kWarps];
  uint32_t cand_count;
  // The bin chosen at one level (warp 0 writes, everyone reads after a barrier).
  int found;
  uint32_t digit, bin_count, cum_count;
  unsigned long long cum_mass;
};

__device__ uint64_t block_max(uint64_t v, SmemSample& s) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(kFullWarp, static_cast<unsigned long long>(v), o);
    v = other > v ? other : v;
  }
  __syncthreads();  // the scratch may still be read by a previous reduction
  if ((threadIdx.x & 31) == 0) s.reduce[threadIdx.x >> 5] = v;
  __syncthreads();
  v = s.reduce[0];
  for (int w = 1; w < kWarps; ++w) v = s.reduce[w] > v ? s.reduce[w] : v;
  return v;
}

__device__ uint64_t block_sum(uint64_t v, SmemSample& s) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullWarp, static_cast<unsigned long long>(v), o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.reduce[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0;
  for (int w = 0; w < kWarps; ++w) v += s.reduce[w];
  return v;
}

__device__ void clear_histogram(SmemSample& s) {
  for (int i = threadIdx.x; i < kBins; i += kThreads) {
    s.hist_count[i] = 0;
    s.hist_mass[i] = 0;
  }
}

__device__ void add_to_histogram(SmemSample& s, uint32_t digit, uint32_t mass) {
  atomicAdd(&s.hist_count[digit], 1u);
  if (mass != 0) atomicAdd(&s.hist_mass[digit], static_cast<unsigned long long>(mass));
}

// Warp 0: the first bin from the top (digit 255 down to 0) in which the kept prefix ends — the rank reaches
// `rank_limit` there, or the mass before the next bin exceeds `limit` — given the count and mass of the candidates
// above the current range. Lane l scans bins 255 - 8l down to 248 - 8l after a warp scan of the lanes' totals.
__device__ void choose_bin(SmemSample& s, uint32_t cum_count, uint64_t cum_mass, uint64_t rank_limit, double limit) {
  const int lane = threadIdx.x;
  uint32_t count[8];
  uint64_t mass[8];
  uint32_t lane_count = 0;
  uint64_t lane_mass = 0;
  for (int j = 0; j < 8; ++j) {
    const int bin = kBins - 1 - (lane * 8 + j);
    count[j] = s.hist_count[bin];
    mass[j] = s.hist_mass[bin];
    lane_count += count[j];
    lane_mass += mass[j];
  }
  uint32_t upto_count = lane_count;  // inclusive scan over the lanes, lane 0 = the top bins
  uint64_t upto_mass = lane_mass;
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t c = __shfl_up_sync(kFullWarp, upto_count, o);
    const uint64_t m = __shfl_up_sync(kFullWarp, static_cast<unsigned long long>(upto_mass), o);
    if (lane >= o) {
      upto_count += c;
      upto_mass += m;
    }
  }
  const bool ends_here = cum_count + upto_count >= rank_limit ||
                         static_cast<double>(cum_mass + upto_mass) > limit;
  const unsigned lanes = __ballot_sync(kFullWarp, ends_here);
  if (lanes == 0) {
    if (lane == 0) s.found = 0;
    return;
  }
  if (lane == __ffs(lanes) - 1) {
    uint32_t before_count = cum_count + upto_count - lane_count;
    uint64_t before_mass = cum_mass + upto_mass - lane_mass;
    for (int j = 0; j < 8; ++j) {
      if (before_count + count[j] >= rank_limit || static_cast<double>(before_mass + mass[j]) > limit) {
        s.found = 1;
        s.digit = static_cast<uint32_t>(kBins - 1 - (lane * 8 + j));
        s.bin_count = count[j];
        s.cum_count = before_count;
        s.cum_mass = before_mass;
        return;
      }
      before_count += count[j];
      before_mass += mass[j];
    }
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) sample_targets_kernel(
    const scalar_t* __restrict__ logits,  // [B*T, V], row stride row_stride
    int64_t row_stride, SampleParamsPtrs params,
    int64_t* __restrict__ out,            // [B*T]
    int nodes, uint32_t vocab) {
  __shared__ SmemSample s;
  const int64_t row = blockIdx.x;
  const int64_t b = row / nodes;
  const scalar_t* x = logits + row * row_stride;
  const float temperature = params.temperatures[b];
  const SampleFilters f = sample_filters(temperature, params.top_ks[b], params.top_ps[b], params.min_ps[b], vocab);
  const uint64_t seed = static_cast<uint64_t>(params.seeds[b]);
  const uint32_t position = static_cast<uint32_t>(params.positions[row]);
  auto z_of = [&](uint32_t v) { return scaled_logit(static_cast<float>(x[v]), temperature, f.greedy); };

  // 1. Rank 0.
  uint64_t top_key = 0;
  for (uint32_t v = threadIdx.x; v < vocab; v += kThreads) {
    const uint64_t key = rank_key(z_of(v), v, vocab);
    top_key = key > top_key ? key : top_key;
  }
  top_key = block_max(top_key, s);
  const uint32_t top = rank_key_id(top_key, vocab);
  if (f.greedy) {
    if (threadIdx.x == 0) out[row] = top;
    return;
  }
  const float z_top = z_of(top);
  const float bound = f_add(z_top, gumbel_noise(seed, position, top));
  const bool select = f.top_k || f.top_p;

  // 2. Total mass, candidates, first digit.
  if (threadIdx.x == 0) s.cand_count = 0;
  clear_histogram(s);
  __syncthreads();
  uint64_t mass_sum = 0;
  for (uint32_t v = threadIdx.x; v < vocab; v += kThreads) {
    const float z = z_of(v);
    const uint32_t mass = f.top_p ? mass_units(relative_prob(z, z_top)) : 0u;
    mass_sum += mass;
    if (!may_win(z, bound)) continue;
    const uint32_t slot = atomicAdd(&s.cand_count, 1u);
    if (slot < kCandidates) {
      s.cand_z[slot] = z;
      s.cand_id[slot] = v;
    }
    if (select) add_to_histogram(s, static_cast<uint32_t>(rank_key(z, v, vocab) >> 56), mass);
  }
  const uint64_t total_mass = block_sum(mass_sum, s);  // its barriers also publish the list and the histogram
  const uint32_t count = s.cand_count;
  const bool listed = count <= static_cast<uint32_t>(kCandidates);
  auto for_each_candidate = [&](auto&& fn) {
    if (listed) {
      for (uint32_t i = threadIdx.x; i < count; i += kThreads) fn(s.cand_z[i], s.cand_id[i]);
    } else {
      for (uint32_t v = threadIdx.x; v < vocab; v += kThreads) {
        const float z = z_of(v);
        if (may_win(z, bound)) fn(z, v);
      }
    }
  };

  // 3. The kept prefix: rank key >= boundary.
  uint64_t boundary = 0;
  if (select) {
    const double limit = f.top_p ? top_p_limit(f.top_p_value, total_mass) : INFINITY;
    const int id_bits = vocab > 1 ? 32 - __clz(vocab - 1u) : 0;
    const int top_id_shift = id_bits > 0 ? ((id_bits - 1) / 8) * 8 : -1;  // higher id digits are 0 for every token
    uint64_t prefix = 0, cum_mass = 0;
    uint32_t cum_count = 0;
    for (int shift = 56;;) {
      if (threadIdx.x < 32) choose_bin(s, cum_count, cum_mass, f.rank_limit, limit);
      __syncthreads();
      if (!s.found) {  // the whole range is kept (level 0: every candidate)
        boundary = prefix;
        break;
      }
      prefix |= static_cast<uint64_t>(s.digit) << shift;
      cum_count = s.cum_count;
      cum_mass = s.cum_mass;
      const uint32_t bin_count = s.bin_count;
      const int next = shift == 32 ? top_id_shift : shift - 8;
      if (bin_count == 1 || next < 0) {  // one candidate left in the range: the last kept one
        boundary = prefix;
        break;
      }
      shift = next;
      __syncthreads();  // everyone has read the choice and the histogram
      clear_histogram(s);
      __syncthreads();
      const uint64_t high = prefix >> (shift + 8);
      for_each_candidate([&](float z, uint32_t v) {
        const uint64_t key = rank_key(z, v, vocab);
        if ((key >> (shift + 8)) != high) return;
        add_to_histogram(s, static_cast<uint32_t>(key >> shift) & 0xFFu,
                         f.top_p ? mass_units(relative_prob(z, z_top)) : 0u);
      });
      __syncthreads();
    }
  }

  // 4. The draw.
  uint64_t best = 0;
  for_each_candidate([&](float z, uint32_t v) {
    if (rank_key(z, v, vocab) < boundary) return;
    if (f.min_p && v != top && !(relative_prob(z, z_top) >= f.min_p_value)) return;
    const uint64_t key = draw_key(f_add(z, gumbel_noise(seed, position, v)), v, vocab);
    best = key > best ? key : best;
  });
  best = block_max(best, s);
  if (threadIdx.x == 0) out[row] = rank_key_id(best, vocab);
}

at::Tensor ddtree_sample_targets_cuda(const at::Tensor& logits_in,        // [B*T, V] float32 | bf16 | fp16
                                      const at::Tensor& positions_in,     // [B, T] int64
                                      const at::Tensor& temperatures_in,  // [B] or [B, 1] float32
                                      const at::Tensor& top_ks_in,        // [B] int32 | int64
                                      const at::Tensor& top_ps_in,        // [B] float32
                                      const at::Tensor& min_ps_in,        // [B] float32
                                      const at::Tensor& seeds_in) {       // [B] int64
  constexpr const char* op = "ddtree_sample_targets";
  const SampleTargetsDims dims = check_sample_targets_args(logits_in, positions_in, temperatures_in, top_ks_in,
                                                           top_ps_in, min_ps_in, seeds_in);
  cuda::check_verified(op, op, "", logits_in.get_device());  // the gate (verified_families.h)
  const c10::cuda::CUDAGuard guard(logits_in.device());
  const SampleTargetsInputs in = sample_targets_inputs(logits_in, positions_in, temperatures_in, top_ks_in, top_ps_in,
                                                       min_ps_in, seeds_in);
  if (cuda_value_checks_wanted()) check_sample_targets_values(in);
  at::Tensor out = at::empty({dims.batch, dims.nodes}, logits_in.options().dtype(at::kLong));
  const int64_t rows = dims.batch * dims.nodes;
  if (rows == 0) return out;
  TORCH_CHECK(rows <= INT_MAX && dims.nodes <= INT_MAX, op, ": B*T must be < 2^31, got ", rows);
  const SampleParamsPtrs params{in.positions.const_data_ptr<int64_t>(), in.temperatures.const_data_ptr<float>(),
                                in.top_ks.const_data_ptr<int64_t>(),    in.top_ps.const_data_ptr<float>(),
                                in.min_ps.const_data_ptr<float>(),      in.seeds.const_data_ptr<int64_t>()};
  auto launch = [&](auto* logits) {
    using scalar_t = std::remove_const_t<std::remove_pointer_t<decltype(logits)>>;
    sample_targets_kernel<scalar_t><<<static_cast<unsigned>(rows), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        logits, in.logits.stride(0), params, out.data_ptr<int64_t>(), static_cast<int>(dims.nodes),
        static_cast<uint32_t>(dims.vocab));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  switch (in.logits.scalar_type()) {
    case at::kFloat: launch(in.logits.const_data_ptr<float>()); break;
    case at::kBFloat16: launch(in.logits.const_data_ptr<at::BFloat16>()); break;
    default: launch(in.logits.const_data_ptr<at::Half>()); break;  // the checks admit these three
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kdtree, CUDA, m) { m.impl("ddtree_sample_targets", &ddtree_sample_targets_cuda); }

}  // namespace kdtree
