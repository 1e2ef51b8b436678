"""Which TARGET_VERIFY layer calls the kdtree backend serves, on the CPU with real sglang 0.5.23 objects.

Real pieces: the attention test kit's MockModelRunner (a ModelRunner subclass with a real ReqToTokenPool and
MHATokenToKVPool, on the CPU), a real fp8 MHATokenToKVPool for `--kv-cache-dtype fp8_e4m3`, RadixAttention
layers (an FP8-weight checkpoint's are built with SGLang's Fp8Config, which gives them an Fp8KVCacheMethod,
then loaded as SGLang loads them: scales 1.0 without checkpoint scales), ForwardBatch in TARGET_VERIFY with an
EAGLE tree, SGLang's own DP padding (`ForwardBatch._pad_inputs_to_size`), the backend built through SGLang's
registry, and the ops library's own answer (`ops.kernel_unsupported_reason`).

Served calls are checked against the float64 reference. The parent's kernel is Triton's (no CPU path), so a
fall-back is seen by a recorder in place of `TritonAttnBackend.forward_extend` (what it was called with).
Simulated, and said where: the KV index gather of SGLang's translator (a Triton kernel) runs as torch code;
head dims the op lacks (the CPU kernel takes any, so the op's answer is replaced
for (96, 96) only), a CUDA device for the CPU-only build (the runner's device string), deterministic mode
(the parent's flag, set after the backend is built).
"""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS  # noqa: E402
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8KVCacheMethod  # noqa: E402
from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode  # noqa: E402
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402
from sglang.srt.speculative.eagle_info import EagleVerifyInput  # noqa: E402
from sglang.test.kits.attention_unittest.attention_methods.dense_attention import (  # noqa: E402
    DenseAttentionCase,
    MockModelRunner,
    TinyModelConfig,
)

from kdtree_ops import ops  # noqa: E402
from kdtree_ops.testing.reference import tree_verify_attention_reference  # noqa: E402
from kdtree_ops.sglang import backend as backend_module  # noqa: E402
from kdtree_ops.sglang import plugin  # noqa: E402
from kdtree_ops.testing.trees import ancestor_mask, ancestor_matrix, random_tree  # noqa: E402

plugin.register()

DTYPE = torch.bfloat16
HQ, HKV = 4, 2
T = 8  # draft tokens per request
MAX_CONTEXT = 96
ROUTING_LOGGER = "kdtree_ops.sglang.routing"


class Rig:
    """A CPU model runner (real pools), `num_layers` RadixAttention layers and the kdtree backend."""

    def __init__(self, head_dim=64, kv_dtype=DTYPE, fp8_checkpoint=False, num_layers=2, max_bs=2):
        case = DenseAttentionCase(name="kdtree", backend="kdtree", forward_mode=ForwardMode.TARGET_VERIFY,
                                  num_heads=HQ, num_kv_heads=HKV, page_size=1, prefix_lens=(1,) * max_bs,
                                  extend_lens=(T,) * max_bs)
        config = TinyModelConfig(num_heads=HQ, num_kv_heads=HKV, head_dim=head_dim, hidden_size=256,
                                 context_len=MAX_CONTEXT)
        self.runner = MockModelRunner(case=case, model_config=config, dtype=DTYPE, device="cpu",
                                      max_context_len=MAX_CONTEXT, head_dim=head_dim)
        self.d = head_dim
        kit_pool = self.runner.token_to_kv_pool
        # The pool SGLang builds for --kv-cache-dtype (fp8 stores uint8 and reports the fp8 dtype), all layers.
        self.runner.token_to_kv_pool = self.pool = MHATokenToKVPool(
            size=kit_pool.size, page_size=1, dtype=kv_dtype, head_num=HKV, head_dim=head_dim,
            layer_num=num_layers, device="cpu", enable_memory_saver=False, enable_alt_stream=False)
        self.runner.kv_cache_dtype = kv_dtype
        quant = Fp8Config(is_checkpoint_fp8_serialized=True) if fp8_checkpoint else None
        self.layers = []
        for i in range(num_layers):
            layer = RadixAttention(HQ, head_dim, 1.0 / math.sqrt(head_dim), HKV, layer_id=i, quant_config=quant,
                                   prefix=f"model.layers.{i}.self_attn.attn")
            if fp8_checkpoint:  # what model loading does after the weights (no kv scales in the checkpoint)
                assert isinstance(layer.quant_method, Fp8KVCacheMethod)
                layer.quant_method.process_weights_after_loading(layer)
            self.layers.append(layer)
        if kv_dtype == DTYPE:  # random contents, so a wrong slot shows
            for i in range(num_layers):
                self.pool.get_key_buffer(i).copy_(torch.randn_like(self.pool.get_key_buffer(i)))
                self.pool.get_value_buffer(i).copy_(torch.randn_like(self.pool.get_value_buffer(i)))
        self.runner.kv_index_translator.pack_read_stream = self._pack_read_stream
        self.backend = ATTENTION_BACKENDS["kdtree"](self.runner)
        self.runner.attn_backend = self.backend  # SGLang's padding reads the backend's seq-len fill value


    def _pack_read_stream(self, plan, *, req_pool_indices, seq_lens, indptr, out, **_):
        """The translator's Triton gather (no CPU path) in torch: request b's slots at out[indptr[b]:]."""
        table = self.runner.req_to_token_pool.req_to_token
        for b in range(seq_lens.numel()):
            start, length = int(indptr[b]), int(seq_lens[b])
            out[start: start + length] = table[int(req_pool_indices[b]), :length].to(out.dtype)
        return False


class Step:
    """One EAGLE verify step of `bs` requests with random trees, prefixes and fragmented slots."""

    def __init__(self, rig: Rig, prefix_lens, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.rig, self.prefix_lens, self.bs = rig, list(prefix_lens), len(prefix_lens)
        self.n = self.bs * T
        self.trees = [random_tree(T, generator=gen) for _ in prefix_lens]
        perm = torch.randperm(rig.pool.size - 1, generator=gen) + 1  # slot 0 is SGLang's padding slot
        self.slots, cursor = [], 0
        for prefix in prefix_lens:
            self.slots.append(perm[cursor: cursor + prefix + T])
            cursor += prefix + T
        self.req_pool_indices = torch.randperm(rig.runner.req_to_token_pool.size, generator=gen)[: self.bs]
        self.q = torch.randn(self.n, HQ * rig.d, generator=gen).to(DTYPE)
        self.k = torch.randn(self.n, HKV, rig.d, generator=gen).to(DTYPE)
        self.v = torch.randn(self.n, HKV, rig.d, generator=gen).to(DTYPE)

    def forward_batch(self) -> ForwardBatch:
        table = self.rig.runner.req_to_token_pool.req_to_token
        for b, slots in enumerate(self.slots):
            table[int(self.req_pool_indices[b]), : slots.numel()] = slots.to(table.dtype)
        depth = torch.cat([ancestor_matrix(t).sum(1) - 1 + p for t, p in zip(self.trees, self.prefix_lens)])
        mask = []
        for parents, prefix in zip(self.trees, self.prefix_lens):
            rows = torch.ones(T, prefix + T, dtype=torch.bool)
            rows[:, prefix:] = ancestor_matrix(parents)
            mask.append(rows.flatten())
        fb = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=self.bs,
            input_ids=torch.zeros(self.n, dtype=torch.int64), req_pool_indices=self.req_pool_indices.to(torch.int32),
            seq_lens=torch.tensor(self.prefix_lens, dtype=torch.int32),
            seq_lens_cpu=torch.tensor(self.prefix_lens, dtype=torch.int32),
            out_cache_loc=torch.cat([s[p:] for s, p in zip(self.slots, self.prefix_lens)]),
            seq_lens_sum=sum(self.prefix_lens), positions=depth)
        retrieve = torch.arange(T, dtype=torch.long).repeat(self.bs, 1)
        nxt = torch.full_like(retrieve, -1)
        fb.spec_info = EagleVerifyInput(
            draft_token=torch.zeros(self.n, dtype=torch.int64), custom_mask=torch.cat(mask), positions=depth,
            retrieve_index=retrieve, retrieve_next_token=nxt, retrieve_next_sibling=nxt.clone(),
            retrieve_cum_len=torch.arange(self.bs + 1, dtype=torch.int32) * T, spec_steps=3, topk=4,
            draft_token_num=T, capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=sum(self.prefix_lens),
            seq_lens_cpu=torch.tensor(self.prefix_lens, dtype=torch.int32))
        self.rig.runner.kv_index_translator.bind_own_plan(fb)
        return fb

    def reference(self, layer_id: int) -> torch.Tensor:
        """float64 [n, Hq * D] on this step's metadata and the pool's prefix rows."""
        d, pool = self.rig.d, self.rig.pool
        words = max(1, -(-T // 32))
        out = tree_verify_attention_reference(
            self.q.view(self.n, HQ, d), pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id),
            torch.arange(0, self.n + 1, T, dtype=torch.int32),
            torch.tensor([0, *self.prefix_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32),
            torch.cat([s[:p] for s, p in zip(self.slots, self.prefix_lens)]),
            torch.cat([ancestor_mask(p, words) for p in self.trees]), 1.0 / math.sqrt(d), 0.0, self.k, self.v)
        return out.reshape(self.n, HQ * d)


@pytest.fixture
def parent_calls(monkeypatch):
    """Replaces the parent's forward_extend (Triton, no CPU path) by a recorder; returns its records."""
    calls = []

    def recorder(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        calls.append(layer.layer_id)
        return torch.full((q.shape[0], layer.tp_q_head_num * layer.v_head_dim), 7.0, dtype=q.dtype)

    monkeypatch.setattr(TritonAttnBackend, "forward_extend", recorder)
    return calls


def run_layers(rig: Rig, step: Step, fb: ForwardBatch, q=None, k=None, v=None) -> list:
    outs = []
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=rig.backend)):
        for layer in rig.layers:
            out = layer(step.q if q is None else q, step.k if k is None else k, step.v if v is None else v, fb)
            outs.append(out.reshape(out.shape[0], -1))
    return outs


def assert_served(rig: Rig, step: Step, outs, parent_calls):
    assert parent_calls == [], f"layers {parent_calls} went to the parent"
    for layer, out in zip(rig.layers, outs):
        torch.testing.assert_close(out[: step.n].double(), step.reference(layer.layer_id), atol=2e-2, rtol=2e-2)


def fallback_lines(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.name == ROUTING_LOGGER and r.levelno == logging.WARNING]


def step_fallback_lines(rig: Rig, caplog, sizes, seed: int) -> list:
    """Runs one verify step of every layer (the next metadata init flushes the fallback log); its WARNING lines."""
    step = Step(rig, sizes, seed=seed)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    with caplog.at_level(logging.WARNING):
        run_layers(rig, step, fb)
        rig.backend.init_forward_metadata(fb)
    return fallback_lines(caplog)


# ---- served ----------------------------------------------------------------------------------------------


def test_bf16_checkpoint_bf16_pool_is_served(parent_calls):
    rig = Rig()
    assert rig.layers[0].k_scale is None
    step = Step(rig, (5, 30), seed=1)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    assert_served(rig, step, run_layers(rig, step, fb), parent_calls)


def test_fp8_checkpoint_with_bf16_pool_is_served(parent_calls, caplog):
    """SGLang gives an FP8-weight checkpoint's layers k_scale = v_scale = 1.0 over a bf16 pool: the op serves."""
    rig = Rig(fp8_checkpoint=True)
    layer = rig.layers[0]
    assert layer.k_scale is not None and (layer.k_scale_float, layer.v_scale_float) == (1.0, 1.0)
    assert rig.pool.dtype == DTYPE
    step = Step(rig, (17, 3), seed=2)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    with caplog.at_level(logging.WARNING):
        assert_served(rig, step, run_layers(rig, step, fb), parent_calls)
        rig.backend.init_forward_metadata(step.forward_batch())  # flushes any fall-back line
    assert fallback_lines(caplog) == []


def test_fp8_checkpoint_with_checkpoint_scales_falls_back(parent_calls, caplog):
    """Scales other than 1.0 (a checkpoint that has them) need scaling the op does not apply."""
    rig = Rig(fp8_checkpoint=True)
    for layer in rig.layers:
        layer.k_scale_float, layer.v_scale_float = 0.5, 2.0  # as process_weights_after_loading sets them
    (line,) = step_fallback_lines(rig, caplog, (4, 9), seed=3)
    assert parent_calls == [0, 1]
    assert "layers 0-1" in line and "KV scales (k, v) = (0.5, 2.0)" in line


# ---- fall back -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("fp8_checkpoint", [False, True], ids=["bf16_ckpt", "fp8_ckpt"])
def test_fp8_pool_is_served_where_the_op_has_fp8(parent_calls, kv_dtype, fp8_checkpoint):
    """--kv-cache-dtype fp8_* where the op has an fp8 kernel (the CPU's): served on the pool's fp8 view, scale 1.0."""
    rig = Rig(kv_dtype=kv_dtype, fp8_checkpoint=fp8_checkpoint)
    assert rig.pool.dtype == kv_dtype and rig.pool.store_dtype == torch.uint8
    assert ops.has_kernel_for(torch.device("cpu"), DTYPE, 64, 64, HKV, kv_dtype=kv_dtype)
    step = Step(rig, (6, 11), seed=4)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    assert_served(rig, step, run_layers(rig, step, fb), parent_calls)


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("fp8_checkpoint", [False, True], ids=["bf16_ckpt", "fp8_ckpt"])
def test_fp8_pool_falls_back_with_one_line(parent_calls, caplog, monkeypatch, kv_dtype, fp8_checkpoint):
    """--kv-cache-dtype fp8_* where the op answers no for the pool's dtype (the CUDA kernels today; simulated
    here by the CUDA answer's text for fp8 caches): the parent runs; one line, once."""
    real = ops.kernel_unsupported_reason
    cuda_says = "no CUDA kernel for a Float8 KV cache with BFloat16 queries (the cache must have q's dtype)"

    def answer(device, dtype, dqk, dv, hkv, kv_dtype=None):
        fp8 = kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
        return cuda_says if fp8 else real(device, dtype, dqk, dv, hkv, kv_dtype=kv_dtype)

    monkeypatch.setattr(ops, "kernel_unsupported_reason", answer)
    rig = Rig(kv_dtype=kv_dtype, fp8_checkpoint=fp8_checkpoint)
    assert rig.pool.dtype == kv_dtype and rig.pool.store_dtype == torch.uint8
    op_says = ops.kernel_unsupported_reason(torch.device("cpu"), DTYPE, 64, 64, HKV, kv_dtype=kv_dtype)
    with caplog.at_level(logging.WARNING):
        for seed in (4, 5):  # two steps: the line comes once
            step = Step(rig, (6, 11), seed=seed)
            fb = step.forward_batch()
            rig.backend.init_forward_metadata(fb)
            outs = run_layers(rig, step, fb)
            assert all(torch.all(o == 7.0) for o in outs)  # the parent's (recorded) output is returned
        rig.backend.init_forward_metadata(fb)
    assert parent_calls == [0, 1, 0, 1]
    lines = fallback_lines(caplog)
    assert len(lines) == 1, lines
    assert "layers 0-1" in lines[0] and op_says in lines[0] and str(kv_dtype) in lines[0]


def test_head_dims_the_op_lacks_fall_back(parent_calls, caplog, monkeypatch):
    """Simulated: the CPU kernel takes any head dims, so the op's answer is replaced for (96, 96) only."""
    real = ops.kernel_unsupported_reason

    def answer(device, dtype, dqk, dv, hkv, kv_dtype=None):
        return "no CUDA kernel for head dims (96, 96)" if (dqk, dv) == (96, 96) else real(
            device, dtype, dqk, dv, hkv, kv_dtype=kv_dtype)

    monkeypatch.setattr(ops, "kernel_unsupported_reason", answer)
    rig = Rig(head_dim=96)
    (line,) = step_fallback_lines(rig, caplog, (2, 8), seed=6)
    assert parent_calls == [0, 1]
    assert "no CUDA kernel for head dims (96, 96)" in line and "layers 0-1" in line

    # The same answer machinery serves head dims 64 (control: the replacement is not a blanket no).
    parent_calls.clear()
    rig = Rig(head_dim=64)
    step = Step(rig, (2, 8), seed=6)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    assert_served(rig, step, run_layers(rig, step, fb), parent_calls)


def test_deterministic_inference_falls_back_and_is_accepted(parent_calls, caplog):
    """Simulated flag: --enable-deterministic-inference as the parent reads it. SGLang's check accepts kdtree."""
    from sglang.srt.arg_groups.choices import RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND
    from sglang.srt.arg_groups.overrides import _deterministic_attention_backend

    assert _deterministic_attention_backend(SimpleNamespace(enable_deterministic_inference=True,
                                                            attention_backend="kdtree")) == {}
    with pytest.raises(ValueError, match="supported for deterministic inference"):  # control: not any name
        _deterministic_attention_backend(SimpleNamespace(enable_deterministic_inference=True,
                                                         attention_backend="torch_native"))
    assert "kdtree" in RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND

    rig = Rig()
    rig.backend.enable_deterministic = True
    step = Step(rig, (3, 12), seed=7)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    with caplog.at_level(logging.WARNING):
        run_layers(rig, step, fb)
        rig.backend.init_forward_metadata(fb)
    assert parent_calls == [0, 1]
    (line,) = fallback_lines(caplog)
    assert "deterministic inference" in line and "not batch-invariant" in line


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
    with pytest.raises(RuntimeError, match="no CUDA kernels") as info:
        ATTENTION_BACKENDS["kdtree"](runner)
    for fix in ("KDTREE_OPS_CPU_ONLY", "nvcc", "python -m kdtree_ops build", "--attention-backend triton"):
        assert fix in str(info.value)
    monkeypatch.setenv("KDTREE_VERIFY", "off")  # the op is not used: no library needed
    runner.device = "cpu"
    assert type(ATTENTION_BACKENDS["kdtree"](runner)).__name__ == "KDTreeAttnBackend"
    runner.device = "cuda"
    backend_module.check_cuda_kernels(SimpleNamespace(cuda_kernels_built=lambda: True), "cuda")  # no error


# ---- DP attention padding ----------------------------------------------------------------------------------


@pytest.mark.parametrize("attn_tp_size", [3, 5])
def test_dp_attention_padded_rows_are_served(parent_calls, attn_tp_size):
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
    assert_served(rig, step, outs, parent_calls)
