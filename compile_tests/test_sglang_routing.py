"""Which TARGET_VERIFY layer calls the kdtree backend serves, on the CPU with real sglang 0.5.23 objects.

The rig (sglang_rig.py) builds the backend over a Triton base whose verify calls are recorded. Served calls are
checked against the float64 reference. Simulated, and said where: head dims the op lacks (the CPU kernel takes
any, so the op's answer is replaced for (96, 96) only), a CUDA device for the CPU-only build (the runner's device
string), deterministic mode (the backend's flag, set after it is built). fp8 pools: test_sglang_fp8_routing.py.
"""

from __future__ import annotations

import logging
import timeit
from types import SimpleNamespace

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.test.kits.attention_unittest.attention_methods.dense_attention import (  # noqa: E402
    DenseAttentionCase,
    MockModelRunner,
    TinyModelConfig,
)
from sglang_rig import (  # noqa: E402
    DTYPE,
    HKV,
    HQ,
    MAX_CONTEXT,
    T,
    Rig,
    Step,
    assert_served,
    base_backend,
    fallback_lines,
    run_layers,
    step_fallback_lines,
)

from kdtree_ops import ops  # noqa: E402
from kdtree_ops.sglang import backend as backend_module  # noqa: E402


# ---- served ----------------------------------------------------------------------------------------------


def test_bf16_checkpoint_bf16_pool_is_served(base_calls):
    rig = Rig()
    assert rig.layers[0].k_scale is None
    step = Step(rig, (5, 30), seed=1)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    assert_served(rig, step, run_layers(rig, step, fb), base_calls)
    assert rig.backend.op_calls == {0: 1, 1: 1} and rig.backend.base_calls == {}


def test_fp8_checkpoint_with_bf16_pool_is_served(base_calls, caplog):
    """SGLang gives an FP8-weight checkpoint's layers k_scale = v_scale = 1.0 over a bf16 pool: the op serves."""
    rig = Rig(fp8_checkpoint=True)
    layer = rig.layers[0]
    assert layer.k_scale is not None and (layer.k_scale_float, layer.v_scale_float) == (1.0, 1.0)
    assert rig.pool.dtype == DTYPE
    step = Step(rig, (17, 3), seed=2)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    with caplog.at_level(logging.WARNING):
        assert_served(rig, step, run_layers(rig, step, fb), base_calls)
        rig.backend.init_forward_metadata(step.forward_batch())  # flushes any fall-back line
    assert fallback_lines(caplog) == []


def test_fp8_checkpoint_scales_over_a_bf16_pool_fall_back(base_calls, caplog):
    """Scales other than 1.0 over a bf16 pool: SGLang's Triton kernel multiplies that cache by them; the op scales
    fp8 caches only (and refuses scales for others), so the base serves, with the line saying so."""
    rig = Rig(fp8_checkpoint=True, scales=(0.5, 2.0))
    assert (rig.layers[0].k_scale_float, rig.layers[0].v_scale_float) == (0.5, 2.0)
    (line,) = step_fallback_lines(rig, caplog, (4, 9), seed=3)
    assert base_calls == [0, 1]
    assert "layers 0-1" in line and "runs on triton's kernel" in line
    assert "KV scales (k, v) = (0.5, 2.0) over a torch.bfloat16 KV cache" in line and "fp8 caches only" in line


# ---- fall back -------------------------------------------------------------------------------------------


def test_head_dims_the_op_lacks_fall_back(base_calls, caplog, monkeypatch):
    """Simulated: the CPU kernel takes any head dims, so the op's answer is replaced for (96, 96) only."""
    real = ops.kernel_unsupported_reason

    def answer(device, dtype, dqk, dv, hkv, kv_dtype=None):
        return "no CUDA kernel for head dims (96, 96)" if (dqk, dv) == (96, 96) else real(
            device, dtype, dqk, dv, hkv, kv_dtype=kv_dtype)

    monkeypatch.setattr(ops, "kernel_unsupported_reason", answer)
    rig = Rig(head_dim=96)
    (line,) = step_fallback_lines(rig, caplog, (2, 8), seed=6)
    assert base_calls == [0, 1]
    assert "no CUDA kernel for head dims (96, 96)" in line and "layers 0-1" in line

    # The same answer machinery serves head dims 64 (control: the replacement is not a blanket no).
    base_calls.clear()
    rig = Rig(head_dim=64)
    step = Step(rig, (2, 8), seed=6)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    assert_served(rig, step, run_layers(rig, step, fb), base_calls)


def test_deterministic_inference_falls_back_and_is_accepted(base_calls, caplog):
    """Simulated flag: --enable-deterministic-inference as the backend reads it. SGLang's check accepts kdtree."""
    from sglang.srt.arg_groups.choices import RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND
    from sglang.srt.arg_groups.overrides import _deterministic_attention_backend

    assert _deterministic_attention_backend(SimpleNamespace(enable_deterministic_inference=True,
                                                            attention_backend="kdtree")) == {}
    with pytest.raises(ValueError, match="supported for deterministic inference"):  # control: not any name
        _deterministic_attention_backend(SimpleNamespace(enable_deterministic_inference=True,
                                                         attention_backend="torch_native"))
    assert "kdtree" in RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND

    rig = Rig()
    rig.backend._deterministic = True
    (line,) = step_fallback_lines(rig, caplog, (3, 12), seed=7)
    assert base_calls == [0, 1]
    assert "deterministic inference" in line and "not batch-invariant" in line


def test_inputs_the_op_lacks_fall_back_per_call(base_calls, caplog):
    """A call carrying attention sinks takes the slow path and the base; the same layer without them is served."""
    rig = Rig(num_layers=1)
    step = Step(rig, (6, 10), seed=12)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    with caplog.at_level(logging.WARNING), torch.no_grad():
        sinks = torch.zeros(HQ)
        out = rig.backend.forward(step.q, step.k, step.v, rig.layers[0], fb, sinks=sinks)
        assert torch.all(out == 7.0) and base_calls == [0]
        served = rig.backend.forward(step.q, step.k, step.v, rig.layers[0], fb)
        rig.backend.init_forward_metadata(fb)
    torch.testing.assert_close(served.double(), step.reference(0), atol=2e-2, rtol=2e-2)
    (line,) = fallback_lines(caplog)
    assert "layer 0" in line and "the call carries sinks" in line


def test_unprepared_verify_step_falls_back_with_a_line(base_calls, caplog):
    """A TARGET_VERIFY forward that no metadata init prepared (the last one was a decode batch) goes to the base
    and says so (main ran the parent silently)."""
    rig = Rig()
    step = Step(rig, (4, 4), seed=13)
    fb = step.forward_batch()
    decode = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=2)
    rig.backend.base.init_forward_metadata = lambda batch: None  # the base's decode prep is not under test
    rig.backend.init_forward_metadata(decode)
    with caplog.at_level(logging.WARNING):
        outs = run_layers(rig, step, fb)
        rig.backend.init_forward_metadata(decode)
    assert all(torch.all(o == 7.0) for o in outs) and base_calls == [0, 1]
    (line,) = fallback_lines(caplog)
    assert "layers 0-1" in line and "verify metadata was not prepared" in line


# ---- routes are decided once per layer ------------------------------------------------------------------------


def test_route_is_decided_once_per_layer(base_calls, monkeypatch):
    """The op's answer is asked once per layer configuration, not once per call; later calls hit the per-layer
    cache (measured on this machine: ~2.2 us a call before, of it 1.6 us rebuilding the configuration)."""
    asked = []
    real = ops.kernel_unsupported_reason

    def counted(*args, **kwargs):
        asked.append(args[1:])
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "kernel_unsupported_reason", counted)
    rig = Rig(num_layers=3)
    for seed in (20, 21, 22):
        step = Step(rig, (3, 7), seed=seed)
        fb = step.forward_batch()
        rig.backend.init_forward_metadata(fb)
        run_layers(rig, step, fb)
    assert len(asked) == 1, asked  # three layers of one configuration, three steps
    assert set(rig.backend._routes) == {0, 1, 2} and rig.backend.op_calls == {0: 3, 1: 3, 2: 3}
    layer, q = rig.layers[1], step.q
    per_call = min(timeit.repeat(lambda: rig.backend._route(q, layer, fb, {}), number=20000, repeat=3)) / 20000
    assert per_call < 2e-6, f"routing a cached layer took {per_call * 1e6:.2f} us"


# ---- CPU-only build on a CUDA server ---------------------------------------------------------------------


def test_cpu_only_build_on_a_cuda_server_fails_when_the_backend_is_built(monkeypatch):
    """Simulated: the runner says device "cuda"; the library is this machine's build, and where that build holds
    CUDA kernels (CI compiles them) `cuda_kernels_built` is made to answer as a CPU-only build's would."""
    if ops.cuda_kernels_built():
        monkeypatch.setattr(ops, "cuda_kernels_built", lambda: False)
    case = DenseAttentionCase(name="kdtree", backend="kdtree", forward_mode=ForwardMode.TARGET_VERIFY,
                              num_heads=HQ, num_kv_heads=HKV, page_size=1, prefix_lens=(1,), extend_lens=(T,))
    config = TinyModelConfig(num_heads=HQ, num_kv_heads=HKV, head_dim=64, hidden_size=256, context_len=MAX_CONTEXT)
    runner = MockModelRunner(case=case, model_config=config, dtype=DTYPE, device="cpu",
                             max_context_len=MAX_CONTEXT, head_dim=64)
    runner.device = "cuda"
    with base_backend("triton"), pytest.raises(RuntimeError, match="no CUDA kernels") as info:
        ATTENTION_BACKENDS["kdtree"](runner)
    for fix in ("KDTREE_OPS_CPU_ONLY", "nvcc", "python -m kdtree_ops build", "--attention-backend triton"):
        assert fix in str(info.value)
    monkeypatch.setenv("KDTREE_VERIFY", "off")  # the op is not used: no library needed
    runner.device = "cpu"
    with base_backend("triton"):
        assert type(ATTENTION_BACKENDS["kdtree"](runner)).__name__ == "KDTreeAttnBackend"
    backend_module.check_cuda_kernels(SimpleNamespace(cuda_kernels_built=lambda: True), "cuda")  # no error


# ---- DP attention padding ----------------------------------------------------------------------------------


@pytest.mark.parametrize("attn_tp_size", [3, 5])
def test_dp_attention_padded_rows_are_served(base_calls, attn_tp_size):
    """SGLang pads q to ceil_align(bs * T, attn_tp_size) rows (prepare_mlp_sync_batch -> _pad_inputs_to_size);
    the requests' rows match the reference, the padded rows come out zero."""
    rig = Rig(max_bs=4)
    step = Step(rig, (9, 21), seed=8)
    fb = step.forward_batch()
    num_tokens = -(-step.n // attn_tp_size) * attn_tp_size
    bs = num_tokens // T  # what prepare_mlp_sync_batch sets for a verify batch: still the two requests
    assert bs == step.bs
    fb._pad_inputs_to_size(rig.runner, num_tokens, bs)
    fb.batch_size = bs
    assert fb.out_cache_loc.shape[0] == num_tokens > step.n
    rig.backend.init_forward_metadata(fb)
    gen = torch.Generator().manual_seed(9)
    pad = num_tokens - step.n
    q = torch.cat([step.q, torch.randn(pad, HQ * rig.d, generator=gen).to(DTYPE)])
    k = torch.cat([step.k, torch.randn(pad, HKV, rig.d, generator=gen).to(DTYPE)])
    v = torch.cat([step.v, torch.randn(pad, HKV, rig.d, generator=gen).to(DTYPE)])
    outs = run_layers(rig, step, fb, q, k, v)
    assert all(o.shape[0] == num_tokens for o in outs)
    assert all(not o[step.n:].any() for o in outs)  # the padded rows (past the requests): zeros
    assert_served(rig, step, outs, base_calls)
