"""The DDTree round's CUDA kernels where the CPU suite's shapes do not reach: commit_kv's column tiles and its grid
stride (rows of up to a megabyte, fp8 and uint8 caches), a tree build with more than 48 KB of shared memory inside a
captured graph (the opt-in raised once per device, replays with new log-probs), and a whole round of 1024 nodes
(the verify op's largest tree, 32 mask words) as one CUDA graph, lossless against greedy decoding."""

from __future__ import annotations

import pytest
import torch

from kdtree_ops.ddtree import ops as ddtree
from kdtree_ops.ddtree.loop import MAX_VERIFY_BUDGET
from kdtree_ops.ddtree.reference import build_tree_heap, commit_kv_reference
from test_ddtree_loop import check_lossless, dtype_for
from test_ddtree_ops import drafter_topk

pytestmark = pytest.mark.cuda


def commit_inputs(batch, nodes, entries, slots, seed):
    """Accepted paths (node 0, then increasing picks) of random lengths, sources and destinations disjoint."""
    g = torch.Generator().manual_seed(seed)
    accepted = torch.full((batch, entries), -1, dtype=torch.int32)
    for b in range(batch):
        length = int(torch.randint(entries // 2, entries, (), generator=g))
        picks = sorted(torch.randperm(nodes - 1, generator=g)[:length].add(1).tolist())
        accepted[b, :length + 1] = torch.tensor([0] + picks, dtype=torch.int32)
    perm = torch.randperm(slots, generator=g)
    node_slots = perm[:batch * nodes].view(batch, nodes)
    dest_slots = perm[batch * nodes:batch * (nodes + entries)].view(batch, entries)
    return accepted.cuda(), node_slots.cuda(), dest_slots.cuda()


# (name, dtype, (dim,) or (heads, dim) of a slot, B, T, D+1): the copy unit is the widest power of two dividing pointers,
# strides and row bytes; staging is 16 KB, so tile_units = 16 KB / ((D+1) * unit).
COMMIT_SHAPES = [
    # 72 units of 16 bytes a row, 17 entries: 60-unit tiles, two of them per row.
    ("mla_bf16_two_tiles", torch.bfloat16, (576,), 3, 40, 17),
    # fp8 MLA rows (576 bytes), 1024 entries: one unit a tile, 36 tiles.
    ("mla_fp8_1024_entries", torch.float8_e4m3fn, (576,), 2, 1100, 1024),
    # uint8 rows of 8 heads x 129 bytes: a one-byte unit, odd rows.
    ("uint8_odd_rows", torch.uint8, (8, 129), 4, 50, 20),
    # 65,537 units of 16 bytes a row with one-unit tiles: more tiles than the grid's 65,535, the grid-stride loop.
    ("grid_stride_1mb_rows", torch.bfloat16, (1, 524296), 1, 2100, 1024),
]


@pytest.mark.parametrize("name, dtype, row, batch, nodes, entries", COMMIT_SHAPES, ids=[c[0] for c in COMMIT_SHAPES])
def test_commit_kv_tiles_and_grid_stride(name, dtype, row, batch, nodes, entries):
    heads, dim = (1, row[0]) if len(row) == 1 else row
    slots = batch * (nodes + entries) + 7
    accepted, node_slots, dest_slots = commit_inputs(batch, nodes, entries, slots, seed=len(name))
    values = torch.randint(0, 255, (slots, heads, dim), dtype=torch.uint8, device="cuda")
    cache = values if dtype == torch.uint8 else values.view(torch.uint8).to(torch.float32).sub(127).to(dtype)
    bits = (lambda t: t.view(torch.uint8)) if cache.element_size() == 1 else (lambda t: t.view(torch.int16))
    want = bits(cache).clone()
    commit_kv_reference(want, None, accepted, node_slots, dest_slots)
    ddtree.commit_kv(cache, None, accepted, node_slots, dest_slots)
    assert torch.equal(bits(cache), want)  # bits: every destination row, and nothing else, moved
    assert (accepted >= 0).sum() > entries // 2


def test_commit_kv_with_v_cache_fp8_strided():
    """K and V apart, fp8, V's heads strided inside a wider buffer."""
    batch, nodes, entries = 3, 64, 17
    slots = batch * (nodes + entries) + 3
    accepted, node_slots, dest_slots = commit_inputs(batch, nodes, entries, slots, seed=5)
    k = torch.randn(slots, 2, 128, device="cuda").to(torch.float8_e5m2)
    v = torch.randn(slots, 4, 160, device="cuda").to(torch.float8_e5m2)[:, ::2, :128]
    want_k, want_v = k.view(torch.uint8).clone(), v.view(torch.uint8).clone()
    commit_kv_reference(want_k, want_v, accepted, node_slots, dest_slots)
    ddtree.commit_kv(k, v, accepted, node_slots, dest_slots)
    assert torch.equal(k.view(torch.uint8), want_k) and torch.equal(v.view(torch.uint8), want_v)


def test_build_tree_past_48kb_inside_a_graph():
    """K = 16, top-32, budget 1800: 16 * 32 * 4 + 28 * 1801 = 52 KB of shared memory, captured and replayed with
    new log-probs (exact ties among them), each replay equal to the heap reference."""
    batch, positions, top_k, budget = 3, 16, 32, 1800
    logprobs, tokens, roots = (t.cuda() for t in drafter_topk(batch, positions, top_k, ties=True, seed=1))
    ddtree.build_tree(logprobs, tokens, roots, budget)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = ddtree.build_tree(logprobs, tokens, roots, budget)
    for seed in range(2, 5):
        new = drafter_topk(batch, positions, top_k, ties=seed % 2 == 0, seed=seed)
        for buffer, value in zip((logprobs, tokens, roots), new):
            buffer.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(outputs, build_tree_heap(*new, budget)):
            assert torch.equal(got.cpu(), want.cpu()), f"replay with seed {seed}"


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_a_round_of_1024_nodes_in_one_graph(layout):
    """budget 1023: trees of the verify op's largest size (32 mask words), the whole round one CUDA graph."""
    check_lossless("cuda", dtype_for("cuda"), True, layout, MAX_VERIFY_BUDGET)
