"""ddtree_sample_targets (kdtree_ops/ddtree/sampling.py): the op against its operation-for-operation torch reference
(kdtree_ops/ddtree/sampling_reference.py) bit for bit on every device, CPU and CUDA against each other, literal
cases, SGLang's own sampler (its filters' kept set, its murmur hash, its float64 Gumbel), opcheck, torch.compile
(one opaque node), CUDA-graph capture, and bad inputs (on CUDA each case in its own process).

The distribution the draws make, and the DDTree round built on them, are tested in test_ddtree_sampling_lossless.py
and test_ddtree_sampling_loop.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor.utils import run_and_get_code

from kdtree_ops.ddtree import SamplingParams, sample_targets, target_tokens
from kdtree_ops.ddtree.sampling_reference import (gumbel_from_hash, kept_mask, noise_hash, sample_targets_reference,
                                                  scaled_logits)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DEVICE_PARAMS = [pytest.param(d, marks=pytest.mark.cuda) if d == "cuda" else d for d in DEVICES]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def random_params(batch: int, vocab: int, gen: torch.Generator, greedy_share: float = 0.2) -> SamplingParams:
    """Mixed requests: greedy, plain sampling, each filter alone and together, off values SGLang's way."""
    requests = []
    for _ in range(batch):
        r = torch.rand(5, generator=gen).tolist()
        requests.append(dict(
            temperature=0.0 if r[0] < greedy_share else 0.3 + 2.0 * r[0],
            top_k=[-1, 1 << 30, 1, 2, max(1, vocab // 3), vocab, vocab + 5][int(r[1] * 7)],
            top_p=1.0 if r[2] < 0.4 else max(1e-3, r[2] - 0.3),
            min_p=0.0 if r[3] < 0.5 else 0.3 * r[3] - 0.14,
            seed=int(torch.randint(-2**62, 2**62, (), generator=gen))))
    return SamplingParams.of(requests)


def random_logits(rows: int, vocab: int, dtype, kind: str, gen: torch.Generator) -> torch.Tensor:
    """kind: "spread" (scale 1-8), "peaked" (one token far ahead), "flat" (all within 1: every token a candidate),
    "ties" (values on a coarse grid: ties at every threshold), "masked" (a third of the vocabulary -inf)."""
    x = torch.randn(rows, vocab, generator=gen)
    if kind == "spread":
        x = x * (1 + 7 * torch.rand(rows, 1, generator=gen))
    elif kind == "peaked":
        x[:, vocab // 2] += 30
    elif kind == "flat":
        x = x * 0.05
    elif kind == "ties":
        x = (x * 2).round() / 2
    elif kind == "masked":
        x = x * 4
        x[:, torch.randperm(vocab, generator=gen)[: vocab // 3]] = float("-inf")
    return x.to(dtype)


KINDS = ["spread", "peaked", "flat", "ties", "masked"]
# (B, T, V): V = 1, small, not a multiple of the CTA, past the GPU's shared-memory candidate list (4096), large.
SHAPES = [(1, 1, 1), (3, 4, 2), (4, 5, 7), (2, 3, 64), (3, 9, 300), (2, 4, 1000), (2, 3, 5000), (1, 2, 40000)]


def case(shape, dtype, kind, seed, device="cpu"):
    batch, nodes, vocab = shape
    gen = torch.Generator().manual_seed(seed)
    logits = random_logits(batch * nodes, vocab, dtype, kind, gen)
    positions = torch.randint(0, 2**33, (batch, nodes), generator=gen)  # past 2^32: the low 32 bits key
    params = random_params(batch, vocab, gen)
    return [t.to(device) for t in (logits, positions, *params.astuple())]


# Every (shape, kind) once, the dtypes taking turns (each dtype meets every shape and every kind).
REFERENCE_CASES = [(shape, DTYPES[(i + j) % 3], kind) for i, shape in enumerate(SHAPES) for j, kind in enumerate(KINDS)]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("shape, dtype, kind", REFERENCE_CASES,
                         ids=[f"{b}x{t}x{v}-{str(d)[6:]}-{k}" for (b, t, v), d, k in REFERENCE_CASES])
def test_matches_reference(shape, dtype, kind, device):
    args = case(shape, dtype, kind, seed=zlib.crc32(f"{shape}{dtype}{kind}".encode()), device=device)
    got = sample_targets(*args)
    want = sample_targets_reference(*[a.cpu() for a in args])
    assert got.device.type == device and got.dtype == torch.int64 and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("batch, nodes", [(0, 5), (3, 0)])
def test_empty(batch, nodes, device):
    params = SamplingParams.of([dict(temperature=1.0)] * batch, device=device)
    out = sample_targets(torch.zeros(batch * nodes, 9, device=device),
                         torch.zeros(batch, nodes, dtype=torch.int64, device=device), *params.astuple())
    assert out.shape == (batch, nodes) and out.dtype == torch.int64 and out.device.type == device


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_filters_at_their_boundaries(device):
    """Each filter alone at the values where its kept set changes, on rows with ties at the boundary."""
    vocab, gen = 40, torch.Generator().manual_seed(3)
    rows = []
    for top_k in range(1, 12):
        rows.append((dict(temperature=1.0, top_k=top_k), "ties"))
    for top_p in (1e-3, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999999):
        rows.append((dict(temperature=0.7, top_p=top_p), "ties"))
    for min_p in (1e-6, 0.01, 0.1, 0.5, 0.9, 1.0):
        rows.append((dict(temperature=1.3, min_p=min_p), "spread"))
    for i, (request, kind) in enumerate(rows):
        request["seed"] = i
        logits = random_logits(8, vocab, torch.float32, kind, gen)
        params = SamplingParams.of([request])
        positions = torch.arange(8)[None]
        args = [t.to(device) for t in (logits, positions, *params.astuple())]
        assert torch.equal(sample_targets(*args).cpu(), sample_targets_reference(*[a.cpu() for a in args])), request


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_literal_cases(device):
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.0, 0.0, 0.0, 0.0], [-float("inf"), 5.0, -float("inf"), 1.0]])
    positions = torch.tensor([[7, 8, 9]])

    def draw(**request):
        params = SamplingParams.of([dict(seed=1234, **request)])
        args = [t.to(device) for t in (logits, positions, *params.astuple())]
        return sample_targets(*args).tolist()[0]

    assert draw(temperature=0.0) == [1, 0, 1]             # greedy: the first maximum
    assert draw(temperature=1.0, top_k=1) == [1, 0, 1]    # SGLang's greedy: top_k 1
    assert draw(temperature=5.0, top_p=1e-6) == [1, 0, 1]  # the most likely token is always kept
    tied = draw(temperature=5.0, min_p=1.0)                # min_p 1: the tied maxima only
    assert tied[0] in (1, 2) and tied[2] == 1
    assert draw(temperature=1.0)[2] in (1, 3)              # never a -inf token


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_target_tokens_is_the_argmax_without_sampling_and_the_draw_with_it(device):
    """The loop's and the worker's one choice: greedy (no parameters) is the first maximum of each row, shaped as
    positions; with parameters it is sample_targets' draw, the same positions keying the noise."""
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.0, 0.0, 0.0, 0.0], [2.0, 5.0, -1.0, 7.0],
                           [4.0, -4.0, 4.0, 0.0]], device=device)
    positions = torch.tensor([[7, 8], [20, 21]], device=device)
    assert target_tokens(logits, positions, None).tolist() == [[1, 0], [3, 0]]
    params = SamplingParams.of([dict(temperature=2.0, seed=5), dict(temperature=0.0)], device=device)
    want = sample_targets(logits, positions, *params.astuple())
    assert torch.equal(target_tokens(logits, positions, params), want) and want[1].tolist() == [3, 0]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_noise_is_keyed_by_seed_and_position_only(device):
    """Nodes of one depth share their position's noise: identical logits at one position draw one token; the node's
    index, the batch around it and the other requests do not matter; another seed or position draws anew."""
    gen = torch.Generator().manual_seed(0)
    vocab, nodes = 50, 6
    row = torch.randn(1, vocab, generator=gen) * 0.3
    logits = row.expand(4 * nodes, vocab).contiguous()
    positions = torch.tensor([[100] * nodes, [100] * nodes, [101] * nodes, [100] * nodes])
    params = SamplingParams.of([dict(temperature=1.0, seed=5), dict(temperature=1.0, seed=5),
                                dict(temperature=1.0, seed=5), dict(temperature=1.0, seed=6)])
    got = sample_targets(*[t.to(device) for t in (logits, positions, *params.astuple())]).cpu()
    assert (got[0] == got[0, 0]).all() and torch.equal(got[0], got[1])
    alone = sample_targets(*[t.to(device) for t in (row, positions[:1, :1], *SamplingParams.of(
        [dict(temperature=1.0, seed=5)]).astuple())]).cpu()
    assert alone.item() == got[0, 0]
    # Over 200 (seed, position) pairs a fresh key changes the token most of the time (50 near-uniform tokens).
    keys = torch.arange(200)
    many = SamplingParams.of([dict(temperature=1.0, seed=int(s)) for s in keys])
    drawn = sample_targets(*[t.to(device) for t in (row.expand(200, vocab).contiguous(), torch.full((200, 1), 100),
                                                    *many.astuple())]).cpu()
    assert drawn.unique().numel() > 30


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_sglang_layouts_pass_as_they_are(device):
    """SamplingBatchInfo's fields: temperatures [B, 1], top_ks int32 with 2^30 for "all"; strided logits rows."""
    gen = torch.Generator().manual_seed(1)
    wide = torch.randn(6, 90, generator=gen)
    logits = wide[:, 5:85]  # row stride 90
    positions = torch.arange(6).view(2, 3)
    temperatures = torch.tensor([[0.8], [1.2]])
    top_ks = torch.tensor([1 << 30, 7], dtype=torch.int32)
    rest = (torch.tensor([0.9, 1.0]), torch.tensor([0.0, 0.05]), torch.tensor([3, -4]))
    args = [t.to(device) for t in (logits, positions, temperatures, top_ks, *rest)]
    want = sample_targets_reference(logits.contiguous(), positions, temperatures[:, 0], top_ks.long(), *rest)
    assert torch.equal(sample_targets(*args).cpu(), want)


def test_reference_noise_is_sglangs_gumbel():
    """Our float32 Gumbel against SGLang's float64 formula (multinomial_with_seed): within 6e-7 everywhere."""
    h = torch.cat([torch.randint(1, 2**32, (500_000,), generator=torch.Generator().manual_seed(0)),
                   torch.tensor([1, 2, 3, 2**31, 0xBFFFFFFF, 0xC0000000, 2**32 - 2, 2**32 - 1])])
    x = (h.double() / 4294967295.0).log().clamp(min=torch.finfo(torch.float64).min, max=-(2.0 ** -32)).neg()
    sglang = x.log().neg()
    assert (gumbel_from_hash(h).double() - sglang).abs().max() < 6e-7
    assert gumbel_from_hash(torch.tensor([0])).item() == pytest.approx(-709.78, abs=0.01)


# murmur_hash32_kernel of sglang 0.5.23 (sglang/kernels/ops/sampling/murmur_hash.py) run under TRITON_INTERPRET=1 on
# seeds (0, 42, -1, 2^40 + 7), positions (0, 5, 1000, 123456), vocab ids 0..7; test_hash_is_sglangs_kernel reruns it.
SGLANG_HASHES = [
    [2167721464, 10027521, 2423355346, 1368026766, 78347357, 350656522, 108842416, 2273946258],
    [1076517293, 4087110921, 426242695, 4162562164, 193295324, 3066981379, 3027533227, 4156123543],
    [2392138756, 2761353437, 1698170081, 1297718983, 2519095700, 2492377296, 638178811, 171962210],
    [421685403, 872797065, 1690168169, 3394861010, 702237509, 3006076130, 1873031893, 104547728],
]
HASH_SEEDS, HASH_POSITIONS = [0, 42, -1, 2**40 + 7], [0, 5, 1000, 123456]


def test_hash_literals():
    got = noise_hash(torch.tensor(HASH_SEEDS)[:, None], torch.tensor(HASH_POSITIONS)[:, None], torch.arange(8)[None])
    assert got.tolist() == SGLANG_HASHES


_INTERPRET_HASH = """
import importlib.util, sys, torch
import sglang
path = sglang.__path__[0] + "/kernels/ops/sampling/murmur_hash.py"
spec = importlib.util.spec_from_file_location("murmur", path)
murmur = importlib.util.module_from_spec(spec)
spec.loader.exec_module(murmur)
gen = torch.Generator().manual_seed(0)
seeds = torch.randint(-2**63, 2**63 - 1, (16,), generator=gen)
positions = torch.randint(0, 2**40, (16,), generator=gen)
cols = torch.randint(0, 2**20, (64,), generator=gen)
out = torch.empty((16, 64), dtype=torch.uint32)
murmur.murmur_hash32_kernel[(16, 1)](seeds, positions, cols, out, 16, 64, BLOCK_SIZE=64)
torch.save((seeds, positions, cols, out.long()), sys.argv[1])
"""


def test_hash_is_sglangs_kernel(tmp_path):
    """The hash against SGLang's own Triton kernel, run by Triton's CPU interpreter in a fresh process."""
    out = tmp_path / "hashes.pt"
    run = subprocess.run([sys.executable, "-c", _INTERPRET_HASH, str(out)], env={**os.environ, "TRITON_INTERPRET": "1"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    seeds, positions, cols, want = torch.load(out)
    assert torch.equal(noise_hash(seeds[:, None], positions[:, None], cols[None, :]), want & 0xFFFFFFFF)


def test_kept_set_is_sglangs():
    """The kept set against SGLang's seeded-path filter (top_k_top_p_min_p_sampling_from_probs_torch, its filtered
    probabilities' support) on rows whose every token is clear of the thresholds by 1e-5 (where float32 cumsums
    and our integer masses cannot disagree)."""
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    gen = torch.Generator().manual_seed(11)
    rows, vocab = 3000, 50
    logits = torch.randn(rows, vocab, generator=gen) * (0.5 + 3 * torch.rand(rows, 1, generator=gen))
    temperatures = 0.4 + 1.5 * torch.rand(rows, generator=gen)
    top_ks = torch.randint(1, vocab + 10, (rows,), generator=gen, dtype=torch.int32)
    top_ps = torch.where(torch.rand(rows, generator=gen) < 0.3, 1.0, 0.2 + 0.79 * torch.rand(rows, generator=gen))
    min_ps = torch.where(torch.rand(rows, generator=gen) < 0.5, 0.0, 0.2 * torch.rand(rows, generator=gen))
    z = scaled_logits(logits, temperatures)
    ours = kept_mask(z, top_ks.long(), top_ps, min_ps)

    probs = torch.softmax(logits / temperatures[:, None], -1)
    # top_p 1 is off (as in SGLang when no request of the batch has top_p < 1); SGLang's float32 cumsum in a mixed
    # batch can pass 1 by rounding and cut tail tokens of a top_p = 1 row, so those rows get a top_p just above 1.
    sglang_top_ps = torch.where(top_ps == 1, 1.001, top_ps)
    _, sorted_probs, index, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), top_ks, sglang_top_ps, min_ps, True, None, None, return_filtered_probs=True)
    theirs = torch.zeros_like(ours).scatter(1, index.long(), sorted_probs > 0)

    exact = torch.softmax(logits.double() / temperatures[:, None].double(), -1)
    ordered = exact.sort(-1, descending=True).values
    before = ordered.cumsum(-1) - ordered
    clear = (top_ps == 1) | ((before - top_ps[:, None].double()).abs() > 1e-5).all(1)
    clear &= (min_ps == 0) | ((ordered / ordered[:, :1] - min_ps[:, None].double()).abs() > 1e-5).all(1)
    assert clear.sum() > 0.9 * rows
    assert torch.equal(ours[clear], theirs[clear])
    assert ours.sum(1).float().mean() > 3  # the filters leave real choices


def test_draws_are_sglangs_seeded_draws():
    """With SGLang's noise and kept set, our float32 draw is SGLang's float64 one (multinomial_with_seed on the
    log of the filtered probabilities) except where the top two scores tie within float32 rounding."""
    gen = torch.Generator().manual_seed(2)
    rows, vocab = 4000, 64
    logits = torch.randn(rows, vocab, generator=gen) * 3
    temperatures, seeds = torch.full((rows,), 0.9), torch.randint(-2**62, 2**62, (rows,), generator=gen)
    positions = torch.randint(0, 10**6, (rows,), generator=gen)
    params = (temperatures, torch.full((rows,), 20), torch.full((rows,), 0.95), torch.full((rows,), 0.01), seeds)
    ours = sample_targets(logits, positions[:, None], *params)[:, 0]
    z = scaled_logits(logits, temperatures)
    keep = kept_mask(z, *params[1:4])
    u = noise_hash(seeds[:, None], positions[:, None], torch.arange(vocab)[None]).double() / 4294967295.0
    g = u.log().clamp(min=torch.finfo(torch.float64).min, max=-(2.0 ** -32)).neg().log().neg()
    logp = torch.where(keep, torch.log_softmax(logits.double() / 0.9, -1), -torch.inf)
    theirs = (logp + g).argmax(-1)
    assert (ours == theirs).float().mean() > 0.999


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_opcheck(device):
    for shape, dtype, kind in (((2, 3, 50), torch.float32, "spread"), ((3, 2, 300), torch.bfloat16, "ties"),
                               ((1, 4, 7), torch.float16, "masked")):
        torch.library.opcheck(torch.ops.kdtree.ddtree_sample_targets.default, case(shape, dtype, kind, 0, device))


def sampled_round(tree_tokens, parents, logits, positions, temperatures, top_ks, top_ps, min_ps, seeds):
    """A round's sampled acceptance: sample_targets then accept_greedy, depth from positions' shape (SymInts)."""
    from kdtree_ops.ddtree import accept_greedy

    targets = sample_targets(logits, positions, temperatures, top_ks, top_ps, min_ps, seeds)
    return accept_greedy(tree_tokens, parents, targets, positions.shape[1] - 1)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_compile_is_opaque(device):
    from kdtree_ops.ddtree import build_tree

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(sampled_round, backend=counter, fullgraph=True, dynamic=True)
    for batch, budget, vocab in ((2, 40, 30), (3, 70, 50)):
        gen = torch.Generator().manual_seed(budget)
        lp = torch.log_softmax(torch.randn(batch, 5, 6, generator=gen), -1).sort(-1, descending=True).values
        tokens = torch.randint(0, vocab, (batch, 5, 6), generator=gen)
        tree_tokens, parents, depths, _ = build_tree(lp, tokens, torch.zeros(batch, dtype=torch.int64), budget)
        logits = torch.randn(batch * (budget + 1), vocab, generator=gen)
        params = random_params(batch, vocab, gen).astuple()
        args = [t.to(device) for t in (tree_tokens, parents, logits, 17 + depths.long(), *params)]
        for g, w in zip(compiled(*args), sampled_round(*args)):
            assert torch.equal(g, w)
    assert counter.frame_count == 1  # one graph, no breaks, one compile for both shapes
    _, (code,) = run_and_get_code(torch.compile(sampled_round, fullgraph=True), *args)
    calls = [ln for ln in code.splitlines() if "torch.ops.kdtree.ddtree_sample_targets.default(" in ln
             and not ln.lstrip().startswith("#")]
    assert len(calls) == 1, code
    torch._dynamo.reset()


def _bad_inputs():
    """(id, kwargs, message pattern): every argument's shape, dtype and device, and the parameters' values."""
    logits, positions, *params = case((2, 3, 10), torch.float32, "spread", 0)
    ok = dict(zip(("logits", "positions", "temperatures", "top_ks", "top_ps", "min_ps", "seeds"),
                  (logits, positions, *params)))
    t, k, p, m, s = params
    return [
        ("logits_dtype", {**ok, "logits": logits.double()}, r"logits must be \[B\*T, V\] Float, BFloat16 or Half"),
        ("logits_3d", {**ok, "logits": logits[None]}, r"logits must be \[B\*T, V\]"),
        ("logits_rows", {**ok, "logits": logits[:5]}, r"logits must be \[B\*T, V\] with B\*T = 2\*3 = 6 rows"),
        ("logits_empty_vocab", {**ok, "logits": logits[:, :0]}, r"1 <= V <= 2\^22 columns, got 0"),
        ("positions_dtype", {**ok, "positions": positions.int()}, r"positions must be \[B, T\] Long"),
        ("positions_1d", {**ok, "positions": positions.flatten()}, r"positions must be \[B, T\] Long"),
        ("temperatures_dtype", {**ok, "temperatures": t.double()}, r"temperatures must be \[B\] = \[2\] \(or \[B, 1\]"),
        ("temperatures_shape", {**ok, "temperatures": t[:1]}, r"temperatures must be \[B\] = \[2\]"),
        ("top_ks_dtype", {**ok, "top_ks": k.float()}, r"top_ks must be \[B\] = \[2\] Int or Long"),
        ("top_ps_shape", {**ok, "top_ps": p[None]}, r"top_ps must be \[B\] = \[2\] Float"),
        ("min_ps_dtype", {**ok, "min_ps": m.half()}, r"min_ps must be \[B\] = \[2\] Float"),
        ("seeds_dtype", {**ok, "seeds": s.int()}, r"seeds must be \[B\] = \[2\] Long"),
        ("temperature_negative", {**ok, "temperatures": torch.tensor([0.5, -1.0])},
         r"temperatures\[1\] = -1 must be finite and >= 0"),
        ("temperature_nan", {**ok, "temperatures": torch.tensor([float("nan"), 1.0])}, r"temperatures\[0\] = nan"),
        ("top_p_zero", {**ok, "top_ps": torch.tensor([0.0, 1.0])}, r"top_ps\[0\] = 0 must be in \(0, 1\]"),
        ("top_p_above_one", {**ok, "top_ps": torch.tensor([1.0, 1.5])}, r"top_ps\[1\] = 1.5 must be in \(0, 1\]"),
        ("min_p_negative", {**ok, "min_ps": torch.tensor([-0.1, 0.0])}, r"min_ps\[0\] = -0.1 must be in \[0, 1\]"),
    ]


BAD_INPUTS = {c[0]: c for c in _bad_inputs()}
VALUE_CASES = {"temperature_negative", "temperature_nan", "top_p_zero", "top_p_above_one", "min_p_negative"}


def raise_bad_input(case_id: str, device: str) -> None:
    _, kwargs, pattern = BAD_INPUTS[case_id]
    with pytest.raises(RuntimeError, match=pattern):
        sample_targets(**{k: v.to(device) for k, v in kwargs.items()})


@pytest.mark.parametrize("case_id", list(BAD_INPUTS))
def test_bad_inputs_cpu(case_id):
    raise_bad_input(case_id, "cpu")


def test_mismatched_devices_cpu_kernel():
    """A parameter on another device is refused by name. The only other device here is "meta", and any meta tensor
    dispatches to the fake, so the CPU kernel is called directly (test_errors.py does the same)."""
    logits, positions, *params = case((1, 2, 5), torch.float32, "spread", 0)
    with pytest.raises(RuntimeError, match=r"seeds must be on the device of logits \(cpu\), got meta"):
        torch.ops.kdtree.ddtree_sample_targets.default.redispatch(
            torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), logits, positions, *params[:4], params[4].to("meta"))


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

    @pytest.mark.cuda
    @pytest.mark.parametrize("vocab", [7, 4096, 151936, 262144])
    @pytest.mark.parametrize("kind", KINDS)
    def test_cuda_equals_cpu_bit_for_bit(vocab, kind):
        """The radix-select CUDA kernel and the sorting CPU loop draw the same tokens, vocabularies up to 256k, every
        dtype, many rows (a round's B*T), parameters mixed per request."""
        for dtype in DTYPES:
            gen = torch.Generator().manual_seed(vocab)
            batch, nodes = 8, 16 if vocab > 10000 else 64
            logits = random_logits(batch * nodes, vocab, dtype, kind, gen)
            positions = torch.randint(0, 2**31, (batch, nodes), generator=gen)
            args = [logits, positions, *random_params(batch, vocab, gen, greedy_share=0.1).astuple()]
            assert torch.equal(sample_targets(*[a.cuda() for a in args]).cpu(), sample_targets(*args)), dtype

    @pytest.mark.cuda
    def test_cuda_graph_capture_then_replay():
        """Captured once; new logits, positions and parameters copied into the static inputs each replay."""
        shape = (4, 9, 3000)
        static = case(shape, torch.bfloat16, "spread", 0, "cuda")
        sample_targets(*static)  # warm-up outside the graph
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = sample_targets(*static)
        for seed in range(1, 6):
            fresh = case(shape, torch.bfloat16, KINDS[seed % len(KINDS)], seed, "cuda")
            for s, f in zip(static, fresh):
                s.copy_(f)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out.cpu(), sample_targets(*[f.cpu() for f in fresh]))
