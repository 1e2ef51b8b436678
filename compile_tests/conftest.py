"""Shared setup of the kdtree_ops test suites.

- Hypothesis runs under the "kdtree" profile: no deadline (the first call of an op may build the library;
  CPU kernels on a shared 2-core CI machine are slow to start) and few examples per property, so the CPU
  suite stays within a few minutes. `HYPOTHESIS_PROFILE=thorough` runs ten times as many.
- Tests marked `cuda` need a CUDA device; suites generate them only when one is present (their DEVICES
  lists), and this file skips any that remain on a machine without one. The suites that need a GPU as a
  whole (GPU_SUITES) are not collected without one: examples/gpu_suite.sh runs them on the GPU machine.
  CPU tests never skip.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "kdtree",
    deadline=None,
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("thorough", parent=settings.get_profile("kdtree"), max_examples=250)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "kdtree"))


GPU_SUITES = ["test_cuda_numerics.py", "test_cuda_graphs.py", "test_cuda_errors.py", "test_cuda_fp8.py",
              "test_cuda_ddtree.py", "test_cuda_ddtree_levels.py", "test_sglang_backend_gpu.py"]
collect_ignore = [] if torch.cuda.is_available() else GPU_SUITES


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ops():
    """kdtree_ops.ops, built and loaded once per session (the first use compiles csrc/)."""
    import kdtree_ops.ops

    return kdtree_ops.ops


@pytest.fixture
def base_calls(monkeypatch):
    """The SGLang suites' base-backend recorder: replaces TritonAttnBackend.forward_extend (no CPU path) by one that
    records the layer ids it is called with and returns sglang_rig.BASE_OUTPUT; yields the records."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang_rig import BASE_OUTPUT

    calls = []

    def recorder(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        calls.append(layer.layer_id)
        return torch.full((q.shape[0], layer.tp_q_head_num * layer.v_head_dim), BASE_OUTPUT, dtype=q.dtype)

    monkeypatch.setattr(TritonAttnBackend, "forward_extend", recorder)
    return calls

