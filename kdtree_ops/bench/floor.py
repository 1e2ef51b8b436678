"""The roofline floor of one tree-verify call: what no kernel can beat on the measured machine.

    floor = max(bytes / read_bandwidth, flops / matmul_rate)

bytes — every tensor the call must touch, moved once:
    q (N·Hq·Dqk) + output (N·Hq·Dv) elements of q's dtype
    + K and V of every request's prefix and tree: Σ_b (L_b + T_b)·Hkv·(Dqk + Dv) elements, or
      Σ_b (L_b + T_b)·Hkv·Dqk when V is a view of K (MLA: the latent row is read once), at the cache's element
      size (1 byte for fp8), the tree rows at q's when k_draft/v_draft carry them
    + 4 bytes per kv index and per tree-mask word (N·W).
  read_bandwidth is a read stream's (ceilings.py): the call reads far more than it writes.
flops — the two matmuls over the full prefix plus the whole tree tile of each request, as a kernel that
  computes the tree tile densely does (masked ancestor-only entries are a few percent at most):
    2 · Hq · Σ_b T_b·(L_b + T_b) · (Dqk + Dv)
  matmul_rate is bf16 8192³ torch.matmul (ceilings.py).
"""

from __future__ import annotations

__all__ = ["call_bytes", "call_flops", "floor_us"]


def call_bytes(case) -> int:
    """Bytes the call must move once (see the module docstring)."""
    n, hq, dqk = case.q.shape
    hkv, dv = case.v_cache.shape[1], case.v_cache.shape[2]
    elem, kv_elem = case.q.element_size(), case.k_cache.element_size()
    v_aliases_k = case.v_cache.data_ptr() == case.k_cache.data_ptr()
    row_elems = hkv * (dqk if v_aliases_k else dqk + dv)
    prefix_rows, tree_rows = sum(case.prefix_lens), sum(case.tree_sizes)
    tree_elem = elem if case.k_draft is not None else kv_elem
    kv_bytes = row_elems * (prefix_rows * kv_elem + tree_rows * tree_elem)
    indices = prefix_rows + (0 if case.k_draft is not None else tree_rows)
    return elem * (n * hq * dqk + n * hq * dv) + kv_bytes + 4 * (indices + n * case.tree_mask.shape[1])


def call_flops(case) -> int:
    """FLOPs of the two matmuls over prefix + whole tree tile (see the module docstring)."""
    _, hq, dqk = case.q.shape
    dv = case.v_cache.shape[2]
    pairs = sum(t * (t + l) for t, l in zip(case.tree_sizes, case.prefix_lens))
    return 2 * hq * pairs * (dqk + dv)


def floor_us(case, read_bytes_per_s: float, matmul_flops_per_s: float) -> dict:
    """{bytes, flops, memory_us, compute_us, floor_us, bound} for one call on the measured machine."""
    nbytes, flops = call_bytes(case), call_flops(case)
    memory_us = nbytes / read_bytes_per_s * 1e6
    compute_us = flops / matmul_flops_per_s * 1e6
    return {
        "bytes": nbytes,
        "flops": flops,
        "memory_us": memory_us,
        "compute_us": compute_us,
        "floor_us": max(memory_us, compute_us),
        "bound": "memory" if memory_us >= compute_us else "compute",
    }
