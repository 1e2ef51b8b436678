"""Which TARGET_VERIFY layer calls the kdtree op serves, and which go to the base backend.

Decided from configuration only, never from tensor values, so the answer is the same at capture and at every
replay: the layer's attributes (head dims, KV heads, the KV scales SGLang loaded as Python floats, sliding window,
capping, attention type), the dtypes and device of q and of the KV pool, the pool's kind, which optional inputs the
call carries, and the backend's own switches. The op answers for itself what it has a kernel for on this device
(`ops.kernel_unsupported_reason`: dtype, head dims, KV heads, KV dtype, the shared memory its configuration
needs); this module adds what the backend does not pass to the op (sinks, windows, block-scaled pools, ...).

KV scales. An fp8 pool (`--kv-cache-dtype fp8_e4m3/fp8_e5m2`) stores value / scale with the layer's per-tensor
`k_scale_float`/`v_scale_float` (1.0 when the checkpoint has none); where the op answers yes for the pool's dtype,
it serves the layer with those scales as its k_scale/v_scale. FP8-weight checkpoints give every RadixAttention an
`Fp8KVCacheMethod` whose scales are 1.0 when the checkpoint has none, also over a pool in q's dtype (sglang 0.5.23,
quantization/kv_cache.py): served. Scales other than 1.0 over a pool in q's dtype fall back: SGLang's Triton kernel
multiplies such a cache by them, and the op scales fp8 caches only. Block-scaled pools (FP4, MXFP8) fall back.

Every layer that falls back is noted with its reason; `FallbackLog.flush` (run from the metadata init, outside any
graph) logs one WARNING per distinct reason the first time it appears, naming the layers.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from sglang.srt.layers.radix_attention import AttentionType

logger = logging.getLogger(__name__)

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# Keyword inputs the op takes as they come: absorbed MLA's rope parts, which the backend concatenates.
MLA_SPLIT_INPUTS = ("q_rope", "k_rope")


class VerifyCallConfig(NamedTuple):
    """What decides the route of one verify layer call: Python values only (under torch.compile, constants)."""

    device: torch.device
    dtype: torch.dtype  # q's
    kv_dtype: torch.dtype  # the KV pool's (fp8 pools store uint8 and report the fp8 dtype here)
    head_dim_qk: int
    head_dim_v: int
    num_kv_heads: int
    kv_scales: tuple | None  # (k_scale_float, v_scale_float) of a layer with KV scales; None without
    sliding_window: int  # > -1: windowed
    attn_type: AttentionType
    cross_attention: bool
    logit_capping: str  # "" without capping, else the method
    xai_temperature: bool
    extra_inputs: tuple  # names of the optional inputs the call carries (sinks, score_mod, aux_tensors, ...)
    mha_one_shot: bool
    deterministic: bool  # --enable-deterministic-inference
    dcp_size: int
    pool_note: str  # "" for a plain token-slot pool, else why its slots or bytes are not the op's


def fallback_reason(config: VerifyCallConfig, ops) -> str:
    """"" when the op serves a call of this configuration, else why the base's kernel does (one phrase)."""
    if config.deterministic:
        return ("deterministic inference: the op cuts a request's keys into pieces by the whole batch's work "
                "(not batch-invariant); the base backend's batch-invariant kernels serve")
    if config.pool_note:
        return config.pool_note
    if config.dcp_size > 1:
        return f"decode-context parallelism (attn_dcp_size = {config.dcp_size})"
    if config.mha_one_shot:
        return "the MHA one-shot path"
    if config.extra_inputs:
        return f"the call carries {', '.join(config.extra_inputs)}"
    if config.sliding_window > -1:
        return f"sliding window of {config.sliding_window}"
    if config.cross_attention or config.attn_type != AttentionType.DECODER:
        return f"not causal decoder attention ({config.attn_type.value}, cross={config.cross_attention})"
    if config.logit_capping and config.logit_capping != "tanh":
        return f"logit capping method {config.logit_capping!r} (the op has tanh only)"
    if config.xai_temperature:
        return "xai temperature scaling"
    unsupported = ops.kernel_unsupported_reason(config.device, config.dtype, config.head_dim_qk,
                                                config.head_dim_v, config.num_kv_heads, kv_dtype=config.kv_dtype)
    if unsupported:
        return f"{unsupported} (q {config.dtype}, KV cache {config.kv_dtype}, {config.device.type})"
    scales = config.kv_scales
    if scales is not None and None in scales:
        return "KV scales not loaded (the layer has scale tensors but no float copies yet)"
    if config.kv_dtype in FP8_DTYPES:
        if scales is not None and not all(s > 0 and s != float("inf") for s in scales):
            return f"fp8 KV scales (k, v) = {scales} (the op needs finite scales > 0)"
        return ""
    if scales is not None and scales != (1.0, 1.0):
        return (f"KV scales (k, v) = {scales} over a {config.kv_dtype} KV cache (the base's kernel multiplies that "
                "cache by them; the op scales fp8 caches only)")
    return ""


def layer_kv_scales(layer) -> tuple | None:
    """(k_scale_float, v_scale_float) as SGLang loaded them (Python floats), or None for a layer without scales.

    A layer with scale tensors but no float copies yet (weights not loaded) gets (None, None): it falls back.
    """
    if getattr(layer, "k_scale", None) is None and getattr(layer, "v_scale", None) is None:
        return None
    return (getattr(layer, "k_scale_float", None), getattr(layer, "v_scale_float", None))


def op_kv_scales(layer, kv_dtype: torch.dtype) -> tuple[float, float]:
    """The (k_scale, v_scale) the op multiplies the pool's stored values by: the layer's scales for an fp8 pool
    (1.0 where the checkpoint has none, as SGLang's kernels read them), else 1.0."""
    if kv_dtype not in FP8_DTYPES:
        return 1.0, 1.0
    scales = layer_kv_scales(layer) or (1.0, 1.0)
    return float(scales[0] or 1.0), float(scales[1] or 1.0)


def pool_note(pool, translator) -> str:
    """Why a pool's slots or bytes are not what the op reads, or "" for a plain token-slot pool."""
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    if isinstance(pool, SWAKVPool):
        return "a hybrid sliding-window KV pool (its window layers' slots are translated)"
    if translator is not None and getattr(translator, "is_translating", False):
        return "a unified KV pool (req_to_token holds virtual ids)"
    if getattr(pool, "is_quantized_kv_cache", False) or getattr(pool, "k_scale_buffer", None) is not None:
        return f"a block-scaled KV cache ({type(pool).__name__}; the op takes per-tensor scales only)"
    return ""


def layer_ranges(layer_ids) -> str:
    """'0-3, 7, 9-10' for {0, 1, 2, 3, 7, 9, 10}."""
    ids = sorted(set(layer_ids))
    parts, start = [], None
    for i, x in enumerate(ids):
        if start is None:
            start = x
        if i + 1 == len(ids) or ids[i + 1] != x + 1:
            parts.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(parts)


class FallbackLog:
    """The layers that fell back, per reason; one WARNING per reason, the first time it is seen."""

    def __init__(self, base_name: str = "the base backend"):
        self.base_name = base_name
        self._pending: dict[str, set] = {}
        self._logged: set[str] = set()
        self.layers: dict[str, set] = {}  # every reason seen, with its layers (for the status)

    def note(self, reason: str, layer_id: int) -> None:
        self.layers.setdefault(reason, set()).add(layer_id)
        if reason not in self._logged:
            self._pending.setdefault(reason, set()).add(layer_id)

    def flush(self) -> None:
        """Outside graphs (the metadata init): logs the reasons noted since the last flush for the first time."""
        for reason, layers in self._pending.items():
            plural = "s" if len(layers) > 1 else ""
            logger.warning("kdtree: TARGET_VERIFY of layer%s %s runs on %s's kernel: %s",
                           plural, layer_ranges(layers), self.base_name, reason)
            self._logged.add(reason)
        self._pending.clear()
