"""The GPU suite's summary (examples/gpu_summary.py) on the CPU: a stage its time limit stopped must not read as
complete. The junit file lists only the tests that ran, so the count of those selected comes from pytest's log."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).parents[1] / "examples" / "gpu_summary.py"
_spec = importlib.util.spec_from_file_location("gpu_summary", _PATH)
gpu_summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_summary)


def _junit(path: Path, passed: int, failed: int) -> Path:
    cases = "".join(f'<testcase classname="t" name="ok{i}"/>' for i in range(passed))
    cases += "".join(f'<testcase classname="t" name="bad{i}"><failure message="x"/></testcase>' for i in range(failed))
    path.write_text(f'<testsuites><testsuite tests="{passed + failed}" failures="{failed}" errors="0" skipped="0">'
                    f"{cases}</testsuite></testsuites>")
    return path


def test_a_stopped_stage_names_the_tests_that_did_not_run(tmp_path):
    xml = _junit(tmp_path / "r.xml", passed=3, failed=1)
    log = tmp_path / "tests.log"
    log.write_text("collecting ... collected 12 items / 5 deselected / 7 selected\n...\n!!! KeyboardInterrupt !!!\n")
    text = gpu_summary.junit_summary(xml, log)
    assert text.startswith("4 ran: **3 passed**, 1 failed")
    assert "**3 of the 7 selected did not run**" in text
    assert "`t::bad0`" in text


def test_a_finished_stage_reads_as_finished(tmp_path):
    xml = _junit(tmp_path / "r.xml", passed=4, failed=0)
    for line in ("collected 4 items", "collected 9 items / 5 deselected / 4 selected",
                 "collected 9 items / 5 deselected"):
        log = tmp_path / "tests.log"
        log.write_text(line + "\n")
        assert gpu_summary.selected_count(log) == 4, line
        assert gpu_summary.junit_summary(xml, log) == "4 ran: **4 passed**, 0 failed, 0 errors, 0 skipped"
    assert gpu_summary.selected_count(tmp_path / "missing.log") is None


def test_the_fp8_overlap_stages_have_lines_of_their_own(tmp_path):
    """The native part's fp8 overlap stages (tests, memcheck, racecheck) are summarized apart from the others."""
    native = tmp_path / "native"
    native.mkdir()
    _junit(native / "pytest_cuda_fp8_overlap.xml", passed=83, failed=4)
    (native / "fp8_overlap.log").write_text("collected 543 items / 456 deselected / 87 selected\n")
    (native / "memcheck_fp8_overlap.log").write_text("sanitize_case: all ok\n========= ERROR SUMMARY: 0 errors\n")
    gpu_summary.main(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    section = text[text.index("## The fp8 overlap path"):]
    assert "87 ran: **83 passed**, 4 failed" in section
    assert ("- memcheck (sanitize_case.py --fp8-overlap): sanitize_case: all ok; ========= ERROR SUMMARY: 0 errors"
            in section)
    assert "- racecheck (sanitize_case.py --fp8-overlap): no summary line (see its log)" in section
