"""Bad inputs on CUDA raise RuntimeError naming the argument, and never kill the process.

Every case runs in a process of its own (fresh_process.py: forked from a server that loaded the library once, before
any CUDA initialization), so a host-side check that crashes (the SIGSEGV of issue 25) fails that case alone. The
child reports whether the call raised RuntimeError and its message; the test asserts the child exited normally and
that the message matches. The children run a few at a time, started when the first test of this module needs them.

Covered, for tree_verify_attention (functional and `_out` forms, eager and while capturing a CUDA graph):
- the shared shape/dtype/stride checks (test_errors.SHAPE_CASES, OUT_CASES, on CUDA bf16 tensors, Dqk = Dv = 64);
- the CUDA-only checks: q float32, head dims without a kernel, rows not 16-byte aligned, too many rows, tensors on
  another device;
- the value checks (test_errors.VALUE_CASES): with KDTREE_OPS_DEBUG=1 they raise eagerly and are skipped while
  capturing (the capture succeeds; the graph is never replayed, as its kernel would read out of bounds); with it
  unset the host does not check them: eagerly only for a fault the kernel survives (too few mask words: words
  past W read as zero), the others by capturing without replay (no host check raises, nothing runs);
and the same for tree_mask_from_parents / tree_mask_from_dense and record_divergence; the fp8 path switch
(KDTREE_OPS_FP8_PATH: the overlap path under gate rows of its own, a value naming no path). Then the has-kernel
answer is compared with what the op does over a grid of dtypes, head dims and KV heads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch

import fresh_process
import test_errors as cpu_cases
from kdtree_ops.testing.cases import make_verify_case

pytestmark = pytest.mark.cuda

HEAD_DIM = 64


# --- what a child runs -----------------------------------------------------------------------------------


def cuda_args(draft_mode="cache", head_dims=(HEAD_DIM, HEAD_DIM), num_kv_heads=2, dtype=torch.bfloat16) -> dict:
    """test_errors.base_args' valid call (two requests of 5 and 40 tokens, Hq = 4) on CUDA."""
    return cpu_cases.base_args(draft_mode, num_kv_heads=num_kv_heads, head_dim_qk=head_dims[0],
                               head_dim_v=head_dims[1], dtype=dtype, device="cuda")


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """t's values in a view whose data pointer is one element past a 16-byte boundary (`buf[..., 1:D+1]`)."""
    buf = torch.empty(*t.shape[:-1], t.shape[-1] + 8, dtype=t.dtype, device=t.device)
    view = buf[..., 1 : t.shape[-1] + 1]
    view.copy_(t)
    return view


def misaligned_contiguous(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t starting one element past a 16-byte boundary (for `out`, which must be contiguous)."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    return flat.view(t.shape).copy_(t)


def odd_head_stride(t: torch.Tensor) -> torch.Tensor:
    """t in a view with an aligned data pointer but a head stride of D + 2 elements (not a multiple of 8)."""
    buf = torch.empty(*t.shape[:-1], t.shape[-1] + 2, dtype=t.dtype, device=t.device)
    view = buf[..., : t.shape[-1]]
    view.copy_(t)
    return view


def output_like(args: dict) -> torch.Tensor:
    """A NaN-filled output buffer for the call's shape, dtype and device."""
    return torch.full((args["q"].shape[0], args["q"].shape[1], args["v_cache"].shape[2]), float("nan"),
                      dtype=args["q"].dtype, device=args["q"].device)


def run_attention(args: dict, variant: str, out=None):
    if variant == "functional":
        return torch.ops.kdtree.tree_verify_attention.default(**args)
    return torch.ops.kdtree.tree_verify_attention_out.default(**args, out=output_like(args) if out is None else out)


def in_mode(mode: str, call, warmup=None):
    """Runs call() eagerly ("eager", then synchronizes: a kernel fault shows here) or while capturing a CUDA graph
    that is never replayed ("capture"; `warmup`, a valid call, runs eagerly first, so that the capture is not the
    kernel's first launch in the process)."""
    if mode == "eager":
        call()
        torch.cuda.synchronize()
        return
    if warmup is not None:
        warmup()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # an exception ends the capture and propagates
        call()


def attention_call(change=None, variant="functional", mode="eager", draft_mode="cache", make_out=None,
                   warmup=False, **arg_kwargs):
    """A zero-argument function: the valid call with `change` (test_errors' case format) in this variant/mode;
    with `warmup`, the valid call runs first (for captures that must succeed). Inputs and `out` are made before
    any capture."""
    def run():
        valid = cuda_args(draft_mode, **arg_kwargs)
        args = cpu_cases.apply_change(valid, change or {})
        out = make_out(args) if make_out is not None else output_like(valid) if variant == "out" else None
        in_mode(mode, lambda: run_attention(args, variant, out),
                warmup=(lambda: run_attention(valid, variant)) if warmup else None)
    return run


def moved(value):
    return value.cuda() if isinstance(value, torch.Tensor) else value


@dataclass(frozen=True)
class Case:
    """One child process: `call` must raise RuntimeError matching `pattern` (None: must not raise)."""

    name: str
    call: object  # () -> None, run in the child
    pattern: str | None
    debug: bool = False  # KDTREE_OPS_DEBUG=1 in the child's environment
    gated: bool = False  # KDTREE_OPS_UNVERIFIED unset in the child (the GPU suite sets it): the gate applies
    fp8_path: str | None = None  # KDTREE_OPS_FP8_PATH in the child's environment (None: unset, the widen path)


def run_case(name: str) -> None:
    """The child's body: one case's call (a RuntimeError is what the parent expects of most)."""
    CASES_BY_NAME[name].call()


def job(case: Case) -> fresh_process.Job:
    env = (("KDTREE_OPS_DEBUG", "1" if case.debug else None), ("KDTREE_OPS_UNVERIFIED", None if case.gated else "1"),
           ("KDTREE_OPS_FP8_PATH", case.fp8_path))
    return fresh_process.Job(__name__, "run_case", (case.name,), env)


# --- the cases -------------------------------------------------------------------------------------------

VARIANTS = ["functional", "out"]
MODES = ["eager", "capture"]
NO_KERNEL_HEAD_DIMS = [(32, 32), (80, 80), (96, 64), (576, 512)]  # with 2 KV heads: (576, 512) needs one
ALIGNED_TENSORS = ["q", "k_cache", "v_cache", "k_draft", "v_draft", "out"]


def attention_cases() -> list[Case]:
    cases = []
    for variant in VARIANTS:
        for mode in MODES:
            tag = f"{variant}-{mode}"
            for name, change, pattern in cpu_cases.SHAPE_CASES:
                if mode == "eager" or variant == "out":  # graphs capture the _out form (SGLang's)
                    cases.append(Case(f"attention-{name}-{tag}", attention_call(change, variant, mode), pattern))
            cases.append(Case(f"attention-q_float32-{tag}",
                              attention_call(variant=variant, mode=mode, dtype=torch.float32),
                              r"on CUDA, q must be bfloat16 or float16, got Float"))
            for dqk, dv in NO_KERNEL_HEAD_DIMS:
                cases.append(Case(f"attention-head_dims_{dqk}_{dv}-{tag}",
                                  attention_call(variant=variant, mode=mode, head_dims=(dqk, dv)),
                                  rf"head dims \(Dqk, Dv\) = \({dqk}, {dv}\) with 2 KV heads have no kernel"))
            for tensor in ALIGNED_TENSORS:
                if tensor == "out" and variant == "functional":
                    continue
                draft_mode = "separate" if tensor in ("k_draft", "v_draft") else "cache"
                pattern = rf"on CUDA, {tensor} needs 16-byte aligned rows"
                if tensor == "out":
                    make_out = lambda a: misaligned_contiguous(run_attention_shape(a))  # noqa: E731
                    cases.append(Case(f"attention-misaligned_out-{tag}",
                                      attention_call(variant=variant, mode=mode, make_out=make_out), pattern))
                    continue
                cases.append(Case(f"attention-misaligned_{tensor}-{tag}",
                                  attention_call({tensor: lambda a, t=tensor: misaligned(a[t])}, variant, mode,
                                                 draft_mode), pattern))
            cases.append(Case(f"attention-odd_head_stride_q-{tag}",
                              attention_call({"q": lambda a: odd_head_stride(a["q"])}, variant, mode),
                              r"on CUDA, q needs 16-byte aligned rows"))
            for tensor in ("k_cache", "qo_indptr", "tree_mask", "kv_indices"):
                cases.append(Case(f"attention-{tensor}_on_cpu-{tag}",
                                  attention_call({tensor: lambda a, t=tensor: a[t].cpu()}, variant, mode),
                                  rf"{tensor} must be on the device of q \(cuda:0\), got cpu"))
            cases.append(Case(f"attention-q_on_cpu-{tag}", attention_call({"q": lambda a: a["q"].cpu()}, variant, mode),
                              r"k_cache must be on the device of q \(cpu\), got cuda"))
        for name, make_out, pattern in cpu_cases.OUT_CASES:
            if variant == "out":
                for mode in MODES:
                    cases.append(Case(f"attention-out_{name}-out-{mode}",
                                      attention_call(variant="out", mode=mode, make_out=make_out), pattern))
        cases.append(Case(f"attention-too_many_rows-{variant}", too_many_rows(variant),
                          r"too many query rows \(2097152\)"))
        cases.append(Case(f"attention-draft_shape-{variant}",
                          attention_call({"k_draft": lambda a: a["k_draft"][:, :1]}, variant, draft_mode="separate"),
                          r"k_draft must be \[N, Hkv, Dqk\]"))
        for name, change, pattern in cpu_cases.VALUE_CASES:
            cases.append(Case(f"attention-{name}-{variant}-debug-eager", attention_call(change, variant), pattern,
                              debug=True))
            cases.append(Case(f"attention-{name}-{variant}-debug-capture",
                              attention_call(change, variant, "capture", warmup=True), None, debug=True))
            if variant == "out":
                cases.append(Case(f"attention-{name}-out-nodebug-capture",
                                  attention_call(change, "out", "capture", warmup=True), None))
        too_few_words = dict((c[0], c[1]) for c in cpu_cases.VALUE_CASES)["too_few_mask_words"]
        cases.append(Case(f"attention-too_few_mask_words-{variant}-nodebug-eager",
                          attention_call(too_few_words, variant), None))
    return cases


def run_attention_shape(args: dict) -> torch.Tensor:
    """A random output buffer of the call's shape, dtype and device."""
    return cpu_cases.randn_as(args, args["q"].shape[0], args["q"].shape[1], args["v_cache"].shape[2])


def too_many_rows(variant: str):
    """2^21 query rows (all padding: one request of no tokens), past the kernel's 32-bit row indexing."""
    def run():
        n = 2**21
        args = dict(q=torch.randn(n, 1, HEAD_DIM, device="cuda").bfloat16(),
                    k_cache=torch.randn(8, 1, HEAD_DIM, device="cuda").bfloat16(),
                    v_cache=torch.randn(8, 1, HEAD_DIM, device="cuda").bfloat16(),
                    qo_indptr=torch.zeros(2, dtype=torch.int32, device="cuda"),
                    kv_indptr=torch.tensor([0, 4], dtype=torch.int32, device="cuda"),
                    kv_indices=torch.arange(4, dtype=torch.int32, device="cuda"),
                    tree_mask=torch.ones(n, 1, dtype=torch.int32, device="cuda"), sm_scale=0.125)
        run_attention(args, variant)
    return run


def helper_call(fn, *args, mode="eager", warmup=None, **kwargs):
    """A zero-argument function: fn on the arguments moved to CUDA, in `mode` (see in_mode)."""
    def run():
        cuda_args_ = [moved(a) for a in args]
        cuda_kwargs = {k: moved(v) for k, v in kwargs.items()}
        in_mode(mode, lambda: fn(*cuda_args_, **cuda_kwargs), warmup)
    return run


def valid_parents_call():
    parents_op(torch.tensor([-1, 0, 1], dtype=torch.int32, device="cuda"),
               torch.tensor([0, 3], dtype=torch.int32, device="cuda"), 1)


def valid_dense_call():
    dense_op(**{k: moved(v) for k, v in cpu_cases.dense_args().items()})


def parents_op(*args):
    return torch.ops.kdtree.tree_mask_from_parents.default(*args)


def dense_op(**kwargs):
    return torch.ops.kdtree.tree_mask_from_dense.default(**kwargs)


def divergence_op(*args):
    return torch.ops.kdtree.record_divergence.default(*args)


def helper_cases() -> list[Case]:
    cases = []
    for name, args, pattern, is_value in cpu_cases.PARENTS_CASES:
        if is_value:
            cases.append(Case(f"parents-{name}-debug-eager", helper_call(parents_op, *args), pattern, debug=True))
            cases.append(Case(f"parents-{name}-debug-capture",
                              helper_call(parents_op, *args, mode="capture", warmup=valid_parents_call), None,
                              debug=True))
            if name in ("parent_is_self", "parent_after_child", "parent_below_minus_one", "too_few_words"):
                # the kernel's walk stops at a parent that is not an earlier token, and writes only `words` words
                cases.append(Case(f"parents-{name}-nodebug-eager", helper_call(parents_op, *args), None))
        else:
            for mode in MODES:
                cases.append(Case(f"parents-{name}-{mode}", helper_call(parents_op, *args, mode=mode), pattern))
    cases.append(Case("parents-qo_indptr_on_cpu", lambda: parents_op(torch.tensor([-1, 0], dtype=torch.int32,
                                                                                  device="cuda"),
                                                                     cpu_cases.i32([0, 2]), 1),
                      r"qo_indptr must be on the device of parents \(cuda:0\), got cpu"))
    for name, changes, pattern, is_value in cpu_cases.DENSE_CASES:
        kwargs = cpu_cases.dense_args(**changes)
        if is_value:
            cases.append(Case(f"dense-{name}-debug-eager", helper_call(dense_op, **kwargs), pattern, debug=True))
            cases.append(Case(f"dense-{name}-debug-capture",
                              helper_call(dense_op, **kwargs, mode="capture", warmup=valid_dense_call), None,
                              debug=True))
            # the kernel reads custom_mask only inside its bounds and writes only [num_tokens, words]
            cases.append(Case(f"dense-{name}-nodebug-eager", helper_call(dense_op, **kwargs), None))
        else:
            for mode in MODES:
                cases.append(Case(f"dense-{name}-{mode}", helper_call(dense_op, **kwargs, mode=mode), pattern))
    for tensor in ("mask_indptr", "qo_indptr", "prefix_lens"):
        def run(t=tensor):
            kwargs = {k: moved(v) for k, v in cpu_cases.dense_args().items()}
            kwargs[t] = kwargs[t].cpu()
            dense_op(**kwargs)
        cases.append(Case(f"dense-{tensor}_on_cpu", run, rf"{tensor} must be on the device of custom_mask \(cuda:0\)"))
    for name, args, pattern in cpu_cases.DIVERGENCE_CASES:
        for mode in MODES:
            cases.append(Case(f"divergence-{name}-{mode}", helper_call(divergence_op, *args, mode=mode), pattern))
    for mode in MODES:  # made on the device: moving a strided tensor there would make it contiguous
        cases.append(Case(f"divergence-stats_non_contiguous-{mode}",
                          lambda m=mode: in_mode(m, lambda: divergence_op(
                              torch.ones(3, device="cuda"), torch.ones(3, device="cuda"),
                              torch.zeros(6, device="cuda")[::2])),
                          r"stats must be contiguous"))
    cases.append(Case("divergence-stats_on_cpu",
                      lambda: divergence_op(torch.ones(3, device="cuda"), torch.ones(3, device="cuda"), torch.zeros(3)),
                      r"ref and stats must be on the device of out \(cuda:0\)"))
    return cases


# --- the has-kernel answer against the op ------------------------------------------------------------------

SUPPORT_DTYPES = [(torch.bfloat16, None), (torch.float16, None), (torch.float32, None),
                  (torch.bfloat16, torch.float8_e4m3fn), (torch.float16, torch.float8_e4m3fn)]
SUPPORT_HEAD_DIMS = [(64, 64), (128, 128), (256, 256), (576, 512), (96, 96), (128, 64), (32, 32)]
SUPPORT_KV_HEADS = [1, 2, 8]


def support_call(dtype, kv_dtype, head_dims, num_kv_heads):
    """A small real call of this configuration; if it runs, it must match the float64 reference."""
    def run():
        from kdtree_ops.testing.reference import tree_verify_attention_reference
        from test_numerics import TOLERANCES, assert_close_to_reference

        mla = head_dims == (576, 512) and num_kv_heads == 1
        case = make_verify_case(tree_sizes=[7, 33], prefix_lens=[70, 5], num_q_heads=2 * num_kv_heads,
                                num_kv_heads=num_kv_heads, head_dim_qk=head_dims[0], head_dim_v=head_dims[1],
                                dtype=dtype, layout="mla" if mla else "contiguous", device="cuda",
                                generator=torch.Generator().manual_seed(sum(head_dims) + num_kv_heads))
        if kv_dtype is not None:
            case.k_cache, case.v_cache = case.k_cache.to(kv_dtype), case.v_cache.to(kv_dtype)
        out = torch.ops.kdtree.tree_verify_attention.default(*case.args())
        torch.cuda.synchronize()
        assert_close_to_reference(out, tree_verify_attention_reference(*case.args()), TOLERANCES[("cuda", dtype)],
                                  f"{dtype} / {kv_dtype} {head_dims} Hkv {num_kv_heads}")
    return run


def support_configs():
    for dtype, kv_dtype in SUPPORT_DTYPES:
        for dims in SUPPORT_HEAD_DIMS:
            for hkv in SUPPORT_KV_HEADS:
                kv = str(kv_dtype or dtype).removeprefix("torch.")
                yield f"support-{str(dtype).removeprefix('torch.')}-{kv}-{dims[0]}_{dims[1]}-hkv{hkv}", \
                    (dtype, kv_dtype, dims, hkv)


SUPPORT_CONFIGS = dict(support_configs())


# --- the gate: a family not yet verified for the device's class raises unless KDTREE_OPS_UNVERIFIED=1 ----------

GATE_ATTENTION = {  # (family, cache) of the verified-families table -> (dtype, kv dtype, head dims, KV heads)
    ("tree_verify_attention hd64", "same"): (torch.bfloat16, None, (64, 64), 2),
    ("tree_verify_attention hd128", "same"): (torch.float16, None, (128, 128), 2),
    ("tree_verify_attention hd256", "same"): (torch.bfloat16, None, (256, 256), 1),
    ("tree_verify_attention mla", "same"): (torch.bfloat16, None, (576, 512), 1),
    ("tree_verify_attention hd64", "fp8"): (torch.bfloat16, torch.float8_e4m3fn, (64, 64), 2),
    ("tree_verify_attention hd128", "fp8"): (torch.float16, torch.float8_e5m2, (128, 128), 2),
    ("tree_verify_attention hd256", "fp8"): (torch.bfloat16, torch.float8_e4m3fn, (256, 256), 1),
    ("tree_verify_attention mla", "fp8"): (torch.bfloat16, torch.float8_e4m3fn, (576, 512), 1),
}


def ddtree_gate_call(op: str):
    def run():
        from kdtree_ops.ddtree import ops as ddtree

        g = torch.Generator().manual_seed(3)
        logprobs = torch.log_softmax(torch.randn(2, 4, 6, generator=g), -1).sort(-1, descending=True).values
        tokens, roots = torch.randint(0, 9, (2, 4, 6), generator=g), torch.randint(0, 9, (2,), generator=g)
        if op == "ddtree_build_tree":
            ddtree.build_tree(logprobs.cuda(), tokens.cuda(), roots.cuda(), 20)
        elif op == "ddtree_accept_greedy":
            parents = torch.tensor([[-1, 0, 0, 1]] * 2, dtype=torch.int32, device="cuda")
            ddtree.accept_greedy(torch.zeros(2, 4, dtype=torch.int64, device="cuda"), parents,
                                 torch.zeros(2, 4, dtype=torch.int64, device="cuda"), 3)
        elif op == "ddtree_sample_targets":
            from kdtree_ops.ddtree import SamplingParams, sample_targets

            params = SamplingParams.of([dict(temperature=0.7, seed=1), dict()])
            sample_targets(torch.randn(8, 50, device="cuda"), torch.arange(8, device="cuda").view(2, 4),
                           *params.to("cuda").astuple())
        else:
            cache = torch.randn(12, 2, 64, device="cuda").bfloat16()
            ddtree.commit_kv(cache, None, torch.tensor([[0, 2, -1]], dtype=torch.int32, device="cuda"),
                             torch.tensor([[0, 1, 2, 3]], device="cuda"), torch.tensor([[8, 9, 10]], device="cuda"))
        torch.cuda.synchronize()
    return run


def gate_cases() -> list[tuple[Case, tuple[str, str]]]:
    """Each gated call with its row of the verified-families table: every attention family and cache, the fp8 ones
    also by the overlap path (rows of their own, "fp8 overlap"), and the DDTree ops."""
    cases = []
    for (family, cache), config in GATE_ATTENTION.items():
        head = family.split()[-1]
        cases.append((Case(f"gate-{head}-{cache}", support_call(*config), pattern=None, gated=True), (family, cache)))
        if cache == "fp8":
            cases.append((Case(f"gate-{head}-fp8_overlap", support_call(*config), pattern=None, gated=True,
                               fp8_path="overlap"), (family, "fp8 overlap")))
    for op in GATE_DDTREE_OPS:
        cases.append((Case(f"gate-{op}", ddtree_gate_call(op), pattern=None, gated=True), (op, "")))
    return cases


GATE_DDTREE_OPS = ("ddtree_build_tree", "ddtree_accept_greedy", "ddtree_commit_kv", "ddtree_sample_targets")
GATE_FAMILIES = {case.name: key for case, key in gate_cases()}

# --- the fp8 path switch (KDTREE_OPS_FP8_PATH, read at each call) ---------------------------------------------------


def fp8_path_cases() -> list[Case]:
    """The overlap path has gate rows of its own (gate_cases: it raises where its row is not verified for the class,
    without KDTREE_OPS_UNVERIFIED); with the gate lifted it runs and matches the reference (support_call). A value
    that names no path raises for an fp8 call, naming the variable; a cache of q's dtype never reads it."""
    cases = []
    for (family, cache), config in GATE_ATTENTION.items():
        if cache == "fp8":
            cases.append(Case(f"attention-fp8_overlap-{family.split()[-1]}", support_call(*config), None,
                              fp8_path="overlap"))
    fp8_config, same_config = GATE_ATTENTION[("tree_verify_attention hd128", "fp8")], \
        GATE_ATTENTION[("tree_verify_attention hd128", "same")]
    cases.append(Case("attention-fp8_path_unknown-fp8", support_call(*fp8_config),
                      r"KDTREE_OPS_FP8_PATH=sideways names no fp8 path: use widen \(the default\) or overlap",
                      fp8_path="sideways"))
    cases.append(Case("attention-fp8_path_unknown-same", support_call(*same_config), None, fp8_path="sideways"))
    return cases


CASES = attention_cases() + helper_cases() + [case for case, _ in gate_cases()] + fp8_path_cases() + [
    Case(name, support_call(*config), pattern=None) for name, config in SUPPORT_CONFIGS.items()]
CASES_BY_NAME = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES), "case names must be unique"


# --- the parent: run the children, check their results ----------------------------------------------------


@pytest.fixture(scope="module")
def child_results(request, ops):  # ops: the library is built before the children load it
    """name -> future ChildResult, for the cases of this module that the session selected, run a few at a time."""
    yield from fresh_process.run_all({c.name: job(c) for c in fresh_process.selected_params(request, "case")})


def check_child(result: fresh_process.ChildResult, case: Case) -> dict:
    """The child's report, failing the test if the child crashed, hung, or raised something but RuntimeError."""
    failure = result.failure()
    if failure:
        pytest.fail(f"{case.name}: {failure}")
    report = result.report
    if report["raised"] and report["type"] not in ("RuntimeError",):
        pytest.fail(f"{case.name}: raised {report['type']} instead of RuntimeError: {report['message']}")
    return report


@pytest.mark.parametrize("case", [c for c in CASES if not c.name.startswith(("support-", "gate-"))],
                         ids=lambda c: c.name)
def test_bad_input_raises_or_is_skipped(child_results, case):
    report = check_child(child_results[case.name].result(), case)
    if case.pattern is None:
        assert not report["raised"], f"{case.name}: the host raised where its check is skipped: {report['message']}"
    else:
        assert report["raised"], f"{case.name}: no RuntimeError"
        assert re.search(case.pattern, report["message"]), (
            f"{case.name}: message does not match {case.pattern!r}:\n{report['message']}")


@pytest.mark.parametrize("case", [c for c in CASES if c.name.startswith("support-")], ids=lambda c: c.name)
def test_has_kernel_for_matches_the_op(ops, child_results, case):
    """has_kernel_for says yes: a real call runs and matches the reference; says no: the call raises."""
    dtype, kv_dtype, dims, hkv = SUPPORT_CONFIGS[case.name]
    reason = ops.kernel_unsupported_reason("cuda", dtype, *dims, hkv, kv_dtype=kv_dtype)
    assert ops.has_kernel_for("cuda", dtype, *dims, hkv, kv_dtype=kv_dtype) == (reason == "")
    report = check_child(child_results[case.name].result(), case)
    if reason == "":
        assert not report["raised"], f"advertised, but the call raised: {report['message']}"
    else:
        assert report["raised"], f"not advertised ({reason}), but the call ran"


@pytest.mark.parametrize("case", [c for c in CASES if c.name.startswith("gate-")], ids=lambda c: c.name)
def test_unverified_families_raise_until_verified(ops, child_results, case):
    """Without KDTREE_OPS_UNVERIFIED a family the table does not mark verified for the device's class raises
    "not yet verified on a GPU" (has_kernel_for says so too); a verified one runs (and matches the reference)."""
    family, cache = GATE_FAMILIES[case.name]
    launch_class = ops.cuda_launch_class("cuda")
    entry = [f for f in ops.verified_families() if f["family"] == family and f["cache"] == cache]
    assert len(entry) == 1, f"{family} ({cache or 'any cache'}) is missing from the verified-families table"
    verified = entry[0]["verified"][launch_class]
    report = check_child(child_results[case.name].result(), case)
    if verified:
        assert not report["raised"], f"{family} is verified for {launch_class}, but raised: {report['message']}"
    else:
        assert report["raised"] and "not yet verified on a GPU" in report["message"], (
            f"{family} ({cache}) is not verified for the {launch_class} class, but the call "
            + ("raised something else: " + report["message"] if report["raised"] else "ran"))
        assert launch_class in report["message"]


def test_has_kernel_for_follows_the_fp8_path(ops, monkeypatch):
    """The kernel-support answer reads KDTREE_OPS_FP8_PATH at each query, as the op does at each call: the overlap path
    answers by its own gate rows ("not yet verified" where its row is false for the class, until the gate is lifted);
    a value naming no path is a "no" that says so (a cache of q's dtype never reads it)."""
    query = ("cuda", torch.bfloat16, 128, 128, 2)
    fp8 = dict(kv_dtype=torch.float8_e4m3fn)
    monkeypatch.delenv("KDTREE_OPS_UNVERIFIED", raising=False)
    monkeypatch.setenv("KDTREE_OPS_FP8_PATH", "overlap")
    reason = ops.kernel_unsupported_reason(*query, **fp8)
    (row,) = [f for f in ops.verified_families()
              if f["family"] == "tree_verify_attention hd128" and f["cache"] == "fp8 overlap"]
    if row["verified"][ops.cuda_launch_class("cuda")]:
        assert reason == "" and ops.has_kernel_for(*query, **fp8), reason
    else:
        assert "fp8 overlap path (KDTREE_OPS_FP8_PATH=overlap)" in reason and "not yet verified on a GPU" in reason, \
            reason
        assert not ops.has_kernel_for(*query, **fp8)
    same = ops.kernel_unsupported_reason(*query)
    monkeypatch.setenv("KDTREE_OPS_FP8_PATH", "widen")
    assert ops.kernel_unsupported_reason(*query) == same  # a cache of q's dtype: the path changes nothing
    monkeypatch.setenv("KDTREE_OPS_UNVERIFIED", "1")
    monkeypatch.setenv("KDTREE_OPS_FP8_PATH", "overlap")
    assert ops.kernel_unsupported_reason(*query, **fp8) == ""
    monkeypatch.setenv("KDTREE_OPS_FP8_PATH", "sideways")
    assert "KDTREE_OPS_FP8_PATH=sideways names no fp8 path" in ops.kernel_unsupported_reason(*query, **fp8)
    assert ops.kernel_unsupported_reason(*query) == ""
