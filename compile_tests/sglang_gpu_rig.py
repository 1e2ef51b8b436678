"""Real SGLang 0.5.23 objects around the kdtree backend on a CUDA GPU, shared by test_sglang_backend_gpu.py.

Real ReqToTokenPool, MHA/MLA token-to-KV pools (the attention test kit's mock model runners, which subclass
ModelRunner), RadixAttention layers, ForwardBatch in TARGET_VERIFY with EAGLE (topk > 1), DFLASH, NGRAM and DDTREE
spec infos; slots fragmented by our own layout (a random permutation of the pool; the kit's graph-mode runner is not
used: its eager-in-graph leg rewrites prefix K/V contiguously while req_to_token points elsewhere). `GraphHarness`
is the runner's side of 0.5.23's graph contract for one captured batch size.
"""

from __future__ import annotations

import importlib.util
import math

import torch

from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.eagle_info import EagleVerifyInput
from sglang.srt.speculative.ngram_info import NgramVerifyInput
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
from sglang_rig import base_backend

from kdtree_ops.sglang import plugin
from kdtree_ops.testing.reference import tree_verify_attention_reference
from kdtree_ops.testing.trees import ancestor_mask, ancestor_matrix, random_tree

plugin.register()

DEVICE = "cuda"
DTYPE = torch.bfloat16
ATOL = RTOL = 2e-2
MAX_CONTEXT = 320


def gpu_bases() -> list:
    """The base backends to verify over on this GPU: triton always; flashinfer where it is installed (on the lent
    H200 from ../shared/gpu-flashinfer). fa3 is not among them there: it lives in sgl_kernel, which is built for
    another torch than the machine's (the stand-in of ../shared/gpu/ only satisfies imports)."""
    return ["triton"] + (["flashinfer"] if importlib.util.find_spec("flashinfer") is not None else [])


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

    def backend(self, name: str, base: str = "triton"):
        """SGLang's `name` backend on this runner; kdtree over `base` (KDTREE_BASE_BACKEND while it is built)."""
        with base_backend(base if name == "kdtree" else None):
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
    def seq_lens_cpu(self) -> torch.Tensor:
        """The prefix lengths on the host, as the runner's batches carry them beside seq_lens."""
        return torch.tensor(self.prefix_lens, dtype=torch.int32)

    @property
    def seq_lens_sum(self) -> int:
        return sum(self.prefix_lens)

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
        if self.spec_kind == "ddtree":  # the tree only as the op's packed mask; at capture DDTREE's capture input
            from kdtree_ops.sglang.ddtree_spec_info import DDTreeVerifyInput

            if not with_mask:
                return DDTreeVerifyInput.for_capture(self.n, self.t, DEVICE)
            packed = torch.cat([ancestor_mask(p, max(1, -(-self.t // 32))) for p in self.trees]).to(DEVICE)
            return DDTreeVerifyInput(draft.view(self.bs, self.t), self.positions, packed)
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
            seq_lens_sum=self.seq_lens_sum, seq_lens_cpu=self.seq_lens_cpu)

    def forward_batch(self, with_mask: bool = True) -> ForwardBatch:
        self.write_req_to_token()
        fb = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=self.bs,
            input_ids=torch.zeros(self.n, dtype=torch.int64, device=DEVICE),
            req_pool_indices=self.req_pool_indices.to(torch.int32).to(DEVICE),
            seq_lens=self.seq_lens_cpu.to(DEVICE),
            seq_lens_cpu=self.seq_lens_cpu,
            out_cache_loc=self.out_cache_loc, seq_lens_sum=self.seq_lens_sum, positions=self.positions,
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
        self.seq_lens.copy_(step.seq_lens_cpu)
        self.out_cache_loc.copy_(step.out_cache_loc)
        self.positions.copy_(step.positions)
        self.q.copy_(step.q)
        self.k.copy_(step.k)
        if self.setup.arch == "mha":
            self.v.copy_(step.v)
        fb = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=self.bs,
            input_ids=torch.zeros(self.n, dtype=torch.int64, device=DEVICE),
            req_pool_indices=self.req_pool_indices, seq_lens=self.seq_lens,
            # The host-side lengths the runner's capture and replay batches carry: FlashInfer's verify plan sizes its
            # index buffer from seq_lens_sum (Triton's reads only the device tensors).
            seq_lens_cpu=step.seq_lens_cpu, seq_lens_sum=step.seq_lens_sum,
            out_cache_loc=self.out_cache_loc, positions=self.positions)
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


def run_layer(backend, setup: Setup, step: Step, fb: ForwardBatch, q=None, k=None, v=None):
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        out = setup.layer(step.q if q is None else q, step.k if k is None else k, step.v if v is None else v, fb)
    return out.reshape(-1, setup.hq * setup.dv)


def assert_close(actual, expected, what):
    torch.testing.assert_close(actual.double(), expected.double(), atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}: {m}")
