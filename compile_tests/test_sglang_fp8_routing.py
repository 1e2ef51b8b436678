"""fp8 KV pools under the kdtree backend, on the CPU with real sglang 0.5.23 pools and layers (sglang_rig.py).

An fp8 pool stores value / scale (SGLang's quantizing set_kv_buffer, with the layer's k_scale_float/v_scale_float,
1.0 without checkpoint scales). Where the op answers yes for the pool's dtype (the CPU kernel does), the layer is
served with those scales as the op's k_scale/v_scale, the draft K/V passed in q's dtype, unscaled; every prefix
row is random, so a wrong scale or slot fails the float64 reference. Where the op answers no (the CUDA kernels
today, simulated here by the CUDA answer's text), the base runs with one line.
"""

from __future__ import annotations

import logging

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402
from sglang_rig import (  # noqa: E402
    DTYPE,
    FP8,
    HKV,
    MLARig,
    Rig,
    Step,
    assert_served,
    fallback_lines,
    run_layers,
)

from kdtree_ops import ops  # noqa: E402
from kdtree_ops.sglang.routing import pool_note  # noqa: E402

IDS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
# (FP8-weight checkpoint, its KV scales): a bf16 checkpoint has none; an FP8 one none (1.0) or its own.
CHECKPOINTS = [(False, None), (True, None), (True, (0.5, 2.0))]


@pytest.mark.parametrize("kv_dtype", FP8, ids=IDS.get)
@pytest.mark.parametrize("fp8_checkpoint, scales", CHECKPOINTS, ids=["bf16_ckpt", "fp8_ckpt", "fp8_ckpt_scales"])
def test_fp8_pool_is_served_with_the_layer_scales(base_calls, kv_dtype, fp8_checkpoint, scales):
    rig = Rig(kv_dtype=kv_dtype, fp8_checkpoint=fp8_checkpoint, scales=scales)
    assert rig.pool.dtype == kv_dtype and rig.pool.store_dtype == torch.uint8
    assert ops.has_kernel_for(torch.device("cpu"), DTYPE, 64, 64, HKV, kv_dtype=kv_dtype)
    step = Step(rig, (6, 11), seed=4)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    prefix_rows = rig.pool.get_key_buffer(0)[step.slots[0][:6]].float()
    assert prefix_rows.abs().max() > 0.5  # random prefix contents, not an empty pool
    assert_served(rig, step, run_layers(rig, step, fb), base_calls)
    # The draft rows went in through the pool's quantizing write: stored = k / k_scale.
    k_scale = rig.scales(rig.layers[1])[0]
    stored = rig.pool.get_key_buffer(1)[step.out_cache_loc].float() * k_scale
    torch.testing.assert_close(stored, step.k.float(), atol=0.1 * k_scale + 0.3, rtol=0.15)
    if scales is not None:  # the same step read with scale 1.0 would be wrong: the scales matter here
        wrong = step.reference(0).clone()
        rig.layers[0].k_scale_float, rig.layers[0].v_scale_float = 1.0, 1.0
        assert (wrong - step.reference(0)).abs().max() > 0.1


@pytest.mark.parametrize("kv_dtype", FP8, ids=IDS.get)
@pytest.mark.parametrize("fp8_checkpoint", [False, True], ids=["bf16_ckpt", "fp8_ckpt"])
def test_fp8_pool_falls_back_with_one_line(base_calls, caplog, monkeypatch, kv_dtype, fp8_checkpoint):
    """--kv-cache-dtype fp8_* where the op answers no for the pool's dtype (the CUDA kernels until they are verified;
    simulated by the CUDA answer's text for fp8 caches): the base runs; one line, once."""
    real = ops.kernel_unsupported_reason
    cuda_says = "no CUDA kernel for a Float8 KV cache with BFloat16 queries (the cache must have q's dtype)"

    def answer(device, dtype, dqk, dv, hkv, kv_dtype=None):
        return cuda_says if kv_dtype in FP8 else real(device, dtype, dqk, dv, hkv, kv_dtype=kv_dtype)

    monkeypatch.setattr(ops, "kernel_unsupported_reason", answer)
    rig = Rig(kv_dtype=kv_dtype, fp8_checkpoint=fp8_checkpoint)
    with caplog.at_level(logging.WARNING):
        for seed in (4, 5):  # two steps: the line comes once
            step = Step(rig, (6, 11), seed=seed)
            fb = step.forward_batch()
            rig.backend.init_forward_metadata(fb)
            outs = run_layers(rig, step, fb)
            assert all(torch.all(o == 7.0) for o in outs)  # the base's (recorded) output is returned
        rig.backend.init_forward_metadata(fb)
    assert base_calls == [0, 1, 0, 1]
    lines = fallback_lines(caplog)
    assert len(lines) == 1, lines
    assert "layers 0-1" in lines[0] and cuda_says in lines[0] and str(kv_dtype) in lines[0]


@pytest.mark.parametrize("scale", [1.0, 0.25], ids=["scale1", "scale0.25"])
def test_mla_fp8_pool_draft_rows_read_back_are_dequantized(base_calls, scale):
    """An MLA path that wrote the latent cache itself calls with k = v = None: the draft rows are read back from the
    fp8 pool and passed to the op in q's dtype, scaled back (main passed the fp8 rows, and the op refused them)."""
    rig = MLARig(fp8=True, scales=None if scale == 1.0 else (scale, scale))
    assert rig.pool.dtype == torch.float8_e4m3fn
    step = Step(rig, (13, 5), seed=31)
    fb = step.forward_batch()
    layer = rig.layers[0]
    rig.pool.set_kv_buffer(layer, fb.out_cache_loc, step.k / scale, step.v)  # the model's own (quantizing) write
    rig.backend.init_forward_metadata(fb)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=rig.backend)):
        out = rig.backend.forward(step.q, None, None, layer, fb)
    rows = rig.pool.get_key_buffer(0)[fb.out_cache_loc].float() * scale
    expect = step.reference(0, k_draft=rows.to(DTYPE), v_draft=rows[..., :512].to(DTYPE))
    assert base_calls == []
    torch.testing.assert_close(out.reshape(step.n, -1).double(), expect, atol=3e-2, rtol=3e-2)


def test_mla_fp8_pool_with_draft_kv_is_served_and_written_scaled(base_calls):
    """Absorbed MLA over an fp8 latent pool with a checkpoint scale: written as k / scale, read with the scale."""
    rig = MLARig(fp8=True, scales=(0.5, 0.5))
    step = Step(rig, (9, 20), seed=32)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    outs = run_layers(rig, step, fb)
    assert_served(rig, step, outs, base_calls, atol=3e-2)
    stored = rig.pool.get_key_buffer(0)[fb.out_cache_loc].float() * 0.5
    torch.testing.assert_close(stored, step.k.float(), atol=0.1, rtol=0.15)


def test_block_scaled_pools_fall_back():
    """FP4 and MXFP8 pools carry per-block scale buffers the op does not read: they route to the base."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPoolFP4, MHATokenToKVPoolMXFP8

    for cls in (MHATokenToKVPoolFP4, MHATokenToKVPoolMXFP8):
        pool = cls.__new__(cls)  # the class alone decides: no buffers needed
        pool.k_scale_buffer = [torch.zeros(1)]
        assert f"a block-scaled KV cache ({cls.__name__}" in pool_note(pool, None)
    plain = Rig(build=False).pool
    assert pool_note(plain, None) == ""
