"""KDTreeAttnBackend inside real SGLang 0.5.23 objects, on a CUDA GPU.

Real ReqToTokenPool, MHA/MLA token-to-KV pools (through SGLang's attention test kit's mock model runners,
which subclass ModelRunner), RadixAttention layers, ForwardBatch in TARGET_VERIFY with EAGLE (topk > 1),
DFLASH and NGRAM spec infos. Each case checks the `kdtree` backend against the float64 reference
(`kdtree_ops.testing.reference`) and against the `triton` backend:
- eagerly (`init_forward_metadata` then the layer forward);
- through SGLang's graph contract: `init_cuda_graph_state` -> `init_forward_metadata_out_graph(in_capture=True)`
  -> capture (with `init_forward_metadata_in_graph` inside) -> replay with a *different* tree, prefix lengths
  and slots; the capture-time spec info carries no mask, as DFLASH's and some runners' do;
- `torch.compile(fullgraph=True)` of the layer forward (zero graph breaks; the triton backend's count is
  recorded in KDTREE_SGLANG_RESULTS, default /tmp/kdtree_sglang_gpu_results.json);
- validate mode inside a captured graph: a planted divergence shows up in the stats, read after replay.

Slots are fragmented by our own layout (a random permutation of the pool); the kit's graph-mode runner is not
used (its eager-in-graph leg rewrites prefix K/V contiguously while req_to_token points elsewhere).
"""

from __future__ import annotations

import json
import math
import os

import pytest
from requires import require
import torch

sglang = require("sglang", "pip install -e '.[test,sglang]'")

from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS  # noqa: E402
from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import (  # noqa: E402
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402
from sglang.srt.speculative.dflash_info import DFlashVerifyInput  # noqa: E402
from sglang.srt.speculative.eagle_info import EagleVerifyInput  # noqa: E402
from sglang.srt.speculative.ngram_info import NgramVerifyInput  # noqa: E402
from sglang.test.kits.attention_unittest.attention_methods.dense_attention import (  # noqa: E402
    DenseAttentionCase,
    MockModelRunner,
    TinyModelConfig,
)
from sglang.test.kits.attention_unittest.attention_methods.mla_attention import (  # noqa: E402
    MLAAttentionCase,
    MockMLAModelRunner,
    TinyMLAModelConfig,
)

from kdtree_ops.testing.reference import tree_verify_attention_reference  # noqa: E402
from kdtree_ops.sglang import plugin  # noqa: E402
from kdtree_ops.testing.trees import ancestor_matrix, ancestor_mask, random_tree  # noqa: E402

plugin.register()

DEVICE = "cuda"
DTYPE = torch.bfloat16
ATOL = RTOL = 2e-2
MAX_CONTEXT = 320
RESULTS_PATH = os.environ.get("KDTREE_SGLANG_RESULTS", "/tmp/kdtree_sglang_gpu_results.json")

# (name, tree tokens T, prefix lengths): T is shared by a batch (SGLang's verify width); trees differ.
SHAPES = [("b1_t8", 8, (37,)), ("b3_t16", 16, (5, 120, 64)), ("b2_t40", 40, (200, 1))]
SPEC_KINDS = ["eagle", "ngram", "dflash"]


def _record(key: str, value) -> None:
    data = {}
    if os.path.exists(RESULTS_PATH):
        with open(RESULTS_PATH) as f:
            data = json.load(f)
    data[key] = value
    with open(RESULTS_PATH, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)


# ---- fixtures: a runner, its pools, and a layer ----------------------------------------------------------


class Setup:
    """A mock SGLang model runner (real pools), one RadixAttention layer, and the two backends."""

    def __init__(self, arch: str, max_bs: int, tree_tokens: int, seed: int = 0):
        torch.manual_seed(seed)
        self.arch = arch
        extend = (tree_tokens,) * max_bs
        prefix = (1,) * max_bs
        if arch == "mha":
            self.hq, self.hkv, self.dqk, self.dv = 8, 2, 128, 128
            case = DenseAttentionCase(name="kdtree", backend="kdtree", forward_mode=ForwardMode.TARGET_VERIFY,
                                      num_heads=self.hq, num_kv_heads=self.hkv, page_size=1,
                                      prefix_lens=prefix, extend_lens=extend)
            config = TinyModelConfig(num_heads=self.hq, num_kv_heads=self.hkv, head_dim=self.dqk,
                                     hidden_size=256, context_len=MAX_CONTEXT)
            self.runner = MockModelRunner(case=case, model_config=config, dtype=DTYPE, device=DEVICE,
                                          max_context_len=MAX_CONTEXT, head_dim=self.dqk,
                                          disable_cuda_graph=False)
        else:
            self.hq, self.hkv, self.dqk, self.dv = 16, 1, 576, 512
            case = MLAAttentionCase(name="kdtree", backend="kdtree", forward_mode=ForwardMode.TARGET_VERIFY,
                                    num_heads=self.hq, page_size=1, prefix_lens=prefix, extend_lens=extend)
            config = TinyMLAModelConfig(num_heads=self.hq, kv_lora_rank=512, qk_rope_head_dim=64,
                                        hidden_size=256, context_len=MAX_CONTEXT)
            self.runner = MockMLAModelRunner(case=case, model_config=config, dtype=DTYPE, device=DEVICE,
                                             max_context_len=MAX_CONTEXT, kv_lora_rank=512, qk_rope_head_dim=64,
                                             disable_cuda_graph=False)
        self.scale = 1.0 / math.sqrt(self.dqk)
        self.layer = RadixAttention(self.hq, self.dqk, self.scale, self.hkv, layer_id=0, v_head_dim=self.dv)
        self.pool = self.runner.token_to_kv_pool
        self.num_slots = self.pool.get_key_buffer(0).shape[0]
        # Random contents everywhere, so a wrong slot shows.
        self.pool.get_key_buffer(0).copy_(torch.randn_like(self.pool.get_key_buffer(0)))
        if arch == "mha":
            self.pool.get_value_buffer(0).copy_(torch.randn_like(self.pool.get_value_buffer(0)))

    def backend(self, name: str):
        return ATTENTION_BACKENDS[name](self.runner)


class Step:
    """One verify step: per-request trees and prefixes, fragmented slots, q/k/v and a spec info."""

    def __init__(self, setup: Setup, spec_kind: str, tree_tokens: int, prefix_lens, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.setup, self.spec_kind, self.t = setup, spec_kind, tree_tokens
        self.prefix_lens = list(prefix_lens)
        self.bs = len(self.prefix_lens)
        self.n = self.bs * tree_tokens
        if spec_kind == "dflash":  # a block verified in causal order
            self.trees = [list(range(-1, tree_tokens - 1)) for _ in range(self.bs)]
        else:
            self.trees = [random_tree(tree_tokens, generator=gen) for _ in range(self.bs)]
        # Fragmented slots: a random permutation of the pool (slot 0 stays SGLang's padding slot).
        perm = torch.randperm(setup.num_slots - 1, generator=gen) + 1
        self.slots, cursor = [], 0
        for prefix in self.prefix_lens:
            self.slots.append(perm[cursor: cursor + prefix + tree_tokens])
            cursor += prefix + tree_tokens
        self.req_pool_indices = torch.randperm(setup.runner.req_to_token_pool.size, generator=gen)[: self.bs]
        self.q = torch.randn(self.n, setup.hq * setup.dqk, dtype=DTYPE, device=DEVICE)
        self.k = torch.randn(self.n, setup.hkv, setup.dqk, dtype=DTYPE, device=DEVICE)
        self.v = (self.k[..., : setup.dv] if setup.arch == "mla"
                  else torch.randn(self.n, setup.hkv, setup.dv, dtype=DTYPE, device=DEVICE))

    def write_req_to_token(self) -> None:
        table = self.setup.runner.req_to_token_pool.req_to_token
        for b, slots in enumerate(self.slots):
            table[int(self.req_pool_indices[b]), : slots.numel()] = slots.to(table.dtype).to(DEVICE)

    @property
    def out_cache_loc(self) -> torch.Tensor:
        return torch.cat([s[p:] for s, p in zip(self.slots, self.prefix_lens)]).to(DEVICE)

    @property
    def positions(self) -> torch.Tensor:
        depth = [ancestor_matrix(t).sum(1) - 1 for t in self.trees]
        return torch.cat([d + p for d, p in zip(depth, self.prefix_lens)]).to(DEVICE)

    def custom_mask(self) -> torch.Tensor:
        rows = []
        for parents, prefix in zip(self.trees, self.prefix_lens):
            m = torch.ones(self.t, prefix + self.t, dtype=torch.bool)
            m[:, prefix:] = ancestor_matrix(parents)
            rows.append(m.flatten())
        return torch.cat(rows).to(DEVICE)

    def spec_info(self, with_mask: bool = True):
        mask = self.custom_mask() if with_mask else None
        draft = torch.zeros(self.n, dtype=torch.int64, device=DEVICE)
        if self.spec_kind == "dflash":
            return DFlashVerifyInput(draft_token=draft, positions=self.positions, draft_token_num=self.t, topk=1,
                                     custom_mask=None, capture_hidden_mode=CaptureHiddenMode.FULL)
        retrieve = torch.arange(self.t, dtype=torch.long, device=DEVICE).repeat(self.bs, 1)
        nxt = torch.full_like(retrieve, -1)
        if self.spec_kind == "ngram":
            # Without a mask, 0.5.23's NgramVerifyInput takes its device from new_seq_lens (the V2 worker's).
            new_seq_lens = torch.tensor([p + self.t for p in self.prefix_lens], dtype=torch.int64, device=DEVICE)
            return NgramVerifyInput(draft_token=draft, custom_mask=mask, positions=self.positions,
                                    retrieve_index=retrieve, retrieve_next_token=nxt,
                                    retrieve_next_sibling=nxt.clone(), draft_token_num=self.t,
                                    new_seq_lens=new_seq_lens)
        return EagleVerifyInput(
            draft_token=draft, custom_mask=mask, positions=self.positions, retrieve_index=retrieve,
            retrieve_next_token=nxt, retrieve_next_sibling=nxt.clone(),
            retrieve_cum_len=torch.arange(self.bs + 1, dtype=torch.int32, device=DEVICE) * self.t,
            spec_steps=4, topk=4, draft_token_num=self.t, capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=sum(self.prefix_lens), seq_lens_cpu=torch.tensor(self.prefix_lens, dtype=torch.int32))

    def forward_batch(self, with_mask: bool = True) -> ForwardBatch:
        self.write_req_to_token()
        fb = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=self.bs,
            input_ids=torch.zeros(self.n, dtype=torch.int64, device=DEVICE),
            req_pool_indices=self.req_pool_indices.to(torch.int32).to(DEVICE),
            seq_lens=torch.tensor(self.prefix_lens, dtype=torch.int32, device=DEVICE),
            seq_lens_cpu=torch.tensor(self.prefix_lens, dtype=torch.int32),
            out_cache_loc=self.out_cache_loc, seq_lens_sum=sum(self.prefix_lens), positions=self.positions,
        )
        fb.spec_info = self.spec_info(with_mask)
        self.setup.runner.kv_index_translator.bind_own_plan(fb)
        return fb

    def reference(self) -> torch.Tensor:
        """float64 [N, Hq * Dv]: the op's reference on this step's own metadata (prefix slots only)."""
        s = self.setup
        words = max(1, -(-self.t // 32))
        tree_mask = torch.cat([ancestor_mask(p, words) for p in self.trees]).to(DEVICE)
        kv_indices = torch.cat([sl[:p] for sl, p in zip(self.slots, self.prefix_lens)]).to(DEVICE)
        kv_indptr = torch.tensor([0, *self.prefix_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        qo_indptr = torch.arange(0, self.n + 1, self.t, dtype=torch.int32)
        out = tree_verify_attention_reference(
            self.q.view(self.n, s.hq, s.dqk), s.pool.get_key_buffer(0), s.pool.get_value_buffer(0),
            qo_indptr.to(DEVICE), kv_indptr.to(DEVICE), kv_indices, tree_mask, s.scale, 0.0,
            self.k, self.v)
        return out.reshape(self.n, s.hq * s.dv)


def _run_layer(backend, setup: Setup, step: Step, fb: ForwardBatch, q=None, k=None, v=None):
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        out = setup.layer(step.q if q is None else q, step.k if k is None else k, step.v if v is None else v, fb)
    return out.reshape(-1, setup.hq * setup.dv)


def _assert_close(actual, expected, what):
    torch.testing.assert_close(actual.double(), expected.double(), atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}: {m}")


# ---- eager ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mha", "mla"])
@pytest.mark.parametrize("spec_kind", SPEC_KINDS)
@pytest.mark.parametrize("name, tree_tokens, prefix_lens", SHAPES, ids=[s[0] for s in SHAPES])
def test_eager_verify_matches_reference_and_triton(monkeypatch, arch, spec_kind, name, tree_tokens, prefix_lens):
    monkeypatch.setenv("KDTREE_VERIFY", "on")
    setup = Setup(arch, max_bs=4, tree_tokens=tree_tokens)
    step = Step(setup, spec_kind, tree_tokens, prefix_lens, seed=len(name))
    expected = step.reference()
    kdtree = setup.backend("kdtree")
    assert type(kdtree).__name__ == "KDTreeAttnBackend"
    fb = step.forward_batch()
    kdtree.init_forward_metadata(fb)
    actual = _run_layer(kdtree, setup, step, fb)
    _assert_close(actual, expected, "kdtree vs float64 reference")

    triton = setup.backend("triton")
    fb = step.forward_batch()
    triton.init_forward_metadata(fb)
    _assert_close(actual, _run_layer(triton, setup, step, fb), "kdtree vs triton backend")


@pytest.mark.parametrize("arch", ["mha", "mla"])
def test_eager_verify_with_kv_already_in_cache(monkeypatch, arch):
    """k = v = None (SGLang's MLA paths that wrote the cache themselves): the draft rows are read back."""
    monkeypatch.setenv("KDTREE_VERIFY", "on")
    setup = Setup(arch, max_bs=2, tree_tokens=16)
    step = Step(setup, "eagle", 16, (33, 7), seed=3)
    fb = step.forward_batch()
    setup.pool.set_kv_buffer(setup.layer, fb.out_cache_loc, step.k, step.v)
    kdtree = setup.backend("kdtree")
    kdtree.init_forward_metadata(fb)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=kdtree)):
        out = kdtree.forward(step.q, None, None, setup.layer, fb)
    _assert_close(out.reshape(step.n, -1), step.reference(), "kdtree (k, v = None) vs reference")


# ---- CUDA graphs through SGLang's graph contract ------------------------------------------------------------


class GraphHarness:
    """The runner's side of 0.5.23's contract, for one captured batch size: static inputs, capture, replay."""

    def __init__(self, setup: Setup, backend, bs: int, tree_tokens: int):
        self.setup, self.backend, self.bs, self.t = setup, backend, bs, tree_tokens
        self.n = bs * tree_tokens
        max_bs = setup.runner.req_to_token_pool.size
        backend.init_cuda_graph_state(max_bs, max_bs * tree_tokens)
        self.req_pool_indices = torch.zeros(bs, dtype=torch.int32, device=DEVICE)
        self.seq_lens = torch.ones(bs, dtype=torch.int32, device=DEVICE)
        self.out_cache_loc = torch.zeros(self.n, dtype=torch.int64, device=DEVICE)
        self.positions = torch.zeros(self.n, dtype=torch.int64, device=DEVICE)
        self.q = torch.zeros(self.n, setup.hq * setup.dqk, dtype=DTYPE, device=DEVICE)
        self.k = torch.zeros(self.n, setup.hkv, setup.dqk, dtype=DTYPE, device=DEVICE)
        self.v = self.k[..., : setup.dv] if setup.arch == "mla" else torch.zeros(
            self.n, setup.hkv, setup.dv, dtype=DTYPE, device=DEVICE)
        self.graph = torch.cuda.CUDAGraph()
        self.out = None

    def _load(self, step: Step) -> ForwardBatch:
        assert step.bs == self.bs and step.t == self.t
        step.write_req_to_token()
        self.req_pool_indices.copy_(step.req_pool_indices.to(torch.int32))
        self.seq_lens.copy_(torch.tensor(step.prefix_lens, dtype=torch.int32))
        self.out_cache_loc.copy_(step.out_cache_loc)
        self.positions.copy_(step.positions)
        self.q.copy_(step.q)
        self.k.copy_(step.k)
        if self.setup.arch == "mha":
            self.v.copy_(step.v)
        fb = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=self.bs,
            input_ids=torch.zeros(self.n, dtype=torch.int64, device=DEVICE),
            req_pool_indices=self.req_pool_indices, seq_lens=self.seq_lens, seq_lens_cpu=None,
            out_cache_loc=self.out_cache_loc, seq_lens_sum=None, positions=self.positions)
        self.setup.runner.kv_index_translator.bind_own_plan(fb)
        return fb

    def capture(self, step: Step, with_mask: bool, sync_debug: bool = False) -> None:
        fb = self._load(step)
        fb.spec_info = step.spec_info(with_mask)
        self.backend.init_forward_metadata_out_graph(fb, in_capture=True)

        def run_once():
            with forward_context(ForwardContext(attn_backend=self.backend)):
                self.backend.init_forward_metadata_in_graph(fb)
                return self.setup.layer(self.q, self.k, self.v, fb)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(stream):
            run_once()  # warm-up, as the runner does
        torch.cuda.current_stream().wait_stream(stream)
        if sync_debug:  # any host sync recorded below raises (capture would fail on it anyway)
            torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.no_grad(), torch.cuda.graph(self.graph):
                self.out = run_once()
        finally:
            torch.cuda.set_sync_debug_mode("default")

    def replay(self, step: Step) -> torch.Tensor:
        fb = self._load(step)
        fb.spec_info = step.spec_info(True)
        self.backend.init_forward_metadata_out_graph(fb)  # in_capture=False: the replay prep
        self.graph.replay()
        return self.out.reshape(self.n, -1).clone()


@pytest.mark.parametrize("arch", ["mha", "mla"])
@pytest.mark.parametrize("spec_kind", SPEC_KINDS)
def test_graph_capture_then_replay_new_trees(monkeypatch, arch, spec_kind):
    monkeypatch.setenv("KDTREE_VERIFY", "on")
    t, bs = 24, 3
    setup = Setup(arch, max_bs=4, tree_tokens=t)
    harness = GraphHarness(setup, setup.backend("kdtree"), bs, t)
    # Captured from a spec info without a mask (the parent would then bake a causal graph in).
    harness.capture(Step(setup, spec_kind, t, (10, 10, 10), seed=1), with_mask=False)
    for seed, prefix_lens in ((2, (1, 150, 77)), (3, (280, 0, 12)), (4, (64, 64, 64))):
        step = Step(setup, spec_kind, t, prefix_lens, seed=seed)
        actual = harness.replay(step)
        _assert_close(actual, step.reference(), f"replay seed {seed} vs reference")

    # The triton backend, captured with a mask present, agrees on a fresh tree.
    triton = GraphHarness(setup, setup.backend("triton"), bs, t)
    triton.capture(Step(setup, spec_kind, t, (10, 10, 10), seed=1), with_mask=spec_kind != "dflash")
    step = Step(setup, spec_kind, t, (5, 40, 200), seed=9)
    _assert_close(harness.replay(step), triton.replay(step), "kdtree graph vs triton graph")


def test_validate_mode_reports_a_planted_divergence_from_a_graph(monkeypatch):
    monkeypatch.setenv("KDTREE_VERIFY", "validate")
    monkeypatch.setenv("KDTREE_VERIFY_LOG_EVERY", "1000000")
    t, bs = 16, 2
    setup = Setup("mha", max_bs=2, tree_tokens=t)
    backend = setup.backend("kdtree")
    harness = GraphHarness(setup, backend, bs, t)
    harness.capture(Step(setup, "eagle", t, (20, 30), seed=1), with_mask=True)
    backend.divergence_stats.zero_()

    step = Step(setup, "eagle", t, (50, 9), seed=5)
    out = harness.replay(step)
    _assert_close(out, step.reference(), "validate mode returns the parent's output")
    clean = backend.divergence_summary()  # outside the graph, after replay
    assert clean["calls"] == 1 and clean["non_finite"] == 0 and clean["max_abs_err"] < 5e-2

    # Plant a divergence: the graph was recorded with the packed-mask buffer; corrupting what the
    # in-graph refresh reads (the dense verify buffer is rewritten from the spec info, so flip the
    # source flag to the chain) makes the op see a different tree than the parent.
    backend._graph_mask.select_source(False)
    harness.graph.replay()
    torch.cuda.synchronize()
    planted = backend.divergence_summary()
    assert planted["calls"] == 2
    assert planted["max_abs_err"] > 1e-1, planted


def test_validate_mode_has_no_host_sync_in_the_graph(monkeypatch):
    """Capturing with sync debug mode on: any host sync inside the captured region raises."""
    monkeypatch.setenv("KDTREE_VERIFY", "validate")
    t, bs = 16, 2
    setup = Setup("mha", max_bs=2, tree_tokens=t)
    harness = GraphHarness(setup, setup.backend("kdtree"), bs, t)
    harness.capture(Step(setup, "eagle", t, (20, 30), seed=1), with_mask=True, sync_debug=True)
    step = Step(setup, "eagle", t, (3, 77), seed=2)
    _assert_close(harness.replay(step), step.reference(), "validate-mode replay vs reference")


# ---- torch.compile ----------------------------------------------------------------------------------------------


def _graph_breaks(backend, setup: Setup, step: Step, save_kv_cache: bool) -> int:
    import torch._dynamo as dynamo

    fb = step.forward_batch()
    backend.init_forward_metadata(fb)

    def verify(q, k, v):  # the forward context is set outside, as ModelRunner does
        return setup.layer(q, k, v, fb, save_kv_cache=save_kv_cache)

    dynamo.reset()
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        explanation = dynamo.explain(verify)(step.q, step.k, step.v)
    return explanation.graph_break_count


@pytest.mark.parametrize("save_kv_cache", [True, False], ids=["save_kv", "no_save"])
def test_compiled_verify_has_no_graph_breaks(monkeypatch, save_kv_cache):
    monkeypatch.setenv("KDTREE_VERIFY", "on")
    t = 16
    setup = Setup("mha", max_bs=2, tree_tokens=t)
    step = Step(setup, "eagle", t, (40, 3), seed=11)
    kdtree = setup.backend("kdtree")
    triton_breaks = _graph_breaks(setup.backend("triton"), setup, step, save_kv_cache)
    kdtree_breaks = _graph_breaks(kdtree, setup, step, save_kv_cache)
    _record(f"graph_breaks_{'save_kv' if save_kv_cache else 'no_save'}",
            {"kdtree": kdtree_breaks, "triton": triton_breaks, "torch": torch.__version__})
    assert kdtree_breaks == 0

    fb = step.forward_batch()
    kdtree.init_forward_metadata(fb)

    def verify(q, k, v):
        return setup.layer(q, k, v, fb, save_kv_cache=save_kv_cache)

    torch._dynamo.reset()
    compiled = torch.compile(verify, fullgraph=True)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=kdtree)):
        out = compiled(step.q, step.k, step.v)
    _assert_close(out.reshape(step.n, -1), step.reference(), "compiled kdtree verify vs reference")


# ---- routing: FP8-weight checkpoints and fp8 pools ------------------------------------------------------------


def _fp8_checkpoint_layer(setup: Setup) -> None:
    """The layer an FP8-weight checkpoint gets (Fp8KVCacheMethod, scales 1.0 after loading), over the same pool."""
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    setup.layer = RadixAttention(setup.hq, setup.dqk, setup.scale, setup.hkv, layer_id=0, v_head_dim=setup.dv,
                                 quant_config=Fp8Config(is_checkpoint_fp8_serialized=True),
                                 prefix="model.layers.0.self_attn.attn")
    setup.layer.quant_method.process_weights_after_loading(setup.layer)
    assert (setup.layer.k_scale_float, setup.layer.v_scale_float) == (1.0, 1.0)


def _fp8_pool(setup: Setup, kv_dtype) -> None:
    """--kv-cache-dtype fp8_*: SGLang's fp8 MHA pool in place of the bf16 one, with random contents."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    old = setup.pool
    setup.pool = setup.runner.token_to_kv_pool = MHATokenToKVPool(
        size=old.size, page_size=1, dtype=kv_dtype, head_num=setup.hkv, head_dim=setup.dqk, layer_num=1,
        device=DEVICE, enable_memory_saver=False, enable_alt_stream=False)
    setup.runner.kv_cache_dtype = kv_dtype
    for buf in (setup.pool.get_key_buffer(0), setup.pool.get_value_buffer(0)):
        buf.copy_(torch.randn(buf.shape, device=DEVICE).to(kv_dtype))


@pytest.mark.parametrize("arch", ["mha", "mla"])
def test_fp8_checkpoint_bf16_pool_is_served_eager_and_graph(monkeypatch, arch):
    monkeypatch.setenv("KDTREE_VERIFY", "on")
    t, bs = 16, 2
    setup = Setup(arch, max_bs=2, tree_tokens=t)
    _fp8_checkpoint_layer(setup)
    kdtree = setup.backend("kdtree")
    calls, op_path = [], type(kdtree)._tree_verify

    def counted(self, *args, **kwargs):  # the op's path, counted (eager and at capture)
        calls.append(1)
        return op_path(self, *args, **kwargs)

    monkeypatch.setattr(type(kdtree), "_tree_verify", counted)
    step = Step(setup, "eagle", t, (40, 7), seed=21)
    fb = step.forward_batch()
    kdtree.init_forward_metadata(fb)
    _assert_close(_run_layer(kdtree, setup, step, fb), step.reference(), "fp8-checkpoint eager vs reference")
    harness = GraphHarness(setup, setup.backend("kdtree"), bs, t)
    harness.capture(Step(setup, "eagle", t, (10, 10), seed=22), with_mask=False)
    step = Step(setup, "eagle", t, (99, 3), seed=23)
    _assert_close(harness.replay(step), step.reference(), "fp8-checkpoint graph replay vs reference")
    assert calls, "the op did not serve the FP8-checkpoint layer"


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_fp8_pool_falls_back_to_triton_eager_and_graph(monkeypatch, caplog, kv_dtype):
    import logging

    monkeypatch.setenv("KDTREE_VERIFY", "on")
    t, bs = 16, 2
    setup = Setup("mha", max_bs=2, tree_tokens=t)
    _fp8_pool(setup, kv_dtype)
    kdtree, triton = setup.backend("kdtree"), setup.backend("triton")
    step = Step(setup, "eagle", t, (33, 5), seed=31)
    with caplog.at_level(logging.WARNING):
        fb = step.forward_batch()
        kdtree.init_forward_metadata(fb)
        actual = _run_layer(kdtree, setup, step, fb)
        kdtree.init_forward_metadata(step.forward_batch())
    fb = step.forward_batch()
    triton.init_forward_metadata(fb)
    torch.testing.assert_close(actual, _run_layer(triton, setup, step, fb), atol=0, rtol=0)  # the parent's kernel
    assert sum("runs on TritonAttnBackend's kernel" in r.getMessage() for r in caplog.records) == 1

    graphs = [GraphHarness(setup, b, bs, t) for b in (setup.backend("kdtree"), setup.backend("triton"))]
    for g in graphs:
        g.capture(Step(setup, "eagle", t, (10, 10), seed=32), with_mask=True)
    step = Step(setup, "eagle", t, (70, 2), seed=33)
    torch.testing.assert_close(graphs[0].replay(step), graphs[1].replay(step), atol=0, rtol=0)
