// Runs build_levels_kernel (csrc/cuda/ddtree_build_levels.cu, extracted into levels_kernel.h by
// compile_tests/test_ddtree_levels_emulated.py) on the host under simt.h. stdin: "B K k budget\n", then logprobs
// [B, K, k] float32, tokens [B, K, k] int64, root_tokens [B] int64, raw. stdout: tree_tokens, parents, depths and
// tree_mask, raw, the op's shapes. Outputs and shared memory start poisoned.
#include <cstdio>
#include <type_traits>
#include <vector>

#include "levels_kernel.h"

int main() {
  using namespace kdtree::cuda;
  int batch, positions, top_k, budget;
  if (std::scanf("%d %d %d %d\n", &batch, &positions, &top_k, &budget) != 4) return 2;
  const int lp_count = positions * top_k, nodes = budget + 1, words = (nodes + 31) / 32;
  std::vector<float> logprobs(static_cast<size_t>(batch) * lp_count);
  std::vector<int64_t> tokens(logprobs.size()), roots(batch);
  if (std::fread(logprobs.data(), 4, logprobs.size(), stdin) != logprobs.size() ||
      std::fread(tokens.data(), 8, tokens.size(), stdin) != tokens.size() ||
      std::fread(roots.data(), 8, roots.size(), stdin) != roots.size())
    return 3;
  std::vector<int64_t> tree_tokens(static_cast<size_t>(batch) * nodes, -7777);
  std::vector<int32_t> parents(tree_tokens.size(), -7777), depths(tree_tokens.size(), -7777);
  std::vector<int32_t> mask(tree_tokens.size() * words, -7777);
  const int threads = budget <= 256 ? 256 : 1024;  // as launch_build_tree_levels picks
  std::vector<char> smem(LevelsSmem::bytes(lp_count, capacity_for(budget), threads) + 16, static_cast<char>(0xAB));
  g_dynamic_smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem.data()) + 15) / 16 * 16);
  auto run = [&](auto threads_constant) {
    constexpr int kThreads = decltype(threads_constant)::value;
    simt::launch(batch, kThreads, [&] {
      build_levels_kernel<kThreads>(logprobs.data(), tokens.data(), roots.data(), tree_tokens.data(), parents.data(),
                                    depths.data(), mask.data(), positions, top_k, nodes, words);
    });
  };
  if (threads == 256) run(std::integral_constant<int, 256>{});
  else run(std::integral_constant<int, 1024>{});
  std::fwrite(tree_tokens.data(), 8, tree_tokens.size(), stdout);
  std::fwrite(parents.data(), 4, parents.size(), stdout);
  std::fwrite(depths.data(), 4, depths.size(), stdout);
  std::fwrite(mask.data(), 4, mask.size(), stdout);
  return 0;
}
