"""Optional dependencies of test suites: skipped on a developer's machine without them, a failure under CI.

CI (`CI=true`, as GitHub Actions and most runners set it) installs every test dependency, so a missing one
there is a broken environment, and a suite that skipped instead would vanish from the results unnoticed.
"""

from __future__ import annotations

import importlib
import os
import types

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def import_or_skip_outside_ci(module: str, reason: str) -> types.ModuleType:
    """The module; if it cannot be imported, skips the calling test module, or under CI raises ImportError."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if in_ci():
            raise ImportError(f"{reason} (CI=true: this suite must run, not skip): {exc}") from exc
        pytest.skip(f"{reason}: {exc}", allow_module_level=True)
