"""The README's Python example runs as written, and prints an error against the float64 reference that fp32 allows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def example_block() -> str:
    text = README.read_text()
    section = text[text.index("## Example"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_runs_as_written(ops):
    run = subprocess.run([sys.executable, "-c", example_block()], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    error = float(re.search(r"max \|out - float64 reference\| = (\S+)", run.stdout).group(1))
    assert 0 <= error < 1e-5, run.stdout
