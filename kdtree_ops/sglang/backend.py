"""KDTreeAttnBackend: tree verification through the kdtree op, over a base backend that does everything else.

The backend holds a base (base.py: `KDTREE_BASE_BACKEND`, else the backend SGLang itself would pick for this model
and platform) and forwards every call to it (delegation.py) except the TARGET_VERIFY layer calls the op serves
(routing.py). Such a call writes the draft tokens' K/V to the pool with the pool's own (quantizing)
`set_kv_buffer`, as SGLang's backends do, then runs `kdtree_ops.ops.tree_verify_attention_out` on kdtree's own step
metadata (verify_metadata.py: prefix slots from req_to_token, the packed mask from the spec info's FULL_MASK or
QLEN_ONLY mask), with the draft K/V row-aligned with q in q's dtype, unscaled.

Graph contract of sglang 0.5.23 (base_attn_backend.AttentionBackend; DecodeCudaGraphRunner drives it), each step
the base's first:
- `init_cuda_graph_state(max_bs, max_num_tokens)`: the base's buffers, plus kdtree's static step buffers;
- `init_forward_metadata_out_graph(fb, in_capture)`: outside the graph, at capture and before every replay: fills
  the static step buffers from this step's batch and spec info (GraphVerifyBuffers.fill);
- `init_forward_metadata_in_graph(fb)`: the base's only (kdtree's metadata is complete before the replay);
- `update_verify_buffers_to_fill_after_draft`: repacks the mask the draft wrote after the plan (overlap plans);
- `init_forward_metadata(fb)`: eager steps: the base's metadata, plus a fresh step of kdtree's.

Modes, by KDTREE_VERIFY (read when the backend is built):
- `on` (default): the op serves TARGET_VERIFY;
- `off`: the base serves everything;
- `validate`: both run; the op's output is compared with the base's on the device (`record_divergence` into a
  float32 stats[3] buffer: max |op - base| over finite elements, count of non-finite op elements, calls) and the
  base's output is returned. Every KDTREE_VERIFY_LOG_EVERY verify steps (default 100) a summary line is logged
  from the metadata init, which runs outside any graph; that read of three floats is its only host sync.
KDTREE_VERIFY_COUNT=1 (read when the backend is built): every op call also runs `record_divergence` on its first
output row against itself into its layer's float32 row of `[layers, 3]` on the device, so stats[2] counts the op's
calls where they run (eager, the graph runner's warm-ups, and every replay of a captured graph, where no Python runs)
and stats[1] the non-finite elements of that row; `status()` reads them (a host sync, outside graphs) as
`device_op_calls` and `device_non_finite`. The proof that the op ran inside replayed graphs, in any mode (validate
is not lossless for DDTREE, which refuses it).
A base without a TARGET_VERIFY path (torch_native) is fine while the op serves every verify layer; `off`,
`validate` or a layer the op cannot serve then fail when the backend is built (or at that layer's first call, for
reasons only a call shows), naming the layers and the fix.

DDTREE (`--speculative-algorithm DDTREE`) carries its trees only as the op's packed mask, which no base reads: the
op serves every verify layer of a DDTREE target, and a mode, flag or layer that would hand one to the base fails
when the backend is built (or at the call, for reasons only a call shows).

A build of the ops library without CUDA kernels on a CUDA server is an error when the backend is built.

Padding: under DP attention SGLang pads an eager verify batch's rows to a multiple of attn_tp_size after the
requests' B * T rows; the mask has as many rows as the padded batch, zero past the requests, so the op writes zeros
there (the base may leave them unwritten; nothing reads them).
"""

from __future__ import annotations

import logging
import os
import weakref

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from .base import BASE_ENV, BASES_WITHOUT_TARGET_VERIFY, base_backend_name, build_base
from .ddtree_algorithm import DDTREE_VERIFY_NEEDS_OP, is_ddtree
from .delegation import BaseAttributes, forward_to_base
from .routing import (
    MLA_SPLIT_INPUTS,
    FallbackLog,
    VerifyCallConfig,
    fallback_reason,
    layer_kv_scales,
    layer_ranges,
    op_kv_scales,
    pool_note,
)
from .verify_metadata import GraphVerifyBuffers, VerifyStep, eager_verify_step, mask_words
from .verify_mode import VERIFY_MODES, verify_mode_from_env  # noqa: F401  (VERIFY_MODES re-exported)

logger = logging.getLogger(__name__)

COUNT_ENV = "KDTREE_VERIFY_COUNT"

def check_cuda_kernels(ops, device) -> None:
    """Raises when a CUDA server would get an ops library built without CUDA kernels (it would fail at capture)."""
    if torch.device(device).type == "cuda" and not ops.cuda_kernels_built():
        raise RuntimeError(
            "kdtree attention backend: the loaded kdtree_ops library has no CUDA kernels (it was built CPU-only: "
            "KDTREE_OPS_CPU_ONLY=1 was set, no CUDA toolkit (nvcc) was found, or it was built on a machine without "
            "a GPU and no CUDA target named), but this server runs on CUDA. Fix: unset KDTREE_OPS_CPU_ONLY and "
            "install the CUDA toolkit (nvcc) in the image, or prebuild with `python -m kdtree_ops build --archs "
            "\"80;90a;120\"` on a machine with the toolkit; or launch with --attention-backend triton (or "
            "KDTREE_VERIFY=off)."
        )


def _no_verify_fix(base_name: str) -> str:
    return (f"{base_name} has no TARGET_VERIFY path. Fix: set {BASE_ENV} to a backend that has one (triton, "
            "flashinfer or fa3 on a GPU, intel_amx on a CPU), or launch with that --attention-backend")


def _dequantized(rows: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Pool rows as the op's draft rows: in q's dtype, scaled back (an fp8 pool stores value / scale)."""
    if rows.dtype == dtype:
        return rows
    return (rows.to(torch.float32) * scale).to(dtype)


@forward_to_base
class KDTreeAttnBackend(BaseAttributes, AttentionBackend):
    """The kdtree op for TARGET_VERIFY (GQA/MHA and absorbed MLA) over a base backend for everything else."""

    def __init__(self, model_runner):
        self.verify_mode = verify_mode_from_env()
        self.base_name, self.base_source = base_backend_name(model_runner.server_args)
        self._ops = None
        if self.verify_mode != "off":
            from kdtree_ops import ops  # builds/loads the library once per process

            check_cuda_kernels(ops, model_runner.device)  # before the base allocates anything
            self._ops = ops
        self.base = build_base(model_runner, self.base_name)
        self.device = model_runner.device
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.max_context_len = model_runner.model_config.context_len
        # The KV pool's dtype (fp8 pools report their fp8 dtype; they store uint8).
        self._kv_dtype = getattr(self.token_to_kv_pool, "dtype", None) or model_runner.kv_cache_dtype
        self._dtype = model_runner.dtype  # q's, for the layers' routes
        self._use_mla = bool(getattr(model_runner, "use_mla_backend", False))
        self._pool_note = pool_note(self.token_to_kv_pool, getattr(model_runner, "kv_index_translator", None))
        self._capture_width = max(1, int(model_runner.decode_num_tokens_per_req()))
        self._verifies = self.verify_mode != "off" and not getattr(model_runner, "is_draft_worker", False)
        spec_algorithm = getattr(model_runner, "spec_algorithm", None)
        self._speculative = spec_algorithm is not None and not spec_algorithm.is_none()
        # DDTREE's verify input carries its tree only as the op's packed mask: the op must serve every verify layer.
        self._ddtree = is_ddtree(spec_algorithm) and not getattr(model_runner, "is_draft_worker", False)
        self._base_verifies = self.base_name not in BASES_WITHOUT_TARGET_VERIFY
        from sglang.srt.runtime_context import get_exec, get_parallel, get_spec

        # The widest tree a step can bring (the graph buffers' mask words are sized for it).
        self._max_tree_tokens = max(self._capture_width, int(get_spec().speculative_num_draft_tokens or 0))
        self._deterministic = bool(get_exec().deterministic.enable_deterministic_inference)
        self._dcp_size = int(get_parallel().attn_dcp_size)
        self._routes: dict[int, tuple] = {}  # layer id -> (layer, reason): decided at the layer's first call
        self._config_routes: dict[tuple, str] = {}  # the slow path's memo, by configuration
        self._fallbacks = FallbackLog(self.base_name)
        self._graph: GraphVerifyBuffers | None = None
        self._step: VerifyStep | None = None  # the step being run (eager) or captured/replayed (graph)
        self._step_batch = None  # its forward batch (the draft may rewrite the mask after the plan)
        self.divergence_stats = torch.zeros(3, dtype=torch.float32, device=self.device)
        self.verify_steps = 0
        self.op_calls: dict[int, int] = {}  # layer id -> calls the op served (eager calls and graph captures)
        self.base_calls: dict[int, int] = {}  # layer id -> verify calls the base served
        self._log_every = max(1, int(os.environ.get("KDTREE_VERIFY_LOG_EVERY", "100")))
        self.call_stats = None  # [layers, 3] float32 on the device with KDTREE_VERIFY_COUNT=1 (module docstring)
        if self._verifies and os.environ.get(COUNT_ENV, "").strip() == "1":
            pool = self.token_to_kv_pool
            layers = int(getattr(pool, "start_layer", 0) or 0) + int(pool.layer_num)
            self.call_stats = torch.zeros((layers, 3), dtype=torch.float32, device=self.device)
        self._check_base_verify(model_runner)
        self._check_ddtree_verify(model_runner)
        _LIVE.append(weakref.ref(self))
        logger.info("%s", self.status_line())

    # ---- what serves a verify layer --------------------------------------------------------------------

    def _check_base_verify(self, model_runner) -> None:
        """At build time: fails when speculative decoding would hand a verify layer to a base without verify."""
        if not self._speculative or getattr(model_runner, "is_draft_worker", False) or self._base_verifies:
            return
        if self.verify_mode != "on":
            raise RuntimeError(f"kdtree attention backend: KDTREE_VERIFY={self.verify_mode} runs TARGET_VERIFY on "
                               f"the base backend, and {_no_verify_fix(self.base_name)}")
        for reason, layers in self._layers_needing_base(model_runner).items():
            raise RuntimeError(f"kdtree attention backend: TARGET_VERIFY of layers {layer_ranges(layers)} needs the "
                               f"base backend ({reason}), and {_no_verify_fix(self.base_name)}")

    def _check_ddtree_verify(self, model_runner) -> None:
        """At build time: fails when a verify layer of a DDTREE target would not run the op (its verify input has
        no mask any other kernel reads). The launch refuses the flags (ddtree_algorithm.check_ddtree_verify_route);
        this sees what only the loaded model shows, and the flags again for runners built without that check."""
        if not self._ddtree:
            return
        if self.verify_mode != "on":
            raise RuntimeError(f"kdtree attention backend: {DDTREE_VERIFY_NEEDS_OP}, and KDTREE_VERIFY="
                               f"{self.verify_mode} runs TARGET_VERIFY on the base backend {self.base_name}. Fix: "
                               f"unset KDTREE_VERIFY or set it to on")
        for reason, layers in self._layers_needing_base(model_runner).items():
            raise RuntimeError(f"kdtree attention backend: {DDTREE_VERIFY_NEEDS_OP}, and TARGET_VERIFY of layers "
                               f"{layer_ranges(layers)} would run on {self.base_name} ({reason}). Fix: launch without "
                               f"what causes it, or serve this model with a speculative algorithm whose verify "
                               f"input carries a dense mask (EAGLE, NGRAM)")

    def _layers_needing_base(self, model_runner) -> dict[str, set]:
        """reason -> ids of the loaded model's layers whose verify the op cannot serve (none: {})."""
        needs_base: dict[str, set] = {}
        for layer_id, reasons in self._model_layer_reasons(model_runner).items():
            if all(reasons):  # no module of this layer can be served (MLA has an MHA twin that never verifies)
                needs_base.setdefault(reasons[0], set()).add(layer_id)
        return needs_base

    def _model_layer_reasons(self, model_runner) -> dict[int, list]:
        """layer id -> the route of each RadixAttention module of the loaded model with that id."""
        model = getattr(model_runner, "model", None)
        found: dict[int, list] = {}
        for module in model.modules() if isinstance(model, torch.nn.Module) else ():
            if isinstance(module, RadixAttention):
                config = self._call_config(self._dtype, torch.device(self.device), module, (), False)
                found.setdefault(module.layer_id, []).append(fallback_reason(config, self._ops))
        return found

    def _call_config(self, dtype, device, layer, extras: tuple, mha_one_shot: bool) -> VerifyCallConfig:
        """The configuration of one verify layer call (attributes, dtypes, which inputs are given; no values)."""
        window = layer.sliding_window_size
        return VerifyCallConfig(
            device=device, dtype=dtype, kv_dtype=self._kv_dtype, head_dim_qk=layer.qk_head_dim,
            head_dim_v=layer.v_head_dim, num_kv_heads=layer.tp_k_head_num, kv_scales=layer_kv_scales(layer),
            sliding_window=-1 if window is None else window, attn_type=layer.attn_type,
            cross_attention=bool(layer.is_cross_attention),
            logit_capping=layer.logit_capping_method if layer.logit_cap else "",
            xai_temperature=getattr(layer, "xai_temperature_len", -1) not in (None, -1, 0), extra_inputs=extras,
            mha_one_shot=mha_one_shot, deterministic=self._deterministic, dcp_size=self._dcp_size,
            pool_note=self._pool_note)

    def _route(self, q, layer, forward_batch, kwargs) -> str:
        """"" when the op serves this call, else why the base does. Decided at a layer's first call from its
        configuration and cached by layer id; a call with other inputs (sinks, ...) takes the slow path."""
        extras = tuple(sorted(n for n, x in kwargs.items() if x is not None and n not in MLA_SPLIT_INPUTS)) \
            if kwargs else ()
        one_shot = getattr(forward_batch, "mha_one_shot", False) is True
        cached = self._routes.get(layer.layer_id)
        if cached is not None and cached[0] is layer and not extras and not one_shot and q.dtype == self._dtype:
            return cached[1]
        config = self._call_config(q.dtype, q.device, layer, extras, one_shot)
        reason = self._fallback_reason(tuple(config), layer.layer_id)
        if not extras and not one_shot and q.dtype == self._dtype:
            self._routes[layer.layer_id] = (layer, reason)
        return reason

    @torch.compiler.assume_constant_result
    def _fallback_reason(self, fields: tuple, layer_id: int) -> str:
        """The slow path: the op's answer for a configuration (a call into C++), memoized; notes a fall-back.

        Under torch.compile it runs while tracing and its answer is a constant of the graph; the configuration
        crosses that boundary as a plain tuple of its fields (dynamo passes named tuples to such functions
        malformed, torch 2.14).
        """
        config = VerifyCallConfig(*fields)
        reason = self._config_routes.get(config)
        if reason is None:
            reason = self._config_routes[config] = fallback_reason(config, self._ops)
        if reason:
            self._fallbacks.note(reason, layer_id)
        return reason

    # ---- metadata ----------------------------------------------------------------------------------------

    def _is_verify(self, forward_batch) -> bool:
        return self._verifies and forward_batch.forward_mode.is_target_verify()

    def _tokens_per_req(self, spec_info) -> int:
        n = getattr(spec_info, "num_tokens_per_req", -1) if spec_info is not None else -1
        return n if n > 0 else self._capture_width

    def _base_prepares(self, forward_batch) -> bool:
        """Whether the base prepares this batch: every batch but the verify batches it never serves — those of a base
        without verify, and DDTREE's (the op serves every verify layer, and a base's verify metadata cannot be built
        from DDTREE's verify input: FlashInfer's, flashinfer_mla's and aiter's ask it for a dense mask)."""
        if not forward_batch.forward_mode.is_target_verify():
            return True
        return self._base_verifies and not self._ddtree

    def init_forward_metadata(self, forward_batch):
        if self._base_prepares(forward_batch):
            self.base.init_forward_metadata(forward_batch)
        self._fallbacks.flush()
        self._step = self._step_batch = None
        if not self._is_verify(forward_batch):
            return
        self._count_step()
        tokens = self._tokens_per_req(forward_batch.spec_info)
        self._step = eager_verify_step(forward_batch, forward_batch.spec_info, self.req_to_token_pool.req_to_token,
                                       tokens, mask_words(tokens), self.verify_mask)
        self._step_batch = forward_batch

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
        self.base.init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        if self._verifies:
            self._graph = GraphVerifyBuffers(max_bs, max_num_tokens, self.max_context_len,
                                             mask_words(self._max_tree_tokens), self.device)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        if self._base_prepares(forward_batch):
            self.base.init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
        self._fallbacks.flush()
        self._step = self._step_batch = None
        if not self._is_verify(forward_batch) or self._graph is None:
            return
        if not in_capture:
            self._count_step()
        tokens = self._tokens_per_req(forward_batch.spec_info)
        self._step = self._graph.fill(forward_batch, self.req_to_token_pool.req_to_token, tokens, self.verify_mask)
        self._step_batch = forward_batch

    def init_forward_metadata_in_graph(self, forward_batch):
        if self._base_prepares(forward_batch):
            self.base.init_forward_metadata_in_graph(forward_batch)

    def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):
        self.base.update_verify_buffers_to_fill_after_draft(spec_info, cuda_graph_bs)
        fb = self._step_batch
        if self._step is None or fb is None:
            return
        tokens = self._tokens_per_req(spec_info)
        if self._step.rows is None:  # graph: repack into the static buffer the captured op reads
            self._graph.refresh_mask(fb, spec_info, tokens, self.verify_mask)
        else:
            self._step = eager_verify_step(fb, spec_info, self.req_to_token_pool.req_to_token, tokens,
                                           mask_words(tokens), self.verify_mask)

    @property
    def verify_mask(self):
        """The base's: the draft writes its tree there, in the base's layout, and kdtree reads either layout."""
        return self.base.verify_mask

    def glue_target_verify_metadata(self) -> str:
        return "kdtree fills its verify metadata from each step's spec info outside the graph"

    # ---- forward -------------------------------------------------------------------------------------------

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if self._is_verify(forward_batch):
            return self._verify(q, k, v, layer, forward_batch, save_kv_cache, kwargs)
        return self.base.forward(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if self._is_verify(forward_batch):
            return self._verify(q, k, v, layer, forward_batch, save_kv_cache, kwargs)
        return self.base.forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self.base.forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    def _verify(self, q, k, v, layer, forward_batch, save_kv_cache, kwargs):
        """One verify layer call: the op, or the base (with the reason noted), or both (validate)."""
        if self._step is None:
            reason = "the step's verify metadata was not prepared (no metadata init saw this TARGET_VERIFY batch)"
            self._fallbacks.note(reason, layer.layer_id)
        else:
            reason = self._route(q, layer, forward_batch, kwargs)
        if reason or self.verify_mode == "validate":
            if self._ddtree:  # validate is refused when the backend is built; a reason only a call shows lands here
                raise RuntimeError(f"kdtree attention backend: TARGET_VERIFY of layer {layer.layer_id} cannot run the "
                                   f"op ({reason}), and {DDTREE_VERIFY_NEEDS_OP}")
            if not self._base_verifies:
                raise RuntimeError(f"kdtree attention backend: TARGET_VERIFY of layer {layer.layer_id} needs the base "
                                   f"backend ({reason or 'KDTREE_VERIFY=validate'}), and "
                                   f"{_no_verify_fix(self.base_name)}")
            if reason:
                self._count(self.base_calls, layer.layer_id)
                return self.base.forward(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
            clones = (None if x is None else x.clone() for x in (k, v))  # some bases scale k/v in place
            ref = self.base.forward(q, *clones, layer, forward_batch, save_kv_cache, **kwargs)
            out = self._tree_verify(q, k, v, layer, forward_batch, False, kwargs, out=None)
            rows = self._step.rows if self._step.rows is not None else out.shape[0]
            self._ops.record_divergence(out[:rows], ref.view(out.shape)[:rows], self.divergence_stats)
            return ref
        return self._tree_verify(q, k, v, layer, forward_batch, save_kv_cache, kwargs,
                                 out=getattr(forward_batch, "_attn_output", None))

    def _tree_verify(self, q, k, v, layer, forward_batch, save_kv_cache: bool, kwargs, out):
        """Saves the draft K/V with the pool's own write, then runs the op; returns [N, Hq * Dv] like SGLang's."""
        hq, hkv = layer.tp_q_head_num, layer.tp_k_head_num
        dqk, dv = layer.qk_head_dim, layer.v_head_dim
        if kwargs.get("q_rope") is not None:  # absorbed MLA in parts (fa3/flashinfer's form): the op takes it whole
            q = torch.cat([q.view(-1, hq, dv), kwargs["q_rope"].view(-1, hq, dqk - dv)], dim=-1)
            if k is not None:
                k = torch.cat([k.view(-1, hkv, dv), kwargs["k_rope"].view(-1, hkv, dqk - dv)], dim=-1)
                v = k[..., :dv]
        q3 = q.view(-1, hq, dqk)
        k_scale, v_scale = op_kv_scales(layer, self._kv_dtype)
        pool = self.token_to_kv_pool
        if k is None and v is None:  # paths that wrote the cache themselves: the draft rows read back, dequantized
            k_buffer, v_buffer = pool.get_kv_buffer(layer.layer_id)
            k = _dequantized(k_buffer[forward_batch.out_cache_loc], k_scale, q3.dtype)
            v = _dequantized(v_buffer[forward_batch.out_cache_loc], v_scale, q3.dtype)
        elif k is None or v is None:
            raise ValueError("Both k and v should be None or not None")
        elif save_kv_cache:
            self._save_kv(layer, forward_batch, k, v)

        num_tokens = q3.shape[0]
        if out is None:
            out = q.new_empty((num_tokens, hq * dv))
        step = self._step
        if step.tree_mask.shape[0] < num_tokens:
            raise ValueError(f"kdtree verify: q has {num_tokens} rows but the step's tree mask "
                             f"{step.tree_mask.shape[0]} (the metadata init saw fewer rows than this forward)")
        self._ops.tree_verify_attention_out(
            q3, pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id), step.qo_indptr,
            step.kv_indptr, step.kv_indices, step.tree_mask[:num_tokens], layer.scaling, float(layer.logit_cap or 0.0),
            k.view(-1, hkv, dqk).to(q3.dtype), v.reshape(-1, hkv, dv).to(q3.dtype), k_scale, v_scale,
            out=out.view(num_tokens, hq, dv))
        self._count(self.op_calls, layer.layer_id)
        if self.call_stats is not None:  # device-side: counted inside replayed graphs too
            first = out.view(num_tokens, -1)[:1]
            self._ops.record_divergence(first, first, self.call_stats[layer.layer_id])
        return out

    def _save_kv(self, layer, forward_batch, k, v) -> None:
        """The draft K/V into the pool, quantized as SGLang's backends write them (an fp8 pool stores x / scale)."""
        pool, loc = self.token_to_kv_pool, KVWriteLoc.for_batch(forward_batch)
        scaled = layer.k_scale is not None and k.dtype != self._kv_dtype
        if self._use_mla:  # MLA pools take no scale: the backends divide the latent row first
            pool.set_kv_buffer(layer, loc, k / layer.k_scale_float if scaled else k, v)
        elif scaled:  # the pool divides in place, and k/v are the op's draft rows: copies
            pool.set_kv_buffer(layer, loc, k.clone(), v.clone(), layer.k_scale_float, layer.v_scale_float)
        else:
            pool.set_kv_buffer(layer, loc, k, v)

    # ---- status --------------------------------------------------------------------------------------------

    def _count(self, counter: dict, layer_id: int) -> None:
        if not torch.compiler.is_compiling():
            counter[layer_id] = counter.get(layer_id, 0) + 1

    def _count_step(self) -> None:
        """Counts verify steps; in validate mode logs the summary every KDTREE_VERIFY_LOG_EVERY steps."""
        self.verify_steps += 1
        if self.verify_mode == "validate" and self.verify_steps % self._log_every == 0:
            s = self.divergence_summary()
            log = logger.warning if s["non_finite"] or s["max_abs_err"] > 5e-2 else logger.info
            log("kdtree validate: %d verify steps, %d layer calls, max |kdtree - %s| = %.3e, non-finite kdtree "
                "outputs = %d", s["steps"], s["calls"], self.base_name, s["max_abs_err"], s["non_finite"])

    def divergence_summary(self) -> dict:
        """Reads the validate-mode statistics (a host sync: call outside graphs and verify paths)."""
        max_abs, non_finite, calls = self.divergence_stats.tolist()
        return {"max_abs_err": max_abs, "non_finite": int(non_finite), "calls": int(calls),
                "steps": self.verify_steps}

    def status_line(self) -> str:
        return (f"kdtree attention backend: TARGET_VERIFY by the kdtree op (KDTREE_VERIFY={self.verify_mode}), "
                f"everything else by {self.base_name} ({self.base_source})")

    def status(self) -> dict:
        """What this backend did so far (plain values: SGLang's server info carries it)."""
        state = {"status": self.status_line(), "base": self.base_name, "base_source": self.base_source,
                 "verify_mode": self.verify_mode, "verify_steps": self.verify_steps,
                 "op_calls": {str(i): n for i, n in sorted(self.op_calls.items())},
                 "base_calls": {str(i): n for i, n in sorted(self.base_calls.items())},
                 "fallbacks": {r: layer_ranges(ls) for r, ls in self._fallbacks.layers.items()}}
        if self.verify_mode == "validate":
            state["validate"] = self.divergence_summary()
        if self.call_stats is not None:  # a host sync: status() runs outside graphs
            rows = self.call_stats.tolist()
            state["device_op_calls"] = {str(i): int(r[2]) for i, r in enumerate(rows) if r[2]}
            state["device_non_finite"] = int(sum(r[1] for r in rows))
        return state


_LIVE: list = []  # weak references to this process's kdtree backends, in build order


def live_backends() -> list:
    """This process's kdtree backends still alive (the plugin reports them in SGLang's server info)."""
    return [b for b in (ref() for ref in _LIVE) if b is not None]
