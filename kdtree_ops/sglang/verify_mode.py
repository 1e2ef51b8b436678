"""KDTREE_VERIFY: what serves TARGET_VERIFY (read when a backend is built, and at a DDTREE launch).

- `on` (default): the kdtree op;
- `off`: the base backend;
- `validate`: both, the op's divergence from the base recorded on the device, the base's output returned.
Kept apart from backend.py so the launch-time check imports nothing heavy.
"""

from __future__ import annotations

import os

VERIFY_ENV = "KDTREE_VERIFY"
VERIFY_MODES = ("off", "validate", "on")


def verify_mode_from_env() -> str:
    """KDTREE_VERIFY = off | validate | on (default on); anything else is an error naming the variable."""
    mode = os.environ.get(VERIFY_ENV, "on").strip().lower() or "on"
    if mode not in VERIFY_MODES:
        raise ValueError(f"{VERIFY_ENV} must be one of {'|'.join(VERIFY_MODES)}, got {mode!r}")
    return mode
