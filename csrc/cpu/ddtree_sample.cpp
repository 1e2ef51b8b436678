// CPU implementation of ddtree_sample_targets (schema in csrc/ops.cpp, semantics in kdtree_ops/ddtree/sampling.py,
// arithmetic in csrc/ddtree_sample_math.h). Rows are independent: at::parallel_for over them.
//
// Per row: the scaled logits z, the most likely token (rank 0); its noisy score is a lower bound on the winner's, so
// only tokens that may still beat it (the candidates, a prefix of the rank order) need their noise and their place
// in the top-k/top-p prefix. The candidates are sorted by rank, the prefix walked, and the kept candidates drawn.
// The CUDA kernel finds the same prefix by radix selection instead of a sort; the kept set and the draw are
// defined by ranks and integer masses, so both give the same token.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "ddtree_sample_args.h"
#include "ddtree_sample_math.h"

namespace kdtree {
namespace {

using namespace kdtree::sample;

struct RowParams {
  SampleFilters filters;
  float temperature;
  uint64_t seed;
  uint32_t position;
};

// One row: logits [V] -> the drawn token. `z` and `candidates` are scratch buffers reused across rows.
template <typename scalar_t>
int64_t sample_row(const scalar_t* logits, uint32_t vocab, const RowParams& p, std::vector<float>& z,
                   std::vector<uint64_t>& candidates) {
  const SampleFilters& f = p.filters;
  z.resize(vocab);
  uint64_t best_rank = 0;
  for (uint32_t v = 0; v < vocab; ++v) {
    z[v] = scaled_logit(static_cast<float>(logits[v]), p.temperature, f.greedy);
    best_rank = std::max(best_rank, rank_key(z[v], v, vocab));
  }
  const uint32_t top = rank_key_id(best_rank, vocab);
  if (f.greedy) return top;
  const float z_top = z[top];
  const float bound = f_add(z_top, gumbel_noise(p.seed, p.position, top));

  candidates.clear();  // rank keys of the tokens that may beat the most likely one's score
  uint64_t total_mass = 0;
  for (uint32_t v = 0; v < vocab; ++v) {
    if (f.top_p) total_mass += mass_units(relative_prob(z[v], z_top));
    if (may_win(z[v], bound)) candidates.push_back(rank_key(z[v], v, vocab));
  }
  // The kept prefix of the rank order: rank < top_k, and the mass ranked before <= top_p x total (rank 0 always).
  // Candidates are a prefix of the rank order, so their ranks and the masses before them are the row's own.
  size_t kept = candidates.size();
  if (f.top_k || f.top_p) {
    std::sort(candidates.begin(), candidates.end(), [](uint64_t a, uint64_t b) { return a > b; });
    const double limit = f.top_p ? top_p_limit(f.top_p_value, total_mass) : 0.0;
    uint64_t before = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const bool keep = i < f.rank_limit && (!f.top_p || static_cast<double>(before) <= limit);
      if (!keep) {
        kept = i;
        break;
      }
      if (f.top_p) before += mass_units(relative_prob(z[rank_key_id(candidates[i], vocab)], z_top));
    }
  }
  uint64_t best_draw = 0;
  bool any = false;
  for (size_t i = 0; i < kept; ++i) {
    const uint32_t v = rank_key_id(candidates[i], vocab);
    if (f.min_p && v != top && !(relative_prob(z[v], z_top) >= f.min_p_value)) continue;
    const uint64_t key = draw_key(f_add(z[v], gumbel_noise(p.seed, p.position, v)), v, vocab);
    if (!any || key > best_draw) best_draw = key;
    any = true;
  }
  return rank_key_id(best_draw, vocab);  // the most likely token is a kept candidate: `any` holds
}

at::Tensor ddtree_sample_targets_cpu(const at::Tensor& logits_in,        // [B*T, V] float32 | bf16 | fp16
                                     const at::Tensor& positions_in,     // [B, T] int64
                                     const at::Tensor& temperatures_in,  // [B] or [B, 1] float32
                                     const at::Tensor& top_ks_in,        // [B] int32 | int64
                                     const at::Tensor& top_ps_in,        // [B] float32
                                     const at::Tensor& min_ps_in,        // [B] float32
                                     const at::Tensor& seeds_in) {       // [B] int64
  const SampleTargetsDims dims = check_sample_targets_args(logits_in, positions_in, temperatures_in, top_ks_in,
                                                           top_ps_in, min_ps_in, seeds_in);
  const SampleTargetsInputs in = sample_targets_inputs(logits_in, positions_in, temperatures_in, top_ks_in, top_ps_in,
                                                       min_ps_in, seeds_in);
  check_sample_targets_values(in);
  at::Tensor out = at::empty({dims.batch, dims.nodes}, logits_in.options().dtype(at::kLong));
  const int64_t rows = dims.batch * dims.nodes;
  if (rows == 0) return out;
  const auto vocab = static_cast<uint32_t>(dims.vocab);
  const int64_t row_stride = in.logits.stride(0);
  const int64_t* positions = in.positions.const_data_ptr<int64_t>();
  const float* temperatures = in.temperatures.const_data_ptr<float>();
  const int64_t* top_ks = in.top_ks.const_data_ptr<int64_t>();
  const float* top_ps = in.top_ps.const_data_ptr<float>();
  const float* min_ps = in.min_ps.const_data_ptr<float>();
  const int64_t* seeds = in.seeds.const_data_ptr<int64_t>();
  int64_t* tokens = out.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.logits.scalar_type(), "ddtree_sample_targets", [&] {
    const scalar_t* logits = in.logits.const_data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> z;
      std::vector<uint64_t> candidates;
      for (int64_t r = begin; r < end; ++r) {
        const int64_t b = r / dims.nodes;
        const RowParams p{sample_filters(temperatures[b], top_ks[b], top_ps[b], min_ps[b], dims.vocab),
                          temperatures[b], static_cast<uint64_t>(seeds[b]), static_cast<uint32_t>(positions[r])};
        tokens[r] = sample_row(logits + r * row_stride, vocab, p, z, candidates);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kdtree, CPU, m) { m.impl("ddtree_sample_targets", &ddtree_sample_targets_cpu); }

}  // namespace kdtree
