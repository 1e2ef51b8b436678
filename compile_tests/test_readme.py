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


def test_support_matrix_matches_the_verified_families_table(ops):
    """The README's matrix says "verified" exactly where the library's table does (the gate answers by it)."""
    text = README.read_text()
    table = text[text.index("<!-- verified-families -->"):text.index("<!-- /verified-families -->")]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| `")]
    header = [cell.strip() for cell in table.splitlines()[1].strip().strip("|").split("|")]
    classes = [h.split(" (")[0] for h in header[2:]]
    families = {(f["family"], f["cache"]): f["verified"] for f in ops.verified_families()}
    cache_names = {"q's dtype": "same", "fp8": "fp8", "fp8 (overlap path)": "fp8 overlap", "—": ""}
    seen = set()
    for family, cache, *cells in rows:
        key = (family.strip("`"), cache_names[cache])
        assert key in families, f"README lists {key}, the library's table does not"
        seen.add(key)
        for name, cell in zip(classes, cells):
            assert (cell == "verified" or cell.startswith("verified (")) == families[key][name], (
                f"README says {cell!r} for {key} on {name}; the table says verified = {families[key][name]}")
    assert seen == set(families), f"the README misses {sorted(set(families) - seen)}"
