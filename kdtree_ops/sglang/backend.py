"""KDTreeAttnBackend: SGLang's Triton attention backend with tree verification through the kdtree op.

Everything but TARGET_VERIFY is TritonAttnBackend's, unchanged. A TARGET_VERIFY layer call writes the draft
tokens' K/V to the pool as the parent does, then calls `kdtree_ops.ops.tree_verify_attention_out` with the
parent's own metadata (kv_indptr/kv_indices of the committed prefix, the draft K/V row-aligned with q) and the
packed ancestor mask of `verify_metadata`.

Graph contract of sglang 0.5.23 (base_attn_backend.AttentionBackend; DecodeCudaGraphRunner drives it):
- `init_cuda_graph_state(max_bs, max_num_tokens)`: the parent's buffers, plus the packed-mask buffers;
- `init_forward_metadata_out_graph(fb, in_capture)`: outside the graph, at capture (`in_capture=True`) and
  before every replay: the parent fills its static qo/kv/mask buffers; here the step's mask source
  (dense or chain) is written to a device flag;
- `init_forward_metadata_in_graph(fb)`: recorded in the graph, so it re-runs on every replay: packs the mask
  from the static buffers with the capture-safe ops. A graph captured while the spec info carried no
  custom mask still packs the tree of every later replay (the parent would keep a causal graph).
- `init_forward_metadata(fb)`: eager steps: the parent's metadata, plus the packed mask of this step.

Modes, by KDTREE_VERIFY (read when the backend is built):
- `on` (default): the op serves TARGET_VERIFY;
- `off`: the parent's kernel serves everything (this class is then TritonAttnBackend);
- `validate`: both kernels run; the op's output is compared with the parent's on the device
  (`record_divergence` into a float32 stats[3] buffer: max |op - triton| over finite elements, count of
  non-finite op elements, calls) and the parent's output is returned. Every KDTREE_VERIFY_LOG_EVERY verify
  steps (default 100) a summary line is logged from the metadata init, which runs outside any graph; that
  read of three floats is the only host sync validate mode adds, and none is inside the verify path.

Routing (`routing.py`): a verify layer call goes to the op when the op has a kernel for its configuration on
this device (the op's own answer: dtype, head dims, KV heads, KV-cache dtype, shared memory of the chosen
kernel) and nothing else rules it out; otherwise the parent runs it. Decided from configuration only (no
tensor values: the same at capture and every replay), memoized per configuration. Falls back: an fp8 KV pool
(`--kv-cache-dtype fp8_e4m3/e5m2`, as long as the op has no kernel for it), KV scales other than 1.0,
sliding-window layers, attention sinks, score_mod/aux tensors, non-tanh logit capping, xai temperature,
cross/encoder attention, DCP, deterministic inference (the op is not batch-invariant), DLLM. Served: FP8-weight
checkpoints with a KV pool in q's dtype (SGLang gives their layers k_scale = v_scale = 1.0). The first time a
reason appears, one WARNING names the layers and the reason.

A build of the ops library without CUDA kernels (KDTREE_OPS_CPU_ONLY=1, or no nvcc where it was built) on a
CUDA server is an error when the backend is built, naming the fix.

Padding: under DP attention SGLang pads an eager verify batch's rows to a multiple of attn_tp_size (and to
the other ranks' count) after the requests' bs * T rows; the eager mask has as many rows as the padded batch
(`out_cache_loc` has one per q row), all zero past the requests, so the op writes zeros there (the parent
leaves them unwritten; nothing reads them).
"""

from __future__ import annotations

import logging
import os

import torch

from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from .routing import FallbackLog, VerifyCallConfig, fallback_reason, layer_kv_scales
from .verify_metadata import GraphTreeMask, mask_words, packed_tree_mask

logger = logging.getLogger(__name__)

VERIFY_MODES = ("off", "validate", "on")

def verify_mode_from_env() -> str:
    """KDTREE_VERIFY = off | validate | on (default on); anything else is an error naming the variable."""
    mode = os.environ.get("KDTREE_VERIFY", "on").strip().lower() or "on"
    if mode not in VERIFY_MODES:
        raise ValueError(f"KDTREE_VERIFY must be one of {'|'.join(VERIFY_MODES)}, got {mode!r}")
    return mode


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


class KDTreeAttnBackend(TritonAttnBackend):
    """TritonAttnBackend whose TARGET_VERIFY attention is the kdtree tree-verify op (GQA/MHA and MLA)."""

    def __init__(self, model_runner, *args, **kwargs):
        self.verify_mode = verify_mode_from_env()
        if self.verify_mode != "off":
            from kdtree_ops import ops  # builds/loads the library once per process

            check_cuda_kernels(ops, model_runner.device)  # before the parent allocates anything
            self._ops = ops
        super().__init__(model_runner, *args, **kwargs)
        # The KV pool's dtype (fp8 pools report their fp8 dtype; they store uint8).
        self._kv_dtype = getattr(self.token_to_kv_pool, "dtype", None) or model_runner.kv_cache_dtype
        self._routes: dict[VerifyCallConfig, str] = {}
        self._fallbacks = FallbackLog()
        self._graph_mask: GraphTreeMask | None = None
        # The mask and int32 qo_indptr of the step being run (eager) or captured (graph).
        self._step_tree_mask: torch.Tensor | None = None
        self._step_rows: int | None = None  # eager: the requests' rows (DP attention pads q past them)
        self._step_qo_indptr: torch.Tensor | None = None
        self.divergence_stats = torch.zeros(3, dtype=torch.float32, device=self.device)
        self._verify_steps = 0
        self._log_every = max(1, int(os.environ.get("KDTREE_VERIFY_LOG_EVERY", "100")))
        logger.info("KDTreeAttnBackend: KDTREE_VERIFY=%s", self.verify_mode)

    # ---- metadata ------------------------------------------------------------------------------------

    def _max_tree_tokens(self) -> int:
        return max(int(self.num_draft_tokens or 0), int(self.target_verify_num_tokens_per_req or 0), 1)

    def _verify_active(self, forward_batch) -> bool:
        return (
            self.verify_mode != "off"
            and self.dllm_attention is None
            and not self.skip_prefill
            and forward_batch.forward_mode.is_target_verify()
        )

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        self._fallbacks.flush()
        if not self._verify_active(forward_batch):
            return
        self._maybe_log_divergence()
        md = self.forward_metadata
        num_tokens_per_req = self._target_verify_num_tokens_per_req(forward_batch.spec_info)
        bs = md.qo_indptr.shape[0] - 1
        # q's rows: the requests' bs * T, plus the rows DP attention pads after them (out_cache_loc is padded
        # with q; forward_batch_info.prepare_mlp_sync_batch). The mask's rows past the requests are zero.
        num_rows = max(bs * num_tokens_per_req, forward_batch.out_cache_loc.shape[0])
        qo_indptr = md.qo_indptr.to(torch.int32)  # already int32 here: no copy
        spec_info = forward_batch.spec_info
        self._step_qo_indptr = qo_indptr
        self._step_rows = bs * num_tokens_per_req  # validate mode compares these: the parent leaves padding unwritten
        self._step_tree_mask = packed_tree_mask(
            spec_info.custom_mask if spec_info is not None else None,
            md.mask_indptr,
            qo_indptr,
            forward_batch.seq_lens,
            num_rows,
            mask_words(num_tokens_per_req),
        )

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        if self.verify_mode != "off" and not self.skip_prefill:
            self._graph_mask = GraphTreeMask(
                max_bs, max_num_tokens, mask_words(self._max_tree_tokens()), self.device
            )

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        super().init_forward_metadata_out_graph(forward_batch, in_capture)
        self._fallbacks.flush()
        if not self._verify_active(forward_batch) or self._graph_mask is None:
            return
        if not in_capture:
            self._maybe_log_divergence()
        spec_info = forward_batch.spec_info
        self._graph_mask.select_source(
            self._verify_mask is not None and spec_info is not None and spec_info.custom_mask is not None
        )
        bs = forward_batch.batch_size
        self._step_qo_indptr = self._graph_mask.qo_indptr[: bs + 1]
        self._step_rows = None
        self._step_tree_mask = self._graph_mask.packed

    def init_forward_metadata_in_graph(self, forward_batch):
        super().init_forward_metadata_in_graph(forward_batch)
        if not self._verify_active(forward_batch) or self._graph_mask is None:
            return
        bs = forward_batch.batch_size
        self._graph_mask.refresh(
            self._verify_mask.buffer if self._verify_mask is not None else None,
            self.qo_indptr,
            self.mask_indptr,
            forward_batch.seq_lens,
            bs,
        )

    # ---- forward -------------------------------------------------------------------------------------

    def _call_config(self, q, layer, forward_batch, sinks, score_mod, aux_tensors) -> VerifyCallConfig:
        """The configuration of one verify layer call (attributes, dtypes, which inputs are given; no values)."""
        extra_inputs = ()
        if sinks is not None:
            extra_inputs += ("sinks",)
        if score_mod is not None:
            extra_inputs += ("score_mod",)
        if aux_tensors is not None:
            extra_inputs += ("aux_tensors",)
        window = layer.sliding_window_size
        return VerifyCallConfig(
            device=q.device,
            dtype=q.dtype,
            kv_dtype=self._kv_dtype,
            head_dim_qk=layer.qk_head_dim,
            head_dim_v=layer.v_head_dim,
            num_kv_heads=layer.tp_k_head_num,
            kv_scales=layer_kv_scales(layer),
            sliding_window=-1 if window is None else window,
            attn_type=layer.attn_type,
            cross_attention=bool(layer.is_cross_attention),
            logit_capping=layer.logit_capping_method if layer.logit_cap else "",
            xai_temperature=getattr(layer, "xai_temperature_len", -1) not in (None, -1, 0),
            extra_inputs=extra_inputs,
            mha_one_shot=bool(getattr(forward_batch, "mha_one_shot", False)),
            deterministic=bool(self.enable_deterministic),
            dcp_size=self.dcp_size,
        )

    @torch.compiler.assume_constant_result
    def _fallback_reason(self, fields: tuple, layer_id: int) -> str:
        """"" when the op serves a call of this configuration, else why the parent does; notes the fallback.

        Memoized per configuration (the op's answer is a call into C++). Under torch.compile it runs while
        tracing and its answer is a constant of the graph; the configuration crosses that boundary as a plain
        tuple of its fields (dynamo passes named tuples to such functions malformed, torch 2.14).
        """
        config = VerifyCallConfig(*fields)
        reason = self._routes.get(config)
        if reason is None:
            reason = self._routes[config] = fallback_reason(config, self._ops)
        if reason:
            self._fallbacks.note(reason, layer_id)
        return reason

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, score_mod=None,
                       aux_tensors=None):
        if (
            not self._verify_active(forward_batch)
            or self._step_tree_mask is None
            or self._fallback_reason(tuple(self._call_config(q, layer, forward_batch, sinks, score_mod, aux_tensors)),
                                     layer.layer_id)
        ):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, sinks=sinks,
                                          score_mod=score_mod, aux_tensors=aux_tensors)
        if self.verify_mode == "validate":
            ref = super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
            out = self._tree_verify(q, k, v, layer, forward_batch, save_kv_cache=False, out=None)
            rows = self._step_rows if self._step_rows is not None else out.shape[0]
            self._ops.record_divergence(out[:rows], ref[:rows], self.divergence_stats)
            return ref
        return self._tree_verify(q, k, v, layer, forward_batch, save_kv_cache,
                                 out=getattr(forward_batch, "_attn_output", None))

    def _tree_verify(self, q, k, v, layer, forward_batch, save_kv_cache: bool, out):
        """Saves the draft K/V as the parent does, then runs the op; returns [N, Hq * Dv] like the parent."""
        pool = self.token_to_kv_pool
        if k is None and v is None:  # MLA paths that wrote the cache themselves: read the draft rows back
            k_buffer, v_buffer = pool.get_kv_buffer(layer.layer_id)
            k = k_buffer[forward_batch.out_cache_loc]
            v = v_buffer[forward_batch.out_cache_loc]
        elif k is None or v is None:
            raise ValueError("Both k and v should be None or not None")
        elif save_kv_cache:
            # Served layers have a pool in k's dtype and scales of 1.0 (or none): the parent's scaled write
            # (x / 1.0, and the pool scales only on a dtype change) stores the same bytes as this plain one.
            loc = KVWriteLoc.for_batch(forward_batch, swa_loc=self.forward_metadata.swa_out_cache_loc)
            self._set_kv_buffer(forward_batch, layer, loc, k, v)

        hq, hkv = layer.tp_q_head_num, layer.tp_k_head_num
        dqk, dv = layer.qk_head_dim, layer.v_head_dim
        q3 = q.view(-1, hq, dqk)
        num_tokens = q3.shape[0]
        if out is None:
            out = q.new_empty((num_tokens, hq * dv))
        tree_mask = self._step_tree_mask
        if tree_mask.shape[0] < num_tokens:
            raise ValueError(f"kdtree verify: q has {num_tokens} rows but the step's tree mask {tree_mask.shape[0]} "
                             "(init_forward_metadata saw fewer rows than this forward)")
        md = self.forward_metadata
        self._ops.tree_verify_attention_out(
            q3,
            pool.get_key_buffer(layer.layer_id),
            pool.get_value_buffer(layer.layer_id),
            self._step_qo_indptr,
            md.kv_indptr,
            md.kv_indices,
            tree_mask[:num_tokens],
            layer.scaling,
            float(layer.logit_cap or 0.0),
            k.view(-1, hkv, dqk),
            v.view(-1, hkv, dv),
            out=out.view(num_tokens, hq, dv),
        )
        return out

    # ---- validate mode -------------------------------------------------------------------------------

    def divergence_summary(self) -> dict:
        """Reads the validate-mode statistics (a host sync: call outside graphs and verify paths)."""
        max_abs, non_finite, calls = self.divergence_stats.tolist()
        return {"max_abs_err": max_abs, "non_finite": int(non_finite), "calls": int(calls),
                "steps": self._verify_steps}

    def _maybe_log_divergence(self) -> None:
        """Counts verify steps; in validate mode logs the summary every KDTREE_VERIFY_LOG_EVERY steps."""
        self._verify_steps += 1
        if self.verify_mode == "validate" and self._verify_steps % self._log_every == 0:
            s = self.divergence_summary()
            log = logger.warning if s["non_finite"] or s["max_abs_err"] > 5e-2 else logger.info
            log("kdtree validate: %d verify steps, %d layer calls, max |kdtree - triton| = %.3e, "
                "non-finite kdtree outputs = %d", s["steps"], s["calls"], s["max_abs_err"], s["non_finite"])
