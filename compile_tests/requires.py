"""Dependencies of test suites: a missing one fails the suite, never skips it.

The test command (`pip install -e '.[test,sglang]'`) installs every dependency, so a missing one is a broken
environment, and a suite that skipped instead would vanish from the results unnoticed.
"""

from __future__ import annotations

import importlib
import types


def require(module: str, install: str) -> types.ModuleType:
    """The module, or ImportError naming how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"this suite needs {module}: {install} ({exc})") from exc
