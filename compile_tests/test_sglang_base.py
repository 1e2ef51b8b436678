"""kdtree over a base backend, on the CPU with real sglang 0.5.23 objects (sglang_rig.py).

What is checked: the base is the one named by KDTREE_BASE_BACKEND, else SGLang's own answer for the launch
arguments (its resolution pipeline, compared with SGLang resolving the same arguments itself); names SGLang does
not know, and kdtree itself, are refused; every AttentionBackend member kdtree does not define is the base's
(class-level defaults included), and the backend's name answers the base's; a base without TARGET_VERIFY
(torch_native) serves while the op serves every verify layer and fails when the backend is built otherwise,
naming the layers and the fix; validate mode compares with the base's verify on the device.
"""

from __future__ import annotations

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend  # noqa: E402
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend  # noqa: E402
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang_rig import (  # noqa: E402
    Rig,
    Step,
    assert_served,
    base_backend,
    run_layers,
)

from kdtree_ops import ops  # noqa: E402
from kdtree_ops.sglang import base as base_module  # noqa: E402
from kdtree_ops.sglang.backend import KDTreeAttnBackend  # noqa: E402

# ---- which base -------------------------------------------------------------------------------------------


def test_named_base_is_built_and_answers_the_backend_name():
    rig = Rig(base="triton")
    backend = rig.backend
    assert isinstance(backend, KDTreeAttnBackend) and not isinstance(backend, TritonAttnBackend)
    assert type(backend.base) is TritonAttnBackend
    assert (backend.base_name, backend.base_source) == ("triton", "KDTREE_BASE_BACKEND")
    # SGLang stamps the wrapper after building it; model code reads the name to pick its attention method, and
    # every call but the op's runs the base's kernels, so the name stays the base's.
    backend.prefill_attention_backend_str = backend.decode_attention_backend_str = "kdtree"
    assert backend.prefill_attention_backend_str == backend.decode_attention_backend_str == "triton"
    assert "everything else by triton (KDTREE_BASE_BACKEND)" in backend.status_line()


@pytest.mark.parametrize("name, match", [("no_such_backend", "not a registered SGLang attention backend"),
                                         ("kdtree", "cannot be its own base")])
def test_bad_base_names_are_refused(name, match):
    rig = Rig(build=False)
    rig.base = name
    with pytest.raises(ValueError, match=match) as info:
        rig.build()
    assert "KDTREE_BASE_BACKEND" in str(info.value) or "triton" in str(info.value)


def test_sglang_default_is_sglangs_own_answer(tmp_path):
    """The default base is what SGLang resolves when no backend is named: asked of SGLang's pipeline on the
    resolved kdtree launch arguments, it equals SGLang resolving the same arguments without a backend."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from sglang_cpu import tiny_models
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import ServerArgs

    model = tiny_models.llama(tmp_path / "llama")
    launched = ServerArgs(model_path=str(model), device="cpu", attention_backend="kdtree", dtype="float32")
    launched.resolve_once()
    plain = ServerArgs(model_path=str(model), device="cpu", dtype="float32")
    plain.resolve_once()
    expected = resolution_result(plain, "attention_backend")
    assert expected  # SGLang named one (intel_amx, or torch_native where its AMX kernels are missing)
    assert base_module.sglang_default_backend(launched) == expected
    with base_backend(None):
        assert base_module.base_backend_name(launched) == (expected, "SGLang's default")


def test_default_needs_resolved_arguments():
    with pytest.raises(RuntimeError, match="set KDTREE_BASE_BACKEND"):
        base_module.sglang_default_backend(object())


# ---- composition: everything else is the base's ------------------------------------------------------------


def test_members_the_wrapper_does_not_define_are_the_base_s():
    rig = Rig(base="triton")
    backend, base = rig.backend, rig.backend.base
    own = {"forward", "forward_extend", "forward_decode", "init_forward_metadata", "init_cuda_graph_state",
           "init_forward_metadata_out_graph", "init_forward_metadata_in_graph", "verify_mask",
           "update_verify_buffers_to_fill_after_draft", "glue_target_verify_metadata", "__init__"}
    for name in vars(AttentionBackend):
        if name.startswith("__") or name == "_abc_impl":
            continue
        member = vars(KDTreeAttnBackend)[name]
        assert (name in own) != isinstance(member, property) or name == "verify_mask", name
    assert backend.get_cuda_graph_seq_len_fill_value is not None  # a method of AttentionBackend: the base's
    assert backend.kv_index_translator is base.kv_index_translator is rig.runner.kv_index_translator
    assert backend.get_cuda_graph_seq_len_fill_value() == base.get_cuda_graph_seq_len_fill_value()
    assert backend.kv_indptr is base.kv_indptr  # an attribute of the base's own
    assert backend.verify_mask is base.verify_mask
    step = Step(rig, (4, 5), seed=1)
    backend.init_forward_metadata(step.forward_batch())
    assert backend.forward_metadata is base.forward_metadata is not None


# ---- a base without TARGET_VERIFY -------------------------------------------------------------------------------


def _speculative(rig: Rig) -> Rig:
    rig.runner.spec_algorithm = SpeculativeAlgorithm.NGRAM  # the runner verifies
    return rig


def test_base_without_verify_serves_while_the_op_serves_every_layer(base_calls):
    rig = _speculative(Rig(base="torch_native", build=False))
    rig.build()
    assert type(rig.backend.base) is TorchNativeAttnBackend
    step = Step(rig, (7, 2), seed=2)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    assert_served(rig, step, run_layers(rig, step, fb), base_calls)
    assert rig.backend.op_calls == {0: 1, 1: 1}


def test_base_without_verify_fails_at_init_for_a_layer_that_needs_it(monkeypatch):
    """Simulated: the op's answer is no for head dims (96, 96) (the CPU kernel takes any)."""
    real = ops.kernel_unsupported_reason
    monkeypatch.setattr(ops, "kernel_unsupported_reason", lambda device, dtype, dqk, dv, hkv, kv_dtype=None: (
        "no kernel for head dims (96, 96)" if dqk == 96 else real(device, dtype, dqk, dv, hkv, kv_dtype=kv_dtype)))
    rig = _speculative(Rig(base="torch_native", head_dim=96, build=False))
    with pytest.raises(RuntimeError) as info:
        rig.build()
    message = str(info.value)
    for part in ("TARGET_VERIFY of layers 0-1", "no kernel for head dims (96, 96)", "torch_native has no TARGET_VERIFY",
                 "KDTREE_BASE_BACKEND", "intel_amx"):
        assert part in message, message


@pytest.mark.parametrize("mode", ["off", "validate"])
def test_base_without_verify_fails_at_init_in_modes_that_need_it(monkeypatch, mode):
    monkeypatch.setenv("KDTREE_VERIFY", mode)
    rig = _speculative(Rig(base="torch_native", build=False))
    with pytest.raises(RuntimeError, match=f"KDTREE_VERIFY={mode} runs TARGET_VERIFY on the base backend"):
        rig.build()
    rig.runner.spec_algorithm = SpeculativeAlgorithm.NONE  # without speculative decoding nothing verifies
    assert rig.build().base_name == "torch_native"


# ---- validate mode ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("planted", [0.0, 0.5], ids=["agree", "planted"])
def test_validate_mode_compares_with_the_base(monkeypatch, planted):
    """The base (a recorder here: Triton has no CPU path) returns the float64 reference plus `planted`; the op's
    divergence from it is recorded on the device, and the base's output is what the layer returns."""
    monkeypatch.setenv("KDTREE_VERIFY", "validate")
    rig = Rig()
    step = Step(rig, (12, 3), seed=5)

    def base_verify(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return (step.reference(layer.layer_id) + planted).to(q.dtype)

    monkeypatch.setattr(TritonAttnBackend, "forward_extend", base_verify)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    outs = run_layers(rig, step, fb)
    summary = rig.backend.divergence_summary()
    assert summary["calls"] == 2 and summary["non_finite"] == 0
    if planted:
        assert 0.45 < summary["max_abs_err"] < 0.55, summary
    else:
        assert summary["max_abs_err"] < 2e-2, summary
    for layer, out in zip(rig.layers, outs):
        torch.testing.assert_close(out.double(), (step.reference(layer.layer_id) + planted).to(out.dtype).double())
    assert rig.backend.status()["validate"]["calls"] == 2


# ---- host lengths -------------------------------------------------------------------------------------------------


def test_kdtree_asks_for_host_lengths_only_where_its_base_does():
    """kdtree's verify metadata sizes its prefix-slot gather by a host bound on the lengths (seq_lens_cpu's max, else
    SGLang's max_seq_len_host), so it asks for host lengths (needs_cpu_seq_lens) exactly where its base does: over
    triton SGLang's overlap scheduler copies none and never waits for a round's publish (decide_needs_cpu_seq_lens).
    Each way the step is the float64 reference; the gather spans the host lengths, the allocated bound, or (with
    neither) the table's width."""
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens

    rig = Rig(base="triton")
    assert rig.backend.base.needs_cpu_seq_lens is False
    assert rig.backend.needs_cpu_seq_lens is False and decide_needs_cpu_seq_lens([rig.backend]) is False
    rig.backend.base.needs_cpu_seq_lens = True  # a base that reads host lengths: kdtree asks for them too
    assert rig.backend.needs_cpu_seq_lens is True and decide_needs_cpu_seq_lens([rig.backend]) is True
    del rig.backend.base.needs_cpu_seq_lens
    step = Step(rig, (4, 9), seed=2)
    width = rig.runner.req_to_token_pool.req_to_token.shape[1]
    for host_lens, allocated, gathered in ((True, None, 9), (False, 12, 12), (False, None, width)):
        fb = step.forward_batch()
        fb.seq_lens_cpu = fb.seq_lens_cpu if host_lens else None
        fb.max_seq_len_host = allocated
        rig.backend.init_forward_metadata(fb)
        assert rig.backend._step.kv_indices.numel() == 2 * gathered + 1
        assert_served(rig, step, run_layers(rig, step, fb), [])
