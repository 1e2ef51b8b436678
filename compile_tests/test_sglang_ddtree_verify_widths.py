"""DDTREE's verify graphs of the budget policy's narrower widths (kdtree_ops/sglang/verify_widths.py): which widths
are captured, that each gets an attention backend of its own, and that a round's swap of the model runner's pair
lasts its forward alone. SGLang's runner is a stand-in here (CUDA graphs do not run on the CPU); the GPU engine
bench replays the real ones."""

import pytest

from kdtree_ops.sglang.ddtree_budgets import parse_budgets
from kdtree_ops.sglang.verify_widths import VerifyWidthGraphs, narrower_widths


def test_narrower_widths_are_the_policys_widths_but_the_launch_width():
    policy = parse_budgets("1:64,8:16,24:1", 64, 8, 16)
    assert narrower_widths(64, [1, 2, 4, 8, 16, 24, 32], policy.width) == [1, 16]
    assert narrower_widths(64, [20, 1, 4], policy.width) == [16]  # no captured batch reaches plain decode
    assert narrower_widths(64, [32], policy.width) == [1, 16]  # one graph of 32 serves batches 1..32
    assert narrower_widths(64, [1, 8, 160], lambda b: 64) == []


class _GraphRunner:
    def __init__(self, model_runner, *, attn_backend, speculative_num_draft_tokens):
        self.attn_backend, self.width = attn_backend, speculative_num_draft_tokens
        self.capture_bs = [1, 2, 4]
        model_runner.captures.append(self)


class _ModelRunner:
    def __init__(self):
        self.captures, self.backends = [], 0
        self.init_new_workspace = False
        self.attn_backend, self.decode_cuda_graph_runner = "sglang backend", "sglang runner"

    def _get_attention_backend(self, init_new_workspace=False):
        assert init_new_workspace and self.init_new_workspace is False  # asked for a workspace of its own
        self.init_new_workspace = "changed by the factory"
        self.backends += 1
        return f"backend {self.backends}"

    def _decode_cuda_graph_runner_cls(self):
        return _GraphRunner


def test_each_width_captures_with_a_backend_of_its_own():
    runner = _ModelRunner()
    graphs = VerifyWidthGraphs(runner, [1, 16])
    assert [(r.width, r.attn_backend) for r in runner.captures] == [(1, "backend 1"), (16, "backend 2")]
    assert runner.init_new_workspace is False  # restored after each factory call
    assert (runner.attn_backend, runner.decode_cuda_graph_runner) == ("sglang backend", "sglang runner")
    assert graphs.states[16] == ("backend 2", runner.captures[1])


def test_the_swap_lasts_the_forward_alone_even_when_it_raises():
    runner = _ModelRunner()
    graphs = VerifyWidthGraphs(runner, [1])
    with graphs.serving(1):
        assert (runner.attn_backend, runner.decode_cuda_graph_runner) == ("backend 1", runner.captures[0])
    assert (runner.attn_backend, runner.decode_cuda_graph_runner) == ("sglang backend", "sglang runner")
    with pytest.raises(RuntimeError, match="forward failed"):
        with graphs.serving(1):
            raise RuntimeError("forward failed")
    assert (runner.attn_backend, runner.decode_cuda_graph_runner) == ("sglang backend", "sglang runner")
    with graphs.serving(64):  # the launch width: SGLang's own pair
        assert (runner.attn_backend, runner.decode_cuda_graph_runner) == ("sglang backend", "sglang runner")
