// The tile loop of MLA with V in K on wgmma (paired tiles): the two math warpgroups take the KV tiles in
// turns, each computing S and the softmax of its own tile and handing its P to the other through the tile's
// columns past Dv; a gathering warpgroup fills the two K buffers (produce_tiles, tree_verify_loads.cuh).
#pragma once

#include "tree_verify_cta.cuh"

namespace kdtree::cuda {

// The KV tiles of a segment with paired tiles (MLA on the wgmma path). Both math warpgroups hold the same 64
// rows and each owns 256 of O's columns. They take the segment's tiles in pairs (A, B): warpgroup 0 computes
// S of A and its softmax, warpgroup 1 those of B (a missing last B is all zeros, masked out), and each puts
// its P in its tile's columns past Dv (which S has finished with) with the tile's reference maxima (s_ref):
// A's from the previous pair's, B's from A's. Each warpgroup moves its O to A's reference and adds A's P V,
// then to B's and adds B's P V (both from shared memory, so the two sides issue the same PV GEMMs). So a tile
// goes back to the copiers as soon as both have multiplied it, and the copies of the next A overlap B's
// softmax and GEMMs. Tile t of the CTA is in buffer t % 2 (tiles_before is even), filled by the gathering
// warpgroup.
template <class C>
__device__ inline void TreeVerifyCta<C>::run_tiles_paired(const RequestInfo& r, int h, int m0, int kt0, int kt1,
                                                          int tiles_before,
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

}  // namespace kdtree::cuda
