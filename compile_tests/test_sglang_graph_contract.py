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
