"""DDTREE's verify on the kdtree backend, on the CPU with real sglang 0.5.23 objects (sglang_rig.py).

DDTREE's verify input carries each tree only as the op's packed mask (no dense mask), so the op must serve every
verify layer:
- the launch refuses what would hand a verify layer to another kernel (a verify backend other than kdtree,
  KDTREE_VERIFY=off|validate, --enable-deterministic-inference), each cause named with its fix, through SGLang's own
  argument resolution; the kdtree backend refuses, when it is built, a DDTREE target whose loaded model has a layer
  the op cannot serve (and the flags again), and a verify call that only at run time shows such a reason;
- a DDTREE verify step is served by the op over any base, and the base never prepares a DDTREE verify batch
  (FlashInfer's, flashinfer_mla's and aiter's verify metadata asks the spec info for a dense mask, which
  DDTreeVerifyInput answers with a clear error).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang_rig import Rig, Step, T, assert_served, run_layers  # noqa: E402

from kdtree_ops import ops  # noqa: E402
from kdtree_ops.sglang.ddtree_algorithm import check_ddtree_verify_route, ddtree_verify_refusals  # noqa: E402
from kdtree_ops.testing.trees import ancestor_mask  # noqa: E402

NEEDS_OP = "DDTREE verifies its trees only through the kdtree op"


def ddtree_rig(**kwargs) -> Rig:
    """A rig whose runner verifies for DDTREE (built after the algorithm is set, as SGLang builds it)."""
    rig = Rig(build=False, **kwargs)
    rig.runner.spec_algorithm = SpeculativeAlgorithm.from_string("DDTREE")
    return rig


def ddtree_spec_info(step: Step):
    """The step's trees as DDTREE's verify input carries them: the op's packed mask, no dense mask."""
    from kdtree_ops.sglang.ddtree_spec_info import DDTreeVerifyInput

    packed = torch.cat([ancestor_mask(parents, 1) for parents in step.trees])
    tokens = torch.zeros(step.bs, T, dtype=torch.int64)
    return DDTreeVerifyInput(tokens, step.forward_batch().positions, packed)


def ddtree_batch(step: Step):
    fb = step.forward_batch()
    fb.spec_info = ddtree_spec_info(step)
    return fb


# ---- at launch ----------------------------------------------------------------------------------------------------


def launch(**fields) -> SimpleNamespace:
    args = dict(attention_backend="kdtree", prefill_attention_backend=None, decode_attention_backend=None,
                speculative_attention_mode="prefill", enable_deterministic_inference=False)
    return SimpleNamespace(**{**args, **fields})


@pytest.mark.parametrize("fields", [{}, {"prefill_attention_backend": "kdtree", "decode_attention_backend": "triton"},
                                    {"attention_backend": "triton", "decode_attention_backend": "kdtree",
                                     "speculative_attention_mode": "decode"}],
                         ids=["kdtree", "verify-on-prefill-kdtree", "verify-on-decode-kdtree"])
def test_a_launch_whose_verify_runs_the_op_passes(monkeypatch, fields):
    monkeypatch.delenv("KDTREE_VERIFY", raising=False)
    assert ddtree_verify_refusals(launch(**fields)) == []
    check_ddtree_verify_route(launch(**fields))


@pytest.mark.parametrize("fields, env, cause, fix", [
    ({"attention_backend": "triton"}, {}, "attention backend 'triton'", "--attention-backend kdtree"),
    ({"attention_backend": None}, {}, "SGLang picks", "--attention-backend kdtree"),
    ({"decode_attention_backend": "triton", "speculative_attention_mode": "decode"}, {}, "attention backend 'triton'",
     "--attention-backend kdtree"),
    ({}, {"KDTREE_VERIFY": "off"}, "KDTREE_VERIFY=off runs TARGET_VERIFY on the base", "set it to on"),
    ({}, {"KDTREE_VERIFY": "validate"}, "KDTREE_VERIFY=validate", "set it to on"),
    ({"enable_deterministic_inference": True}, {}, "--enable-deterministic-inference", "launch without it"),
], ids=["triton", "unnamed", "decode-triton", "off", "validate", "deterministic"])
def test_a_launch_whose_verify_would_not_run_the_op_is_refused(monkeypatch, fields, env, cause, fix):
    monkeypatch.delenv("KDTREE_VERIFY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=NEEDS_OP) as info:
        check_ddtree_verify_route(launch(**fields))
    assert cause in str(info.value) and fix in str(info.value), str(info.value)


def test_sglang_s_resolution_runs_the_check(tmp_path, monkeypatch):
    """The algorithm's handle_server_args (called by SGLang's resolution pipeline) refuses the launch."""
    sys.path.insert(0, str(Path(__file__).parent))
    from sglang_cpu import tiny_models
    from sglang.srt.server_args import ServerArgs

    monkeypatch.delenv("KDTREE_VERIFY", raising=False)
    model = str(tiny_models.llama(tmp_path / "llama"))
    args = ServerArgs(model_path=model, device="cpu", dtype="float32", attention_backend="torch_native",
                      speculative_algorithm="DDTREE", speculative_draft_model_path=model)
    with pytest.raises(ValueError, match=NEEDS_OP) as info:
        args.resolve_once()
    assert "attention backend 'torch_native'" in str(info.value)


def test_the_base_default_is_still_sglang_s_answer_for_a_ddtree_launch(tmp_path, monkeypatch):
    """The default base is asked of SGLang by resolving the launch once more with no backend named: that scratch
    resolution is not a launch, and the check must not refuse it (it did, and every DDTREE engine failed to start)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from sglang_cpu import tiny_models
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import ServerArgs

    from kdtree_ops.sglang import base as base_module

    monkeypatch.delenv("KDTREE_VERIFY", raising=False)
    monkeypatch.delenv("KDTREE_BASE_BACKEND", raising=False)
    model = str(tiny_models.llama(tmp_path / "llama"))
    launched = ServerArgs(model_path=model, device="cpu", dtype="float32", attention_backend="kdtree",
                          speculative_algorithm="DDTREE", speculative_draft_model_path=model)
    launched.resolve_once()
    plain = ServerArgs(model_path=model, device="cpu", dtype="float32")
    plain.resolve_once()
    assert base_module.base_backend_name(launched) == (resolution_result(plain, "attention_backend"),
                                                       "SGLang's default")


# ---- when the backend is built, and at a call ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["off", "validate"])
def test_the_backend_refuses_modes_that_verify_on_the_base(monkeypatch, mode):
    monkeypatch.setenv("KDTREE_VERIFY", mode)
    with pytest.raises(RuntimeError, match=NEEDS_OP) as info:
        ddtree_rig().build()
    assert f"KDTREE_VERIFY={mode}" in str(info.value)


def test_the_backend_refuses_a_model_layer_the_op_cannot_serve(monkeypatch):
    """Simulated: the op's answer is no for head dims (96, 96) (the CPU kernel takes any). The triton base has a
    verify path, so without DDTREE the layers would fall back; DDTREE's cannot."""
    real = ops.kernel_unsupported_reason
    monkeypatch.setattr(ops, "kernel_unsupported_reason", lambda device, dtype, dqk, dv, hkv, kv_dtype=None: (
        "no kernel for head dims (96, 96)" if dqk == 96 else real(device, dtype, dqk, dv, hkv, kv_dtype=kv_dtype)))
    with pytest.raises(RuntimeError, match=NEEDS_OP) as info:
        ddtree_rig(head_dim=96).build()
    assert "TARGET_VERIFY of layers 0-1 would run on triton (no kernel for head dims (96, 96)" in str(info.value)
    rig = Rig(head_dim=96, build=False)
    rig.runner.spec_algorithm = SpeculativeAlgorithm.NGRAM  # control: another algorithm's layers fall back
    assert rig.build().base_name == "triton"


def test_the_backend_refuses_deterministic_inference(monkeypatch):
    import sglang.srt.runtime_context as runtime_context

    real = runtime_context.get_exec

    class Deterministic:
        def __init__(self, inner):
            self._inner = inner
            self.deterministic = SimpleNamespace(enable_deterministic_inference=True)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    monkeypatch.setattr(runtime_context, "get_exec", lambda: Deterministic(real()))
    with pytest.raises(RuntimeError, match=NEEDS_OP) as info:
        ddtree_rig().build()
    assert "deterministic inference" in str(info.value)


def test_a_reason_only_a_call_shows_fails_the_call(base_calls):
    """A call carrying attention sinks would take the base's kernel: for DDTREE it raises instead."""
    rig = ddtree_rig(num_layers=1)
    rig.build()
    step = Step(rig, (6, 10), seed=12)
    fb = ddtree_batch(step)
    rig.backend.init_forward_metadata(fb)
    with torch.no_grad(), pytest.raises(RuntimeError, match=NEEDS_OP) as info:
        rig.backend.forward(step.q, step.k, step.v, rig.layers[0], fb, sinks=torch.zeros(4))
    assert "layer 0 cannot run the op (the call carries sinks)" in str(info.value) and base_calls == []


def test_a_ddtree_step_is_served_by_the_op(base_calls):
    rig = ddtree_rig()
    rig.build()
    step = Step(rig, (7, 30), seed=3)
    fb = ddtree_batch(step)
    rig.backend.init_forward_metadata(fb)
    assert_served(rig, step, run_layers(rig, step, fb), base_calls)
    assert rig.backend.op_calls == {0: 1, 1: 1}


# ---- the base never prepares a DDTREE verify batch ----------------------------------------------------------------


class VerifyArgsBase:
    """A base whose verify metadata is FlashInfer's, flashinfer_mla's and aiter's (flashinfer_backend.py:2283-2292):
    it asks the spec info for the verify's attention arguments, `generate_attn_arg_prefill` (for a tree verify input,
    NgramVerifyInput's, which reads `custom_mask.numel()`). Records the forward modes it prepared."""

    def __init__(self, model_runner):
        self.runner, self.prepared = model_runner, []

    def _prepare(self, forward_batch):
        self.prepared.append(forward_batch.forward_mode)
        if forward_batch.forward_mode.is_target_verify():
            forward_batch.spec_info.generate_attn_arg_prefill(
                req_pool_indices=forward_batch.req_pool_indices, paged_kernel_lens=forward_batch.seq_lens,
                paged_kernel_lens_sum=int(forward_batch.seq_lens.sum()), translator=self.runner.kv_index_translator,
                plan=forward_batch.kv_loc_plan)

    def init_forward_metadata(self, forward_batch):
        self._prepare(forward_batch)

    def init_cuda_graph_state(self, max_bs, max_num_tokens, *args, **kwargs):
        pass

    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        self._prepare(forward_batch)

    def init_forward_metadata_in_graph(self, forward_batch):
        self._prepare(forward_batch)

    verify_mask = None


@pytest.fixture
def verify_args_base(monkeypatch):
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    monkeypatch.setitem(ATTENTION_BACKENDS, "verify_args_probe", VerifyArgsBase)
    return "verify_args_probe"


def test_a_base_with_verify_metadata_never_prepares_a_ddtree_verify(verify_args_base):
    """Seen before this fix: kdtree forwarded the verify metadata init to such a base, whose call crashed on the
    first verify (AttributeError: 'NoneType' object has no attribute 'numel')."""
    rig = ddtree_rig(base=verify_args_base)
    rig.build()
    base = rig.backend.base
    step = Step(rig, (9, 4), seed=8)
    fb = ddtree_batch(step)
    rig.backend.init_forward_metadata(fb)
    assert base.prepared == []
    assert_served(rig, step, run_layers(rig, step, fb), [])
    rig.backend.init_cuda_graph_state(2, 2 * T)
    rig.backend.init_forward_metadata_out_graph(fb, in_capture=True)
    rig.backend.init_forward_metadata_out_graph(fb)
    rig.backend.init_forward_metadata_in_graph(fb)
    assert base.prepared == []
    decode = step.forward_batch()
    decode.forward_mode = decode.forward_mode.DECODE  # everything else is the base's
    rig.backend.init_forward_metadata(decode)
    assert [m.name for m in base.prepared] == ["DECODE"]


def test_a_base_that_asks_a_ddtree_verify_input_for_its_arguments_gets_a_clear_error(verify_args_base):
    rig = ddtree_rig(base=verify_args_base)
    rig.build()
    fb = ddtree_batch(Step(rig, (5, 5), seed=9))
    with pytest.raises(RuntimeError, match="carries its tree only as the kdtree op's packed mask") as info:
        rig.backend.base.init_forward_metadata(fb)
    assert "--attention-backend kdtree" in str(info.value)
