"""Fixtures the CPU engine tests share: one engine driver a test module, the DDTree target and drafter checkpoints.

A test module imports `host` by name (pytest finds fixtures in the module's namespace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_cpu import ddtree_models
from sglang_cpu.engine_host import EngineHost


@pytest.fixture(scope="module")
def host(ops):  # the library built first (the engines' scheduler processes load it from the cache)
    engine_host = EngineHost()
    yield engine_host
    engine_host.close()


def ddtree_checkpoints(root: Path) -> dict:
    """The Markov target and the DFlash drafter that agrees with it most of the time (ddtree_models.py)."""
    return {"target": str(ddtree_models.markov_llama(root / "target")),
            "draft": str(ddtree_models.dflash_draft(root / "draft"))}
