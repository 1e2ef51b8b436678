"""A CPU rig of real sglang 0.5.23 objects around the kdtree backend, shared by the routing suites.

Real pieces: the attention test kit's mock model runners (ModelRunner subclasses with a real ReqToTokenPool and
MHA/MLA token-to-KV pools, on the CPU), SGLang's fp8 pools for `--kv-cache-dtype fp8_*`, RadixAttention layers
(an FP8-weight checkpoint's are built with SGLang's Fp8Config, which gives them an Fp8KVCacheMethod, then loaded
as SGLang loads them: scales 1.0 without checkpoint scales), ForwardBatch in TARGET_VERIFY with an EAGLE tree, and
the backend built through SGLang's registry over a named base (`KDTREE_BASE_BACKEND`, triton unless a test says
otherwise) and the ops library's own answer (`ops.kernel_unsupported_reason`).

The base's kernel is Triton's (no CPU path), so its verify calls are seen by a recorder in place of
`TritonAttnBackend.forward_extend` (conftest.py's `base_calls` fixture). Simulated, and said where: the KV index gather of SGLang's
translator (a Triton kernel) runs as torch code.
"""

from __future__ import annotations

import logging
import math
import os
from contextlib import contextmanager

import torch

from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8KVCacheMethod
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.speculative.eagle_info import EagleVerifyInput
from sglang.test.kits.attention_unittest.attention_methods.dense_attention import (
    DenseAttentionCase,
    MockModelRunner,
    TinyModelConfig,
)
from sglang.test.kits.attention_unittest.attention_methods.mla_attention import (
    MLAAttentionCase,
    MockMLAModelRunner,
    TinyMLAModelConfig,
)

from kdtree_ops.sglang import plugin
from kdtree_ops.testing.reference import tree_verify_attention_reference
from kdtree_ops.testing.trees import ancestor_mask, ancestor_matrix, random_tree

plugin.register()

DTYPE = torch.bfloat16
HQ, HKV = 4, 2
T = 8  # draft tokens per request
MAX_CONTEXT = 96
ROUTING_LOGGER = "kdtree_ops.sglang.routing"
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
BASE_OUTPUT = 7.0  # what the recorded base returns


@contextmanager
def base_backend(name: str | None):
    """KDTREE_BASE_BACKEND while a backend is built (None: unset, SGLang's default)."""
    saved = os.environ.pop("KDTREE_BASE_BACKEND", None)
    if name is not None:
        os.environ["KDTREE_BASE_BACKEND"] = name
    try:
        yield
    finally:
        os.environ.pop("KDTREE_BASE_BACKEND", None)
        if saved is not None:
            os.environ["KDTREE_BASE_BACKEND"] = saved


def load_kv_scales(layer, scales) -> None:
    """Loads a checkpoint's KV scales into the layer as SGLang's loader does (none: the loader leaves -1), then
    runs Fp8KVCacheMethod.process_weights_after_loading (k_scale_float/v_scale_float; 1.0 without scales)."""
    if scales is not None:
        with torch.no_grad():
            layer.k_scale.fill_(scales[0])
            layer.v_scale.fill_(scales[1])
    layer.quant_method.process_weights_after_loading(layer)


def random_fill(buf: torch.Tensor, gen: torch.Generator) -> None:
    """Random contents (fp8 pools: random values quantized), so a wrong slot or scale shows."""
    buf.copy_(torch.randn(buf.shape, generator=gen).to(buf.dtype))


class Rig:
    """A CPU model runner (real pools), `num_layers` RadixAttention layers and the kdtree backend."""

    def __init__(self, head_dim=64, kv_dtype=DTYPE, fp8_checkpoint=False, num_layers=2, max_bs=2, base="triton",
                 scales=None, build=True):
        case = DenseAttentionCase(name="kdtree", backend="kdtree", forward_mode=ForwardMode.TARGET_VERIFY,
                                  num_heads=HQ, num_kv_heads=HKV, page_size=1, prefix_lens=(1,) * max_bs,
                                  extend_lens=(T,) * max_bs)
        config = TinyModelConfig(num_heads=HQ, num_kv_heads=HKV, head_dim=head_dim, hidden_size=256,
                                 context_len=MAX_CONTEXT)
        self.runner = MockModelRunner(case=case, model_config=config, dtype=DTYPE, device="cpu",
                                      max_context_len=MAX_CONTEXT, head_dim=head_dim)
        self.d, self.mla = head_dim, False
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
            if fp8_checkpoint:  # what model loading does after the weights (scales: the checkpoint's, if any)
                assert isinstance(layer.quant_method, Fp8KVCacheMethod)
                load_kv_scales(layer, scales)
            self.layers.append(layer)
        self.runner.model.layers = torch.nn.ModuleList(self.layers)  # what a loaded model runner holds
        gen = torch.Generator().manual_seed(1234)
        for i in range(num_layers):
            random_fill(self.pool.get_key_buffer(i), gen)
            random_fill(self.pool.get_value_buffer(i), gen)
        self.runner.kv_index_translator.pack_read_stream = self._pack_read_stream
        self.base = base
        if build:
            self.build()

    def build(self):
        with base_backend(self.base):
            self.backend = ATTENTION_BACKENDS["kdtree"](self.runner)
        self.runner.attn_backend = self.backend  # SGLang's padding reads the backend's seq-len fill value
        return self.backend

    def scales(self, layer) -> tuple[float, float]:
        """The scales the cache's stored values carry (fp8 pools: the layer's, else 1.0)."""
        if self.pool.dtype in FP8 and layer.k_scale is not None:
            return layer.k_scale_float, layer.v_scale_float
        return 1.0, 1.0

    def _pack_read_stream(self, plan, *, req_pool_indices, seq_lens, indptr, out, **_):
        """The translator's Triton gather (no CPU path) in torch: request b's slots at out[indptr[b]:]."""
        table = self.runner.req_to_token_pool.req_to_token
        for b in range(seq_lens.numel()):
            start, length = int(indptr[b]), int(seq_lens[b])
            out[start: start + length] = table[int(req_pool_indices[b]), :length].to(out.dtype)
        return False


class MLARig(Rig):
    """The same over SGLang's MLA pool ([S, 1, 576], the value a view of its first 512), one absorbed MLA layer."""

    def __init__(self, fp8=False, scales=None, base="triton", heads=4):
        self.hq, self.kv_lora, self.rope = heads, 512, 64
        case = MLAAttentionCase(name="kdtree", backend="kdtree", forward_mode=ForwardMode.TARGET_VERIFY,
                                num_heads=heads, page_size=1, prefix_lens=(1, 1), extend_lens=(T, T))
        config = TinyMLAModelConfig(num_heads=heads, kv_lora_rank=512, qk_rope_head_dim=64, hidden_size=256,
                                    context_len=MAX_CONTEXT)
        self.runner = MockMLAModelRunner(case=case, model_config=config, dtype=DTYPE, device="cpu",
                                         max_context_len=MAX_CONTEXT, kv_lora_rank=512, qk_rope_head_dim=64,
                                         fp8_kv_cache=fp8)
        self.d, self.mla, self.pool = 576, True, self.runner.token_to_kv_pool
        quant = Fp8Config(is_checkpoint_fp8_serialized=True) if scales is not None else None
        layer = RadixAttention(heads, 576, 576 ** -0.5, 1, layer_id=0, v_head_dim=512, quant_config=quant,
                               prefix="model.layers.0.self_attn.attn_mqa")
        if scales is not None:
            load_kv_scales(layer, (scales[0], scales[0]))  # MLA: one latent row, one scale
        self.layers = [layer]
        random_fill(self.pool.get_key_buffer(0), torch.Generator().manual_seed(4321))
        self.runner.kv_index_translator.pack_read_stream = self._pack_read_stream
        self.base = base
        self.build()


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
        hq, hkv = (rig.hq, 1) if rig.mla else (HQ, HKV)
        self.hq, self.hkv = hq, hkv
        self.q = torch.randn(self.n, hq * rig.d, generator=gen).to(DTYPE)
        self.k = torch.randn(self.n, hkv, rig.d, generator=gen).to(DTYPE)
        self.v = self.k[..., :512] if rig.mla else torch.randn(self.n, HKV, rig.d, generator=gen).to(DTYPE)

    @property
    def out_cache_loc(self) -> torch.Tensor:
        return torch.cat([s[p:] for s, p in zip(self.slots, self.prefix_lens)])

    def custom_mask(self) -> torch.Tensor:
        """SGLang's FULL_MASK of the step's trees (flat bool)."""
        mask = []
        for parents, prefix in zip(self.trees, self.prefix_lens):
            rows = torch.ones(T, prefix + T, dtype=torch.bool)
            rows[:, prefix:] = ancestor_matrix(parents)
            mask.append(rows.flatten())
        return torch.cat(mask)

    def forward_batch(self, custom_mask: torch.Tensor | None = None) -> ForwardBatch:
        table = self.rig.runner.req_to_token_pool.req_to_token
        for b, slots in enumerate(self.slots):
            table[int(self.req_pool_indices[b]), : slots.numel()] = slots.to(table.dtype)
        depth = torch.cat([ancestor_matrix(t).sum(1) - 1 + p for t, p in zip(self.trees, self.prefix_lens)])
        fb = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=self.bs,
            input_ids=torch.zeros(self.n, dtype=torch.int64), req_pool_indices=self.req_pool_indices.to(torch.int32),
            seq_lens=torch.tensor(self.prefix_lens, dtype=torch.int32),
            seq_lens_cpu=torch.tensor(self.prefix_lens, dtype=torch.int32),
            out_cache_loc=self.out_cache_loc, seq_lens_sum=sum(self.prefix_lens), positions=depth)
        retrieve = torch.arange(T, dtype=torch.long).repeat(self.bs, 1)
        nxt = torch.full_like(retrieve, -1)
        fb.spec_info = EagleVerifyInput(
            draft_token=torch.zeros(self.n, dtype=torch.int64),
            custom_mask=self.custom_mask() if custom_mask is None else custom_mask, positions=depth,
            retrieve_index=retrieve, retrieve_next_token=nxt, retrieve_next_sibling=nxt.clone(),
            retrieve_cum_len=torch.arange(self.bs + 1, dtype=torch.int32) * T, spec_steps=3, topk=4,
            draft_token_num=T, capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=sum(self.prefix_lens),
            seq_lens_cpu=torch.tensor(self.prefix_lens, dtype=torch.int32))
        self.rig.runner.kv_index_translator.bind_own_plan(fb)
        return fb

    def reference(self, layer_id: int, k_draft=None, v_draft=None) -> torch.Tensor:
        """float64 [n, Hq * Dv] on this step's metadata and the pool's prefix rows (dequantized)."""
        rig, pool = self.rig, self.rig.pool
        layer = rig.layers[layer_id]
        k_scale, v_scale = rig.scales(layer)
        words = max(1, -(-T // 32))
        k_draft = self.k if k_draft is None else k_draft
        v_draft = self.v if v_draft is None else v_draft
        out = tree_verify_attention_reference(
            self.q.view(self.n, self.hq, rig.d), pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id),
            torch.arange(0, self.n + 1, T, dtype=torch.int32),
            torch.tensor([0, *self.prefix_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32),
            torch.cat([s[:p] for s, p in zip(self.slots, self.prefix_lens)]),
            torch.cat([ancestor_mask(p, words) for p in self.trees]), layer.scaling, 0.0, k_draft, v_draft,
            k_scale, v_scale)
        return out.reshape(self.n, -1)


def run_layers(rig: Rig, step: Step, fb: ForwardBatch, q=None, k=None, v=None) -> list:
    outs = []
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=rig.backend)):
        for layer in rig.layers:
            out = layer(step.q if q is None else q, step.k if k is None else k, step.v if v is None else v, fb)
            outs.append(out.reshape(out.shape[0], -1))
    return outs


def assert_served(rig: Rig, step: Step, outs, base_calls, atol=2e-2):
    assert base_calls == [], f"layers {base_calls} went to the base"
    for layer, out in zip(rig.layers, outs):
        torch.testing.assert_close(out[: step.n].double(), step.reference(layer.layer_id), atol=atol, rtol=2e-2)


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
