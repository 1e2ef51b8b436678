"""The GPU engine's stand-ins (compile_tests/sglang_gpu/stand_in), checked on the CPU against their kernels' semantics.

The GPU machine cannot load sglang-kernel (built for another torch); the engine suite runs SGLang there with a torch
`sgl_kernel`, an import-only `flash_mla` and post-import patches. Each entry is checked on a literal case in a process
of its own (sglang_gpu/standin_checks.py: the stand-in must not shadow the installed package here).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from requires import require

require("sglang", "pip install -e '.[test,sglang]'")

TESTS = Path(__file__).resolve().parent
STAND_IN = TESTS / "sglang_gpu" / "stand_in"


def test_stand_in_entries_match_their_kernels():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STAND_IN), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "sglang_gpu.standin_checks"], cwd=TESTS, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 failed" in run.stdout and "PASS check_merge_state_matches_full_attention" in run.stdout, run.stdout
