"""TEST-ONLY stand-in for the `sgl_kernel` package on a CPU: SGLang's CPU entry points written in torch.

sglang 0.5.23 on the CPU (`SGLANG_USE_CPU_ENGINE=1`) imports a few CPU kernels from `sgl_kernel`, and no published
wheel is a CPU build (the installed sglang-kernel is a CUDA build that cannot even be imported without a driver).
The engine tests put this folder first on PYTHONPATH, so SGLang's scheduler processes (spawned, they inherit the
environment) import this package instead. It provides exactly what the tiny engine tests reach:

- the KV-slot and speculative-decoding helpers (sglang_cpu/spec_kernels.py), as module functions;
- `torch.ops.sgl_kernel.extend_attention_cpu` / `decode_attention_cpu`, the intel_amx backend's kernels
  (sglang_cpu/attention_kernels.py), registered with torch.library.

`torch.ops.sgl_kernel.convert_weight_packed` stays undefined on purpose: SGLang then treats the CPU as having no
AMX kernels, and linear layers, norms and activations take their torch `forward_native` paths. Never part of the
kdtree_ops package; examples/sglang/engine_cpu.py borrows it and says so.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

_tests = str(Path(__file__).resolve().parents[3])  # compile_tests/, the home of the sglang_cpu helpers
if _tests not in sys.path:
    sys.path.append(_tests)

from sglang_cpu import attention_kernels  # noqa: E402
from sglang_cpu.spec_kernels import (  # noqa: E402
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu", "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu", "build_tree_kernel_efficient_cpu", "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu", "rotate_input_ids_cpu", "verify_tree_greedy_cpu",
]
__version__ = "0.0.0+kdtree-test-stand-in"
IS_TEST_STAND_IN = True

_lib = torch.library.Library("sgl_kernel", "FRAGMENT")
_lib.define(
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
    "Tensor(b!) k_buffer, Tensor(c!) v_buffer, float k_scale, float v_scale, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, "
    "float sm_scale, float logit_cap, bool is_cross_attn, int sliding_window, Tensor? encoder_lens, Tensor? sinks, "
    "Tensor? tree_mask, bool is_causal) -> ()")
_lib.define(
    "decode_attention_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, float k_scale, float v_scale, "
    "Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attn, "
    "int sliding_window, Tensor? encoder_lens, Tensor? sinks) -> ()")
_lib.impl("extend_attention_cpu", attention_kernels.extend_attention_cpu, "CPU")
_lib.impl("decode_attention_cpu", attention_kernels.decode_attention_cpu, "CPU")
