"""The DDTree round's ops (kdtree_ops/ddtree/ops.py) against their plain-Python references
(kdtree_ops/ddtree/reference.py) on fresh random inputs, literal cases pinned by hand, opcheck, torch.compile
(one opaque node per op, no graph breaks) and bad inputs (on CUDA each case in its own process).

The same tests run on every device in DEVICES: the CPU here, the GPU where one is present.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor.utils import run_and_get_code

import kdtree_ops.ops as ops
from kdtree_ops.ddtree import ops as ddtree
from kdtree_ops.ddtree.reference import (accept_greedy_reference, build_tree_bruteforce, build_tree_heap,
                                         commit_kv_reference)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DEVICE_PARAMS = [pytest.param(d, marks=pytest.mark.cuda) if d == "cuda" else d for d in DEVICES]
POISON = -7777  # written into outputs' memory before a run where the op could leave it unwritten


def drafter_topk(batch, positions, top_k, *, ties=False, vocab=50, seed=0, device="cpu"):
    """(logprobs [B, K, k] float32 sorted descending, tokens [B, K, k] int64, root_tokens [B] int64).

    ties=True rounds the log-probs to multiples of 0.5, so equal values within a row and equal path scores
    across depths and parents are common; a small vocab gives duplicate tokens.
    """
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, positions, max(top_k, 1) * 2, generator=gen) * 2
    logprobs = torch.log_softmax(logits, -1).topk(top_k, dim=-1).values if top_k else torch.zeros(batch, positions, 0)
    if ties:
        logprobs = (logprobs * 2).round() / 2
    logprobs = logprobs.sort(-1, descending=True).values.contiguous()
    tokens = torch.randint(0, vocab, (batch, positions, top_k), generator=gen)
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    return logprobs.to(device), tokens.to(device), roots.to(device)


def path_count(positions, top_k):
    return sum(top_k**d for d in range(1, positions + 1))


def assert_trees_equal(got, want):
    for name, g, w in zip(("tree_tokens", "parents", "depths", "tree_mask"), got, want):
        assert torch.equal(g.cpu(), w.cpu()), f"{name} differs:\n{g}\n{w}"


# (B, K, k, budget or None for all paths, ties): small shapes for the brute-force oracle.
SMALL_BUILDS = [(1, 1, 1, None, False), (2, 2, 2, None, False), (3, 3, 2, 9, True), (2, 2, 3, None, True),
                (1, 4, 2, 20, True), (2, 3, 3, 0, False), (4, 2, 4, 11, True), (1, 3, 1, None, True),
                (2, 5, 2, 40, True), (1, 2, 5, 30, True)]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("shape", SMALL_BUILDS, ids=[str(s) for s in SMALL_BUILDS])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_build_tree_matches_bruteforce(shape, seed, device):
    batch, positions, top_k, budget, ties = shape
    budget = path_count(positions, top_k) if budget is None else budget
    args = drafter_topk(batch, positions, top_k, ties=ties, vocab=4, seed=seed, device=device)
    got = ddtree.build_tree(*args, budget)
    assert_trees_equal(got, build_tree_bruteforce(*[a.cpu() for a in args], budget))
    assert all(t.device.type == device for t in got)


# The benchmark's shapes and beyond: K = 16, top-k 8 and 32, budgets up to 1024, against the heap.
LARGE_BUILDS = [(2, 16, 8, 256, False), (1, 16, 32, 1024, False), (3, 16, 8, 1024, True), (2, 8, 32, 300, True),
                (1, 16, 1, 16, False), (2, 4, 3, 120, True)]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("shape", LARGE_BUILDS, ids=[str(s) for s in LARGE_BUILDS])
def test_build_tree_matches_heap(shape, device):
    batch, positions, top_k, budget, ties = shape
    args = drafter_topk(batch, positions, top_k, ties=ties, seed=budget, device=device)
    assert_trees_equal(ddtree.build_tree(*args, budget), build_tree_heap(*[a.cpu() for a in args], budget))


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_build_tree_all_equal_logprobs_and_minus_inf(device):
    """Every score ties (and -inf ties too): the order is depth, then rank tuple, for the whole tree."""
    logprobs = torch.full((2, 3, 3), -1.0)
    logprobs[1, :, 1:] = float("-inf")
    tokens = torch.arange(18).reshape(2, 3, 3)
    roots = torch.tensor([100, 200])
    budget = path_count(3, 3)
    args = [t.to(device) for t in (logprobs, tokens, roots)]
    got = ddtree.build_tree(*args, budget)
    assert_trees_equal(got, build_tree_bruteforce(logprobs, tokens, roots, budget))
    assert got[2][0].tolist() == [0] + [1] * 3 + [2] * 9 + [3] * 27


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_build_tree_literal_cases(device):
    """K = 2, k = 2, written out by hand."""
    # Request 0: distinct scores. Paths: (0) -.1, (0,0) -.3, (0,1) -.6, (1) -1, (1,0) -1.2, (1,1) -1.5.
    # Request 1: (0) 0, then (1) and (0,0) tie at -1 (shallower first), (0,1) and (1,0) tie at -2 (lexicographic).
    logprobs = torch.tensor([[[-0.1, -1.0], [-0.2, -0.5]], [[0.0, -1.0], [-1.0, -2.0]]])
    tokens = torch.tensor([[[10, 11], [20, 21]], [[30, 31], [40, 40]]])  # request 1 has a duplicate token
    roots = torch.tensor([7, 8])
    args = [t.to(device) for t in (logprobs, tokens, roots)]
    tree_tokens, parents, depths, mask = ddtree.build_tree(*args, 6)
    assert tree_tokens.tolist() == [[7, 10, 20, 21, 11, 20, 21], [8, 30, 31, 40, 40, 40, 40]]
    assert parents.tolist() == [[-1, 0, 1, 1, 0, 4, 4], [-1, 0, 0, 1, 1, 2, 2]]
    assert depths.tolist() == [[0, 1, 2, 2, 1, 2, 2], [0, 1, 1, 2, 2, 2, 2]]
    # Ancestor rows (self included) as bit patterns of node indices.
    assert mask[:7, 0].tolist() == [0b1, 0b11, 0b111, 0b1011, 0b10001, 0b110001, 0b1010001]
    assert mask[7:, 0].tolist() == [0b1, 0b11, 0b101, 0b1011, 0b10011, 0b100101, 0b1000101]
    tree_tokens, parents, depths, mask = ddtree.build_tree(*args, 3)  # truncated: the first three paths
    assert parents.tolist() == [[-1, 0, 1, 1], [-1, 0, 0, 1]] and mask.shape == (8, 1)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("budget", [0, 31, 32, 33, 100])
def test_build_tree_mask_is_tree_mask_from_parents(budget, device):
    batch = 3
    args = drafter_topk(batch, 6, 4, ties=True, seed=budget, device=device)
    _, parents, _, mask = ddtree.build_tree(*args, budget)
    nodes = budget + 1
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * nodes
    expected = ops.tree_mask_from_parents(parents.flatten(), qo_indptr, (nodes + 31) // 32)
    assert mask.shape == expected.shape and torch.equal(mask, expected)


def random_accept_case(batch, tree_budget, *, pad=0, match=0.7, seed=0, device="cpu"):
    """A built tree (small vocab: duplicate sibling tokens), target tokens that follow a child with probability
    `match`, and `pad` padding nodes (parent -1) appended to every request."""
    gen = torch.Generator().manual_seed(seed)
    tree_tokens, parents, _, _ = ddtree.build_tree(*drafter_topk(batch, 6, 3, vocab=3, seed=seed), tree_budget)
    target = torch.randint(0, 3, tree_tokens.shape, generator=gen)
    for b in range(batch):
        for node in range(tree_tokens.shape[1]):
            children = (parents[b] == node).nonzero().flatten()
            if len(children) and torch.rand((), generator=gen) < match:
                target[b, node] = tree_tokens[b, children[torch.randint(len(children), (), generator=gen)]]
    if pad:
        tree_tokens = torch.cat([tree_tokens, torch.randint(0, 3, (batch, pad), generator=gen)], 1)
        parents = torch.cat([parents, torch.full((batch, pad), -1, dtype=torch.int32)], 1)
        target = torch.cat([target, torch.randint(0, 3, (batch, pad), generator=gen)], 1)
    return [t.to(device) for t in (tree_tokens, parents, target)]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("batch,budget,pad,max_depth", [(1, 0, 0, 6), (4, 20, 0, 6), (3, 60, 5, 6), (5, 200, 0, 3),
                                                        (2, 40, 3, 0), (8, 100, 1, 10)])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_accept_greedy_matches_reference(batch, budget, pad, max_depth, seed, device):
    case = random_accept_case(batch, budget, pad=pad, seed=seed, device=device)
    got = ddtree.accept_greedy(*case, max_depth)
    want = accept_greedy_reference(*[t.cpu() for t in case], max_depth)
    for name, g, w in zip(("accepted", "accept_len", "next_tokens"), got, want):
        assert g.device.type == device and torch.equal(g.cpu(), w), f"{name}: {g} != {w}"


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_accept_greedy_literal(device):
    # Nodes:          0   1   2   3   4   5   6   (5 is padding: parent -1)
    tree_tokens = [[5, 11, 12, 12, 13, 12, 14]]
    parents = [[-1, 0, 0, 0, 2, -1, 4]]
    target = [[12, 0, 13, 0, 14, 0, 99]]  # root -> first child with 12 is node 2 (not 3), -> 4 -> 6, bonus 99
    args = [torch.tensor(t, device=device, dtype=torch.int32 if i == 1 else torch.int64)
            for i, t in enumerate((tree_tokens, parents, target))]
    accepted, length, bonus = ddtree.accept_greedy(*args, 4)
    assert accepted.tolist() == [[0, 2, 4, 6, -1]] and length.tolist() == [3] and bonus.tolist() == [99]
    accepted, length, bonus = ddtree.accept_greedy(*args, 2)  # stops at max_depth: the bonus is node 4's target
    assert accepted.tolist() == [[0, 2, 4]] and length.tolist() == [2] and bonus.tolist() == [14]
    args[2][0, 0] = 77  # nothing matches at the root
    accepted, length, bonus = ddtree.accept_greedy(*args, 4)
    assert accepted.tolist() == [[0, -1, -1, -1, -1]] and length.tolist() == [0] and bonus.tolist() == [77]


def commit_case(batch, nodes, entries, *, dtype=torch.float32, layout="plain", seed=0, device="cpu"):
    """Caches, accepted rows (contiguous prefixes of a path, -1 padded) and slots in the common layout:
    request b's tree sits at prefix_b + node, accepted entry d goes to prefix_b + d."""
    gen = torch.Generator().manual_seed(seed)
    prefixes = [int(x) for x in torch.randint(0, 5, (batch,), generator=gen)]
    starts = [sum(prefixes[:b]) + b * nodes for b in range(batch)]
    slots = starts[-1] + prefixes[-1] + nodes + 3 if batch else 4
    node_slots = torch.tensor([[starts[b] + prefixes[b] + i for i in range(nodes)] for b in range(batch)],
                              dtype=torch.int64).reshape(batch, nodes)
    dest_slots = torch.tensor([[starts[b] + prefixes[b] + d for d in range(entries)] for b in range(batch)],
                              dtype=torch.int64).reshape(batch, entries)
    accepted = torch.full((batch, entries), -1, dtype=torch.int32)
    for b in range(batch):
        length = int(torch.randint(0, entries, (), generator=gen))
        picks = sorted(torch.randperm(nodes - 1, generator=gen)[:length].add(1).tolist())
        accepted[b, :length + 1] = torch.tensor([0] + picks, dtype=torch.int32)
    k_cache = torch.randn(slots, 2, 8, generator=gen).to(dtype)
    v_cache = torch.randn(slots, 2, 4, generator=gen).to(dtype)
    if layout == "strided":  # K rows inside a wider buffer, V's heads strided
        k_cache = torch.randn(slots, 3, 8, generator=gen).to(dtype)[:, 1:]
        v_cache = torch.randn(slots, 2, 6, generator=gen).to(dtype)[:, :, :4]
    if layout == "mla":
        v_cache = None
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(k_cache), to(v_cache), to(accepted), to(node_slots), to(dest_slots)


COMMIT_CASES = [(3, 9, 5, torch.float32, "plain"), (4, 17, 8, torch.bfloat16, "plain"), (2, 12, 6, torch.float16,
                "strided"), (3, 10, 4, torch.bfloat16, "mla"), (1, 1, 1, torch.float32, "plain"), (0, 4, 3,
                torch.float32, "plain")]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("case", COMMIT_CASES, ids=[f"{c[0]}x{c[1]}-{c[2]}-{c[3]}-{c[4]}" for c in COMMIT_CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_commit_kv_matches_reference(case, seed, device):
    batch, nodes, entries, dtype, layout = case
    k_cache, v_cache, accepted, node_slots, dest_slots = commit_case(batch, nodes, entries, dtype=dtype,
                                                                     layout=layout, seed=seed, device=device)
    k_before = k_cache.clone()
    k_want, v_want = k_cache.clone(), None if v_cache is None else v_cache.clone()
    commit_kv_reference(k_want, v_want, accepted.cpu(), node_slots.cpu(), dest_slots.cpu())
    ddtree.commit_kv(k_cache, v_cache, accepted, node_slots, dest_slots)
    assert torch.equal(k_cache, k_want) and (v_cache is None or torch.equal(v_cache, v_want))
    written = dest_slots[accepted >= 0].flatten().cpu()
    untouched = torch.ones(k_cache.shape[0], dtype=torch.bool)
    untouched[written] = False
    assert torch.equal(k_cache.cpu()[untouched], k_before.cpu()[untouched])  # no row but the destinations moved
    if batch and (accepted > 0).any():  # the case moves something: a commit that did nothing would fail above
        assert not torch.equal(k_cache, k_before)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_commit_kv_destination_is_another_entrys_source(device):
    """Entry 0 reads slot 2, which entry 1 writes; entry 1 reads slot 3, which entry 2 writes."""
    k_cache = torch.arange(6 * 1 * 2, dtype=torch.float32).reshape(6, 1, 2).to(device)
    accepted = torch.tensor([[2, 3, 4]], dtype=torch.int32, device=device)
    node_slots = torch.arange(5, dtype=torch.int64, device=device).reshape(1, 5)
    dest_slots = torch.tensor([[1, 2, 3]], device=device)
    before = k_cache.clone()
    ddtree.commit_kv(k_cache, None, accepted, node_slots, dest_slots)
    assert torch.equal(k_cache[1:4], before[2:5]) and torch.equal(k_cache[[0, 4, 5]], before[[0, 4, 5]])


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_accepted_slots(device):
    accepted = torch.tensor([[0, 3, 5, -1], [0, -1, -1, -1]], dtype=torch.int32, device=device)
    node_slots = torch.tensor([[40, 41, 42, 43, 44, 45], [10, 11, 12, 13, 14, 15]], device=device)
    assert ddtree.accepted_slots(accepted, node_slots).tolist() == [[40, 43, 45, -1], [10, -1, -1, -1]]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_commit_kv_layers_moves_every_layer_and_mla_values_with_their_keys(device):
    """Request 0 accepts nodes 0 and 2 (to slots 10, 11), request 1 its root (to 12): in a layer with K and V apart,
    in an MLA layer (V a view of K's first columns: it moves with K) and in one whose V lies beside K in a single
    storage (a cache of its own), those rows and no others move."""
    slots = 14

    def rows(base, width):  # row s holds base + s in every column
        return (base + torch.arange(slots, dtype=torch.float32, device=device))[:, None, None].repeat(1, 1, width)

    mla, shared = rows(300, 6), torch.stack([rows(400, 4), rows(500, 4)])
    layers = [(rows(100, 4), rows(200, 3)), (mla, mla[..., :4]), (shared[0], shared[1])]
    assert [ddtree.values_view_keys(k, v) for k, v in layers] == [False, True, False]
    accepted = torch.tensor([[0, 2], [0, -1]], dtype=torch.int32, device=device)
    node_slots = torch.tensor([[1, 2, 3], [5, 6, 7]], device=device)
    dest_slots = torch.tensor([[10, 11], [12, 13]], device=device)
    ddtree.commit_kv_layers(layers, accepted, node_slots, dest_slots)
    moved = list(range(10)) + [1, 3, 5, 13]  # the source of each row after the commit
    for k, v in layers:
        for cache in (k, v):
            base = int(cache[0, 0, 0])
            assert torch.equal(cache, (base + torch.tensor(moved, dtype=torch.float32, device=device))
                               [:, None, None].expand_as(cache)), base


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_emitted_tokens_are_the_accepted_drafts_then_the_bonus(device):
    """Path 0 -> 3 -> 5, the root alone, and a full path 0 -> 1 -> 2 -> 4: drafts in path order, then the bonus."""
    tree_tokens = torch.tensor([[7, 20, 21, 22, 23, 24], [9, 30, 31, 32, 33, 34], [8, 40, 41, 42, 43, 44]],
                               device=device)
    accepted = torch.tensor([[0, 3, 5, -1], [0, -1, -1, -1], [0, 1, 2, 4]], dtype=torch.int32, device=device)
    accept_len = torch.tensor([2, 0, 3], dtype=torch.int32, device=device)
    bonus = torch.tensor([50, 60, 70], device=device)
    emitted = ddtree.emitted_tokens(tree_tokens, accepted, accept_len, bonus)
    assert emitted.shape == (3, 4) and emitted.dtype == torch.int64
    assert [row[:n + 1] for row, n in zip(emitted.tolist(), accept_len.tolist())] == [
        [22, 24, 50], [60], [40, 41, 43, 70]]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_opcheck(device):
    for budget in (0, 5, 40):
        torch.library.opcheck(torch.ops.kdtree.ddtree_build_tree.default,
                              (*drafter_topk(2, 4, 3, ties=True, seed=budget, device=device), budget))
    for pad, max_depth in ((0, 6), (3, 2)):
        torch.library.opcheck(torch.ops.kdtree.ddtree_accept_greedy.default,
                              (*random_accept_case(3, 30, pad=pad, device=device), max_depth))
    for layout in ("plain", "mla", "strided"):
        torch.library.opcheck(torch.ops.kdtree.ddtree_commit_kv.default,
                              commit_case(2, 9, 4, layout=layout, device=device))


def ddtree_round(logprobs, tokens, roots, target_tokens):
    """A loop's round: the budget from its static target buffer [B, budget+1], the depth from K (SymInts)."""
    budget, max_depth = target_tokens.shape[1] - 1, logprobs.shape[1]
    tree_tokens, parents, depths, mask = ddtree.build_tree(logprobs, tokens, roots, budget)
    accepted, length, bonus = ddtree.accept_greedy(tree_tokens, parents, target_tokens, max_depth)
    return tree_tokens, mask, accepted, length + 1, bonus


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_compile_build_and_accept_are_opaque(device):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(ddtree_round, backend=counter, fullgraph=True, dynamic=True)
    # Budgets past 31: a one-word mask ([N, 1]) is a size-1 dimension Inductor specializes on, like any such.
    for batch, budget in ((2, 40), (3, 100)):
        args = drafter_topk(batch, 5, 3, ties=True, seed=budget, device=device)
        target = torch.randint(0, 50, (batch, budget + 1), device=device)
        got = compiled(*args, target)
        want = ddtree_round(*args, target)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
    assert counter.frame_count == 1  # one graph, no breaks, one compile for both shapes
    args = drafter_topk(2, 5, 3, seed=7, device=device)
    _, (code,) = run_and_get_code(torch.compile(ddtree_round, fullgraph=True), *args,
                                  torch.randint(0, 50, (2, 21), device=device))
    for op in ("ddtree_build_tree", "ddtree_accept_greedy"):
        assert len([ln for ln in code.splitlines() if f"torch.ops.kdtree.{op}.default(" in ln
                    and not ln.lstrip().startswith("#")]) == 1, code
    torch._dynamo.reset()


def _bad_inputs():
    """(id, op, kwargs builder, message pattern, value check): each argument's shape/dtype/device and values."""
    lp, tok, roots = drafter_topk(2, 3, 2)
    tt, par, tgt = random_accept_case(2, 10)
    kc, vc, acc, ns, ds = commit_case(2, 8, 3)
    build = dict(logprobs=lp, tokens=tok, root_tokens=roots, budget=5)
    accept = dict(tree_tokens=tt, parents=par, target_tokens=tgt, max_depth=3)
    commit = dict(k_cache=kc, v_cache=vc, accepted=acc, node_slots=ns, dest_slots=ds)
    unsorted = lp.clone()
    unsorted[1, 2] = unsorted[1, 2].flip(-1)
    positive = lp.clone()
    positive[0, 0, 0] = 0.5
    bad_parent = par.clone()
    bad_parent[1, 4] = 4
    bad_root = par.clone()
    bad_root[0, 0] = 0
    bad_acc = acc.clone()
    bad_acc[0, 0] = 8
    bad_dest = ds.clone()
    bad_dest[1, 0] = kc.shape[0]
    dup_dest = ds.clone()
    dup_dest[1, 0] = ds[0, 0]
    return [
        ("logprobs_dtype", "build", {**build, "logprobs": lp.double()}, r"logprobs must be \[B, K, k\] Float"),
        ("logprobs_2d", "build", {**build, "logprobs": lp[0]}, r"logprobs must be \[B, K, k\]"),
        ("tokens_dtype", "build", {**build, "tokens": tok.int()}, r"tokens must be \[B, K, k\] Long"),
        ("tokens_shape", "build", {**build, "tokens": tok[:, :2]}, r"tokens must be \[B, K, k\] = \[2, 3, 2\]"),
        ("root_tokens_shape", "build", {**build, "root_tokens": roots[:1]}, r"root_tokens must be \[B\] = \[2\]"),
        ("root_tokens_dtype", "build", {**build, "root_tokens": roots.int()}, r"root_tokens must be \[B\] Long"),
        ("budget_negative", "build", {**build, "budget": -1}, r"budget must be in \[0, sum_\{d=1..K\} k\^d = 14\]"),
        ("budget_too_big", "build", {**build, "budget": 15}, r"budget must be in \[0, sum_\{d=1..K\} k\^d = 14\]"),
        ("logprobs_unsorted", "build", {**build, "logprobs": unsorted}, r"logprobs\[1, 2, :\] must be sorted desc"),
        ("logprobs_positive", "build", {**build, "logprobs": positive}, r"logprobs\[0, 0, 0\] = 0.5 must be a log-p"),
        ("tree_tokens_dtype", "accept", {**accept, "tree_tokens": tt.int()}, r"tree_tokens must be \[B, T\] Long"),
        ("tree_tokens_empty", "accept", {**accept, "tree_tokens": tt[:, :0], "parents": par[:, :0],
                                         "target_tokens": tgt[:, :0]}, r"with T >= 1"),
        ("parents_dtype", "accept", {**accept, "parents": par.long()}, r"parents must be \[B, T\] Int"),
        ("parents_shape", "accept", {**accept, "parents": par[:, :-1]}, r"parents must be \[B, T\] = \[2, 11\]"),
        ("target_tokens_shape", "accept", {**accept, "target_tokens": tgt[:1]}, r"target_tokens must be \[B, T\] ="),
        ("max_depth_negative", "accept", {**accept, "max_depth": -1}, r"max_depth must be in \[0"),
        ("parents_not_earlier", "accept", {**accept, "parents": bad_parent}, r"parents\[1, 4\] = 4 must be -1"),
        ("parents_root", "accept", {**accept, "parents": bad_root}, r"parents\[0, 0\] = 0 must be -1 \(the root\)"),
        ("k_cache_2d", "commit", {**commit, "k_cache": kc[:, 0]}, r"k_cache must be \[S, Hkv, Dk\]"),
        ("k_cache_strided", "commit", {**commit, "k_cache": kc.transpose(1, 2).contiguous().transpose(1, 2)},
         r"k_cache must have a contiguous last dimension"),
        ("v_cache_dtype", "commit", {**commit, "v_cache": vc.half()}, r"v_cache must have the dtype of k_cache"),
        ("v_cache_slots", "commit", {**commit, "v_cache": vc[:-1]}, r"v_cache must be \[S, Hkv, Dv\] with S ="),
        ("v_cache_aliases_k", "commit", {**commit, "v_cache": kc[..., :4]}, r"v_cache overlaps k_cache"),
        ("accepted_dtype", "commit", {**commit, "accepted": acc.long()}, r"accepted must be \[B, D\+1\] Int"),
        ("node_slots_dtype", "commit", {**commit, "node_slots": ns.int()}, r"node_slots must be \[B, T\] Long"),
        ("node_slots_batch", "commit", {**commit, "node_slots": ns[:1]}, r"node_slots must be \[B, T\] with B = 2"),
        ("dest_slots_shape", "commit", {**commit, "dest_slots": ds[:, :2]}, r"dest_slots must be \[B, D\+1\] ="),
        ("accepted_range", "commit", {**commit, "accepted": bad_acc}, r"accepted\[0, 0\] = 8 must be -1 or a node"),
        ("dest_slot_range", "commit", {**commit, "dest_slots": bad_dest}, r"dest_slots\[1, 0\] = \d+ must be a slot"),
        ("dest_slot_twice", "commit", {**commit, "dest_slots": dup_dest},
         r"is the destination of another accepted entry"),
    ]


BAD_INPUTS = {case[0]: case for case in _bad_inputs()}
VALUE_CASES = {"logprobs_unsorted", "logprobs_positive", "parents_not_earlier", "parents_root", "accepted_range",
               "dest_slot_range", "dest_slot_twice"}
CALLS = {"build": ddtree.build_tree, "accept": ddtree.accept_greedy, "commit": ddtree.commit_kv}


def raise_bad_input(case_id: str, device: str) -> None:
    """Calls the op of one bad-input case on `device`; pytest.raises checks the message."""
    _, op, kwargs, pattern = BAD_INPUTS[case_id]
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    if case_id == "v_cache_aliases_k":
        moved["v_cache"] = moved["k_cache"][..., :4]  # the alias survives the move
    with pytest.raises(RuntimeError, match=pattern):
        CALLS[op](**moved)


@pytest.mark.parametrize("case_id", list(BAD_INPUTS))
def test_bad_inputs_cpu(case_id):
    raise_bad_input(case_id, "cpu")


if "cuda" in DEVICES:  # defined only where it can run: the CPU suite never skips

    @pytest.fixture(scope="module")
    def cuda_children(request, ops):  # ops: the library is built before the children load it
        """case id -> future ChildResult: each case in a process of its own (fresh_process.py), a few at a time."""
        import fresh_process

        yield from fresh_process.run_all(fresh_process.bad_input_jobs(request, __name__, VALUE_CASES))

    @pytest.mark.cuda
    @pytest.mark.parametrize("case_id", list(BAD_INPUTS))
    def test_bad_inputs_cuda_in_own_process(cuda_children, case_id):
        """Each case in a process of its own: a crash in the CUDA host code fails this case only."""
        import fresh_process

        fresh_process.assert_raised_as_expected(cuda_children[case_id].result())
