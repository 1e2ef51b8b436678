"""DDTREE under SGLang's decode CUDA graphs, on the CPU: what the graphs are captured with, and the replay's checks.

`DecodeCudaGraphRunner.get_spec_info` (sglang 0.5.23, decode_cuda_graph_runner.py) builds the spec info a decode
graph is captured with for EAGLE, DFLASH and NGRAM only; a plugin algorithm got None, so its graphs were captured
with hidden mode NULL and every DDTREE replay (which asks for FULL: the drafter reads the target's layers) failed
`_validate_capture_hidden_mode`. The plugin's AFTER hook (SGLang's HookRegistry) answers DDTREE's capture spec
info. Checked here through SGLang's own code on a runner whose `__init__` is bypassed (only the attributes these
methods read are set): `get_spec_info` wrapped by the hooks the plugin registered, as `HookRegistry.apply_hooks`
wraps it, then capture_prepare's hidden-mode line (`get_required_capture_hidden_mode`), the replay's
`_validate_capture_hidden_mode` and `can_run_graph`; the kdtree backend captures with that spec info and a replay
of a real DDTREE step reads its static buffers. A spawned process (test_sglang_plugin.py) shows `load_plugins`
wraps the real class.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from sglang.srt.model_executor.forward_batch_info import (  # noqa: E402
    CaptureHiddenMode,
    ForwardMode,
    get_required_capture_hidden_mode,
)
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry, _wrap_fn  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang_rig import Step, T, assert_served, run_layers  # noqa: E402
from test_sglang_ddtree_verify import ddtree_batch, ddtree_rig  # noqa: E402

from kdtree_ops.sglang import plugin  # noqa: E402
from kdtree_ops.sglang.ddtree_spec_info import DDTreeVerifyInput  # noqa: E402
from kdtree_ops.testing.trees import ancestor_mask  # noqa: E402

TARGET = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info"
WIDTH = 16  # --speculative-num-draft-tokens: the capture width


def plugin_hooked(original, target: str):
    """`original` wrapped by the hooks registered on `target`, in SGLang's order (HookRegistry._apply_target)."""
    plugin.register()
    wrapped = original
    for hook_type, hook, _source in sorted(HookRegistry._hooks.get(target, []), key=lambda h: h[0].value != "replace"):
        wrapped = _wrap_fn(wrapped, hook, hook_type)
    return wrapped


def graph_runner(algorithm: str = "DDTREE", is_draft_worker: bool = False) -> DecodeCudaGraphRunner:
    """A decode graph runner with __init__ bypassed: the attributes get_spec_info, capture_prepare's hidden-mode
    line, _validate_capture_hidden_mode and can_run_graph read, as __init__ sets them for a target of this width."""
    runner = DecodeCudaGraphRunner.__new__(DecodeCudaGraphRunner)
    runner.model_runner = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.from_string(algorithm),
                                          is_draft_worker=is_draft_worker, device="cpu")
    runner.captured_req_width = runner.speculative_num_draft_tokens = WIDTH
    runner.speculative_num_steps = 1
    runner.capture_hidden_mode = CaptureHiddenMode.NULL  # the server's return-hidden-states mode
    runner.buffers = SimpleNamespace(custom_mask=torch.ones(4 * WIDTH * WIDTH, dtype=torch.bool))
    runner.ragged_verify_mode = runner.require_mlp_tp_gather = runner.require_mlp_sync = False
    runner.enable_pdmux = runner.record_nolora_graph = runner.disable_padding = False
    runner.is_encoder_decoder = runner.enable_two_batch_overlap = False
    runner.max_bs = 4
    return runner


def capture_spec_info(runner: DecodeCudaGraphRunner, bs: int):
    """What capture_prepare does with the spec info: get it, then raise the capture's hidden mode to its mode."""
    spec_info = plugin_hooked(DecodeCudaGraphRunner.get_spec_info, TARGET)(runner, bs * runner.captured_req_width)
    runner.capture_hidden_mode = get_required_capture_hidden_mode(runner.capture_hidden_mode, spec_info)
    return spec_info


def test_ddtree_graphs_are_captured_for_ddtree_s_verify():
    runner = graph_runner()
    spec_info = capture_spec_info(runner, 3)
    # The replay of a DDTREE verify batch (the worker verifies with FULL) passes SGLang's check.
    runner._validate_capture_hidden_mode(SimpleNamespace(capture_hidden_mode=CaptureHiddenMode.FULL))
    assert runner.capture_hidden_mode == CaptureHiddenMode.FULL
    assert isinstance(spec_info, DDTreeVerifyInput)
    assert spec_info.num_tokens_per_req == WIDTH and spec_info.custom_mask is None
    chain = torch.cat([ancestor_mask(list(range(-1, WIDTH - 1)), 1)] * 3)
    assert torch.equal(spec_info.packed_tree_mask, chain)  # [3 * 16, 1]: the capture's shape


def test_can_run_graph_takes_ddtree_batches_of_the_capture_width():
    runner = graph_runner()
    spec = DDTreeVerifyInput.for_capture(2 * WIDTH, WIDTH, "cpu")
    batch = SimpleNamespace(replace_embeds=None, spec_info=spec, batch_size=2, forward_mode=ForwardMode.TARGET_VERIFY,
                            input_ids=torch.zeros(2 * WIDTH, dtype=torch.int64), lora_ids=None, encoder_lens=None)
    assert runner.can_run_graph(batch)
    narrow = DDTreeVerifyInput.for_capture(2 * 8, 8, "cpu")  # another width: eager
    assert not runner.can_run_graph(SimpleNamespace(**{**vars(batch), "spec_info": narrow}))
    assert not runner.can_run_graph(SimpleNamespace(**{**vars(batch), "batch_size": 5}))  # past the largest bucket


@pytest.mark.parametrize("algorithm, is_draft_worker", [("NGRAM", False), ("DDTREE", True), ("NONE", False)])
def test_other_runners_keep_sglang_s_capture(algorithm, is_draft_worker):
    runner = graph_runner(algorithm, is_draft_worker)
    spec_info = capture_spec_info(runner, 2)
    assert not isinstance(spec_info, DDTreeVerifyInput)
    assert runner.capture_hidden_mode == CaptureHiddenMode.NULL


def test_the_plugin_registers_the_capture_hook():
    plugin.register()
    hooks = [(t, h) for t, h, _ in HookRegistry._hooks[TARGET] if h is plugin.ddtree_capture_spec_info_hook]
    assert len(hooks) == 1 and hooks[0][0].value == "after"


def test_the_backend_captures_with_it_and_replays_ddtree_steps(base_calls):
    """The kdtree backend's capture with the capture spec info, then replay preps of real DDTREE steps: the static
    buffers hold each step's own trees (read at the captured addresses)."""
    rig = ddtree_rig(max_bs=2)
    rig.build()
    backend = rig.backend
    backend.init_cuda_graph_state(2, 2 * T)
    capture = Step(rig, (10, 10), seed=1)
    fb = capture.forward_batch()
    fb.spec_info, fb.seq_lens_cpu = DDTreeVerifyInput.for_capture(2 * T, T, "cpu"), None
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    static = backend._step
    for seed, prefix_lens in ((2, (3, 40)), (3, (17, 0))):
        step = Step(rig, prefix_lens, seed=seed)
        fb = ddtree_batch(step)
        fb.seq_lens_cpu = None
        backend.init_forward_metadata_out_graph(fb)
        assert backend._step.tree_mask is static.tree_mask
        assert_served(rig, step, run_layers(rig, step, fb), base_calls)
    assert backend.op_calls == {0: 2, 1: 2}


def test_a_compiled_ddtree_verify_layer_is_one_graph(base_calls):
    """--enable-torch-compile compiles the model forward that the decode graphs capture: a DDTREE verify layer call
    (its forward batch carrying DDTREE's verify input) traces into one graph with no break, and computes the tree."""
    import torch._dynamo as dynamo
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    rig = ddtree_rig(num_layers=1)
    rig.build()
    step = Step(rig, (12, 5), seed=4)
    fb = ddtree_batch(step)
    rig.backend.init_forward_metadata(fb)
    layer = rig.layers[0]

    def verify(q, k, v):
        return layer(q, k, v, fb)

    dynamo.reset()
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=rig.backend)):
        assert dynamo.explain(verify)(step.q, step.k, step.v).graph_break_count == 0
        dynamo.reset()
        out = torch.compile(verify, fullgraph=True)(step.q, step.k, step.v)
    torch.testing.assert_close(out.reshape(step.n, -1).double(), step.reference(0), atol=2e-2, rtol=2e-2)
    assert base_calls == []
