"""examples/ncu_profile.py's reading of Nsight Compute's raw CSV page on the CPU (the profile itself runs on the GPU,
in the GPU suite's bench part): the units row skipped, a row per kernel, the columns and the largest stalls."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).parents[1] / "examples" / "ncu_profile.py"
_spec = importlib.util.spec_from_file_location("ncu_profile", _PATH)
ncu_profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_profile)

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def test_a_raw_page_becomes_a_row_of_the_table(tmp_path):
    names = ["ID", "Kernel Name", "gpu__time_duration.sum", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
             "sm__throughput.avg.pct_of_peak_sustained_elapsed", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
             "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", STALL.format("barrier"),
             STALL.format("long_scoreboard"), STALL.format("math_pipe_throttle"), STALL.format("wait"),
             STALL.format("short_scoreboard")]
    units = ["", "", "ns", "%", "%", "", "", "inst", "inst", "inst", "inst", "inst"]
    row = ["0", "tree_verify_attention_kernel<...>", "81,500", "55.1", "40.2", "1,234,567", "890", "0.5", "3.25",
           "0.75", "1.5", "2"]
    text = "==PROF== Connected to process\n" + "\n".join(",".join(f'"{c}"' for c in r) for r in (names, units, row))
    path = tmp_path / "G2-fp8-widen.csv"
    path.write_text(text)
    (kernel,) = ncu_profile.read_raw(path)
    cells = ncu_profile.summarize(kernel, stalls=3)
    assert cells["duration µs"] == 81.5 and cells["DRAM %"] == 55.1 and cells["smem wavefronts"] == 1234567
    assert cells["stalls"] == "long_scoreboard 3.25, short_scoreboard 2.00, wait 1.50"
    table = ncu_profile.markdown({("G2", "fp8-widen"): cells, ("M5", "fp8-overlap"): "no profile in 180 s"})
    assert "| G2 | fp8-widen | 81.5 | 55.1 | 40.2 | 1,234,567 | 890 | long_scoreboard 3.25" in table
    assert "| M5 | fp8-overlap | no profile in 180 s |" in table


def test_a_page_without_kernels_reads_as_none(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("==ERROR== Failed to profile\n")
    assert ncu_profile.read_raw(path) == []


def test_the_older_dram_metric_and_a_duration_in_microseconds_are_read_too(tmp_path):
    """ncu versions name DRAM throughput differently; a duration in usecond is taken as it is."""
    names = ["ID", "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed"]
    text = "\n".join(",".join(f'"{c}"' for c in r) for r in (names, ["", "usecond", "%"], ["3", "12.5", "61.0"]))
    path = tmp_path / "M5-bf16.csv"
    path.write_text(text)
    cells = ncu_profile.summarize(ncu_profile.read_raw(path)[-1])
    assert cells["duration µs"] == 12.5 and cells["DRAM %"] == 61.0
    results = ncu_profile.summarize_dir(tmp_path, ["M5"])
    assert results[("M5", "bf16")]["DRAM %"] == 61.0 and results[("M5", "fp8-widen")] == "no kernel in M5-fp8-widen.csv"
