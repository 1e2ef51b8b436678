"""RESULTS_DIR/summary.md from every part of the GPU suite present there (examples/gpu_suite.sh runs it last).

    python examples/gpu_summary.py RESULTS_DIR
"""

from __future__ import annotations

import csv
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def selected_count(log: Path) -> int | None:
    """How many tests pytest selected, from its log's "collected N items / D deselected / S selected" line."""
    text = log.read_text(errors="replace") if log.exists() else ""
    m = re.search(r"collected (\d+) items?(?: / (\d+) deselected)?(?: / (\d+) selected)?", text)
    if not m:
        return None
    collected, deselected, selected = (int(g) if g else None for g in m.groups())
    return selected if selected is not None else collected - (deselected or 0)


def junit_summary(xml: Path, log: Path | None = None) -> str:
    """What ran and how it ended; a stage stopped by its time limit names how many of the selected tests ran (the
    junit file lists only those)."""
    if not xml.exists():
        return "no junit XML (pytest did not run or did not finish)"
    try:
        root = ET.parse(xml).getroot()
    except ET.ParseError as e:
        return f"junit XML unreadable: {e}"
    suites = [root] if root.tag == "testsuite" else list(root)
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    text = (f"{n['tests']} ran: **{passed} passed**, {n['failures']} failed, {n['errors']} errors, "
            f"{n['skipped']} skipped")
    selected = selected_count(log) if log is not None else None
    if selected is not None and selected > n["tests"]:
        text += f"; **{selected - n['tests']} of the {selected} selected did not run** (the stage ended first)"
    bad = [f"{c.get('classname')}::{c.get('name')}" for s in suites for c in s.iter("testcase")
           if c.find("failure") is not None or c.find("error") is not None]
    if bad:
        text += "\n\nFailed:\n" + "\n".join(f"- `{b}`" for b in bad[:40]) + (
            f"\n- ... and {len(bad) - 40} more" if len(bad) > 40 else "")
    return text


def sanitizer_summary(log: Path) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [l.strip() for l in text.splitlines() if "ERROR SUMMARY" in l or "RACECHECK SUMMARY" in l
             or l.startswith("sanitize_case:") or "not found" in l]
    return "; ".join(lines) if lines else "no summary line (see its log)"


FIRST_CALLS = (("jit_first_call", "JIT, empty cache (compiles)"), ("jit_cached_first_call", "JIT, build cached"),
               ("wheel_first_call", "binary wheel in a fresh venv"))


def wheel_summary(wheel: Path) -> list[str]:
    """The wheel part: the wheel written, each run's time from `import kdtree_ops.ops` to the first op call's result
    (examples/first_call.py's `first_call {json}` line) and the numerics the installed wheel served."""
    import json

    lines = [f"- `{w.name}` ({w.stat().st_size / 2**20:.1f} MiB)" for w in sorted((wheel / "dist").glob("*.whl"))]
    lines += ["", "| run | import → first op call (s) | library | builds in its cache after | max abs error |",
              "|---|---|---|---|---|"]
    for stage, name in FIRST_CALLS:
        log = wheel / f"{stage}.log"
        found = re.findall(r"^first_call (\{.*\})$", log.read_text(errors="replace"), re.M) if log.exists() else []
        if not found:
            lines.append(f"| {name} | no result (see wheel/{stage}.log) | | | |")
            continue
        r = json.loads(found[0])
        library = "wheel's prebuilt" if r["prebuilt"] else "JIT cache"
        lines.append(f"| {name} | {r['seconds']} | {library} (CUDA sm_{', sm_'.join(r['archs']) or 'none'}) | "
                     f"{len(r['cache_builds'])} | {r['max_abs_error']:.2e} |")
    return lines + ["", "The installed wheel's CUDA numerics (`pytest test_cuda_numerics.py test_cuda_fp8.py "
                    "test_cuda_graphs.py test_cuda_ddtree.py -m cuda` from the venv, then the cache checked empty): "
                    + junit_summary(wheel / "pytest_cuda.xml", wheel / "numerics.log"), ""]


def main(out: Path) -> None:
    lines = ["# GPU suite results", ""]
    for env in sorted(out.glob("environment-*.txt")):
        lines += ["```", env.read_text().strip(), "```", ""]
    lines += ["| part | stage | status | exit | seconds |", "|---|---|---|---|---|"]
    if (out / "stages.tsv").exists():
        for row in csv.DictReader((out / "stages.tsv").open(), delimiter="\t"):
            lines.append(f"| {row['part']} | {row['stage']} | {row['status']} | {row['exit']} | {row['seconds']} |")
    lines.append("")
    native, emulated, bench = out / "native", out / "emulated", out / "bench"
    if native.exists():
        lines += ["## GPU tests (native, sm_90a)", "",
                  "`pytest compile_tests -m cuda -k 'not test_bad_input'`: "
                  + junit_summary(native / "pytest_cuda.xml", native / "tests.log"),
                  "", "`pytest compile_tests -m cuda -k test_bad_input` (each case in its own process): "
                  + junit_summary(native / "pytest_cuda_errors.xml", native / "errors.log"), "",
                  "`pytest compile_tests/test_sglang_backend_gpu.py -m 'not cuda'`: "
                  + junit_summary(native / "pytest_sglang_gpu.xml", native / "sglang_gpu.log"), "",
                  "## compute-sanitizer (examples/sanitize_case.py)", ""]
        lines += [f"- {tool}: {sanitizer_summary(native / f'{tool}.log')}" for tool in ("memcheck", "racecheck")]
        lines += ["", "## The fp8 overlap path (KDTREE_OPS_FP8_PATH=overlap)", "",
                  "`pytest test_cuda_fp8.py test_cuda_errors.py -m cuda -k fp8_overlap`: "
                  + junit_summary(native / "pytest_cuda_fp8_overlap.xml", native / "fp8_overlap.log"), ""]
        lines += [f"- {tool} (sanitize_case.py --fp8-overlap): {sanitizer_summary(native / f'{tool}_fp8_overlap.log')}"
                  for tool in ("memcheck", "racecheck")]
        lines.append("")
    if emulated.exists():
        lines += ["## GPU tests under emulated architecture classes (KDTREE_OPS_EMULATE_ARCH, on this sm_90 GPU)", ""]
        for arch, name in (("80", "sm_80"), ("120", "99 KB class (sm_86, sm_89, sm_120/121)")):
            lines.append(f"- {name}: `pytest compile_tests -m cuda -k 'not test_bad_input'`: "
                         + junit_summary(emulated / f"pytest_cuda_sm{arch}.xml", emulated / f"tests_sm{arch}.log"))
        lines.append("")
    if bench.exists():
        lines += ["## Benchmark (`python -m kdtree_ops.bench`)", ""]
        table = bench / "bench" / "bench.md"
        lines.append(table.read_text() if table.exists() else "no benchmark table (see bench/bench.log)")
        for arch, name in (("80", "sm_80"), ("120", "the 99 KB class")):
            emulated_table = bench / f"sm{arch}" / "bench.md"
            if emulated_table.exists():
                lines += ["", f"### kdtree under {name}'s emulation (this H200; for judging the design, not {name}'s GPU)",
                          "", emulated_table.read_text()]
        estimate = bench / "sm120" / "estimate.md"
        if estimate.exists():
            lines += ["", estimate.read_text()]
        ddtree = bench / "bench" / "ddtree.md"
        if ddtree.exists():
            lines += ["", "## DDTree ops (`python -m kdtree_ops.bench --ddtree`)", "", ddtree.read_text()]
        probe = bench / "gather_probe.log"
        if probe.exists():
            lines += ["", "## Gather probe (`examples/gather_probe.cu`)", "", "```", probe.read_text().strip(), "```"]
    engine = out / "engine" / "summary.md"
    if engine.exists():
        lines += ["", "## SGLang engines, CUDA graphs on (compile_tests/sglang_gpu/engine_suite.py)", "",
                  engine.read_text()]
    for table in sorted((out / "enginebench").glob("*/engine_bench.md")):
        lines += ["", f"## End to end (`python -m kdtree_ops bench --engine`), {table.parent.name}", "",
                  table.read_text()]
    if (out / "wheel").exists():
        lines += ["", "## Binary wheel (`python -m kdtree_ops build --wheel`, built and installed on this machine)", ""]
        lines += wheel_summary(out / "wheel")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
