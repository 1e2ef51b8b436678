"""kdtree's side of sglang 0.5.23's graph contract and torch.compile, on the CPU (sglang_rig.py; no capture here:
test_sglang_backend_gpu.py captures and replays CUDA graphs).

`init_cuda_graph_state` allocates kdtree's static step buffers; `init_forward_metadata_out_graph` fills them from
each step's own batch and spec info (at capture, one without a mask; before each replay, new trees, prefix
lengths including 0, and slots); the layer calls read the static buffers, as a captured op would. Compiled with
`fullgraph=True`, a verify layer call is one graph with no break.
"""

from __future__ import annotations

import pytest
import torch
from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402
from sglang_rig import Rig, Step, T, assert_served, run_layers  # noqa: E402


def test_out_graph_fills_static_buffers_that_every_replay_reads(base_calls):
    rig = Rig(max_bs=2)
    backend = rig.backend
    backend.init_cuda_graph_state(2, 2 * T)
    capture = Step(rig, (10, 10), seed=1)
    fb = capture.forward_batch()
    fb.spec_info.custom_mask, fb.seq_lens_cpu = None, None  # a capture-time spec info without a mask
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    backend.init_forward_metadata_in_graph(fb)
    static = backend._step
    assert static.tree_mask is backend._graph.packed and static.kv_indices is backend._graph.kv_indices
    for seed, prefix_lens in ((2, (3, 40)), (3, (17, 0))):
        step = Step(rig, prefix_lens, seed=seed)
        fb = step.forward_batch()
        fb.seq_lens_cpu = None  # as under graphs: no host lengths
        backend.init_forward_metadata_out_graph(fb)  # the replay prep
        assert backend._step.tree_mask is static.tree_mask  # same addresses: what the captured op reads
        assert_served(rig, step, run_layers(rig, step, fb), base_calls)
    assert backend.verify_steps == 2 and backend.op_calls == {0: 2, 1: 2}


@pytest.mark.parametrize("save_kv_cache", [True, False], ids=["save_kv", "no_save"])
def test_compiled_verify_layer_is_one_graph(base_calls, save_kv_cache):
    import torch._dynamo as dynamo

    rig = Rig(num_layers=1)
    step = Step(rig, (12, 5), seed=4)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    layer = rig.layers[0]

    def verify(q, k, v):
        return layer(q, k, v, fb, save_kv_cache=save_kv_cache)

    dynamo.reset()
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=rig.backend)):
        assert dynamo.explain(verify)(step.q, step.k, step.v).graph_break_count == 0
        dynamo.reset()
        out = torch.compile(verify, fullgraph=True)(step.q, step.k, step.v)
    torch.testing.assert_close(out.reshape(step.n, -1).double(), step.reference(0), atol=2e-2, rtol=2e-2)
    assert base_calls == []


# ---- a device-side count of the op's calls (KDTREE_VERIFY_COUNT=1) --------------------------------------------


def test_device_count_of_op_calls_per_layer(monkeypatch, base_calls):
    """Each verify layer call also runs record_divergence on the op's first output row against itself, into that
    layer's stats row: calls counted on the device (so inside replayed graphs too, where no Python runs), and
    non-finite outputs of that row; status() reads them outside graphs. The Python counters stay per eager call."""
    monkeypatch.setenv("KDTREE_VERIFY_COUNT", "1")
    rig = Rig(num_layers=2)
    backend = rig.backend
    steps = 3
    for seed in range(steps):
        step = Step(rig, (5 + seed, 9), seed=seed)
        fb = step.forward_batch()
        backend.init_forward_metadata(fb)
        assert_served(rig, step, run_layers(rig, step, fb), base_calls)
    status = backend.status()
    assert status["device_op_calls"] == {"0": steps, "1": steps}
    assert status["device_non_finite"] == 0
    # A poisoned output row is seen: the count of non-finite elements of the first row.
    step = Step(rig, (4, 4), seed=7)
    fb = step.forward_batch()
    backend.init_forward_metadata(fb)
    rig.pool.get_value_buffer(0)[step.slots[0][0]] = float("nan")  # a prefix row every query of request 0 sees
    run_layers(rig, step, fb)
    status = backend.status()
    assert status["device_op_calls"] == {"0": steps + 1, "1": steps + 1}
    assert status["device_non_finite"] > 0


def test_no_device_count_by_default(monkeypatch, base_calls):
    monkeypatch.delenv("KDTREE_VERIFY_COUNT", raising=False)
    rig = Rig(num_layers=1)
    step = Step(rig, (5, 9), seed=1)
    fb = step.forward_batch()
    rig.backend.init_forward_metadata(fb)
    run_layers(rig, step, fb)
    assert "device_op_calls" not in rig.backend.status()
