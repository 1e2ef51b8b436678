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

Layers the op does not cover fall back to the parent, per call and by configuration only (no tensor values):
sliding-window layers, attention sinks, score_mod/aux tensors, scaled (fp8) KV caches or a cache dtype other
than q's, non-tanh logit capping, xai temperature, cross/encoder attention, DCP, deterministic mode, DLLM.
"""

from __future__ import annotations

import logging
import os

import torch

from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from .verify_metadata import GraphTreeMask, mask_words, packed_tree_mask

logger = logging.getLogger(__name__)

VERIFY_MODES = ("off", "validate", "on")

def verify_mode_from_env() -> str:
    """KDTREE_VERIFY = off | validate | on (default on); anything else is an error naming the variable."""
    mode = os.environ.get("KDTREE_VERIFY", "on").strip().lower() or "on"
    if mode not in VERIFY_MODES:
        raise ValueError(f"KDTREE_VERIFY must be one of {'|'.join(VERIFY_MODES)}, got {mode!r}")
    return mode


class KDTreeAttnBackend(TritonAttnBackend):
    """TritonAttnBackend whose TARGET_VERIFY attention is the kdtree tree-verify op (GQA/MHA and MLA)."""

    def __init__(self, model_runner, *args, **kwargs):
        super().__init__(model_runner, *args, **kwargs)
        self.verify_mode = verify_mode_from_env()
        if self.verify_mode != "off":
            from kdtree_ops import ops  # builds/loads the library once per process

            self._ops = ops
        self._graph_mask: GraphTreeMask | None = None
        # The mask and int32 qo_indptr of the step being run (eager) or captured (graph).
        self._step_tree_mask: torch.Tensor | None = None
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
        if not self._verify_active(forward_batch):
            return
        self._maybe_log_divergence()
        md = self.forward_metadata
        num_tokens_per_req = self._target_verify_num_tokens_per_req(forward_batch.spec_info)
        bs = md.qo_indptr.shape[0] - 1
        qo_indptr = md.qo_indptr.to(torch.int32)  # already int32 here: no copy
        spec_info = forward_batch.spec_info
        self._step_qo_indptr = qo_indptr
        self._step_tree_mask = packed_tree_mask(
            spec_info.custom_mask if spec_info is not None else None,
            md.mask_indptr,
            qo_indptr,
            forward_batch.seq_lens,
            bs * num_tokens_per_req,
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

    def _op_serves(self, q, layer, forward_batch, sinks, score_mod, aux_tensors) -> bool:
        """Whether the kdtree op covers this verify call (configuration only; no tensor values read)."""
        return (
            self._step_tree_mask is not None
            and self._ops.has_kernel_for(q.device, q.dtype, layer.qk_head_dim, layer.v_head_dim,
                                         layer.tp_k_head_num)
            and sinks is None
            and score_mod is None
            and aux_tensors is None
            and self.dcp_size == 1
            and not self.enable_deterministic
            and not getattr(forward_batch, "mha_one_shot", False)
            and not (layer.sliding_window_size is not None and layer.sliding_window_size > -1)
            and not layer.is_cross_attention
            and layer.attn_type == AttentionType.DECODER
            and layer.k_scale is None
            and (layer.logit_capping_method == "tanh" or not layer.logit_cap)
            and getattr(layer, "xai_temperature_len", -1) in (None, -1, 0)
        )

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, score_mod=None,
                       aux_tensors=None):
        if not self._verify_active(forward_batch) or not self._op_serves(
            q, layer, forward_batch, sinks, score_mod, aux_tensors
        ):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, sinks=sinks,
                                          score_mod=score_mod, aux_tensors=aux_tensors)
        if self.verify_mode == "validate":
            ref = super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
            out = self._tree_verify(q, k, v, layer, forward_batch, save_kv_cache=False, out=None)
            self._ops.record_divergence(out, ref, self.divergence_stats)
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
            loc = KVWriteLoc.for_batch(forward_batch, swa_loc=self.forward_metadata.swa_out_cache_loc)
            self._set_kv_buffer(forward_batch, layer, loc, k, v)

        hq, hkv = layer.tp_q_head_num, layer.tp_k_head_num
        dqk, dv = layer.qk_head_dim, layer.v_head_dim
        q3 = q.view(-1, hq, dqk)
        num_tokens = q3.shape[0]
        if out is None:
            out = q.new_empty((num_tokens, hq * dv))
        md = self.forward_metadata
        self._ops.tree_verify_attention_out(
            q3,
            pool.get_key_buffer(layer.layer_id),
            pool.get_value_buffer(layer.layer_id),
            self._step_qo_indptr,
            md.kv_indptr,
            md.kv_indices,
            self._step_tree_mask[:num_tokens],
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
