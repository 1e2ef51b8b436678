"""The benchmark's arithmetic and reports on the CPU (the timings themselves need a GPU): the floor counts an fp8
cache at a byte an element and divides by the read stream, the Markdown table gains the fp8 column, and the RTX PRO
6000 estimate carries each workload's fraction of its floor to the target's published rates."""

from __future__ import annotations

import torch

from kdtree_ops.bench.estimate import RTX_PRO_6000, estimate_rows, markdown
from kdtree_ops.bench.floor import call_bytes, call_flops, floor_us
from kdtree_ops.bench.report import markdown_table
from kdtree_ops.testing.cases import make_verify_case


def test_floor_counts_fp8_cache_bytes_and_the_read_stream():
    kwargs = dict(tree_sizes=[8, 8], prefix_lens=[100, 50], num_q_heads=4, num_kv_heads=2, head_dim_qk=64,
                  head_dim_v=64, draft_mode="separate")
    bf16 = make_verify_case(dtype=torch.bfloat16, **kwargs)
    fp8 = make_verify_case(dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn, k_scale=0.5, v_scale=0.5, **kwargs)
    prefix_kv = 150 * 2 * (64 + 64)  # prefix rows x heads x (Dqk + Dv): the only part an fp8 cache halves
    assert call_bytes(bf16) - call_bytes(fp8) == prefix_kv  # 2 bytes an element against 1
    assert call_flops(bf16) == call_flops(fp8)
    f = floor_us(fp8, read_bytes_per_s=1e12, matmul_flops_per_s=1e15)
    assert f["memory_us"] == call_bytes(fp8) / 1e12 * 1e6 and f["floor_us"] == max(f["memory_us"], f["compute_us"])


def results(with_fp8=True):
    def part(floor, us, correct=True):
        return {"floor": {"floor_us": floor, "bound": "memory", "bytes": floor * 4e6, "flops": floor * 1e8},
                "impls": {"kdtree": {"median_us": us, "correct": correct},
                          "sglang_triton": {"median_us": 10 * us, "correct": True}}}
    w = {"name": "G2", "shape": "GQA", **part(50.0, 80.0)}
    if with_fp8:
        w["fp8"] = part(30.0, 48.0)
    return {"environment": {"device": "NVIDIA H200", "commit": "abc", "date": "d", "torch": "t"},
            "implementations": ["kdtree", "sglang_triton"], "workloads": [w],
            "ceilings": {"read_bytes_per_s": 4e12, "copy_bytes_per_s": 3e12, "matmul_flops_per_s": 8e14}}


def test_markdown_table_has_the_fp8_column():
    table = markdown_table(results())
    fp8_row = [line for line in table.splitlines() if line.startswith("| G2 | 30.0")]
    assert fp8_row, table
    # kdtree fp8 48.0, Triton fp8 480, 10.0x; bf16 / fp8 = 80 / 48; 30 / 48 of the fp8 floor
    assert "| 48.0 | 480.0 | 10.0 | 1.67 | 62 % |" in fp8_row[0], fp8_row[0]
    assert "fp8 KV cache" not in markdown_table(results(with_fp8=False))


def test_fp8_overlap_path_gets_columns_of_its_own_in_the_fp8_table_only():
    """kdtree_fp8_overlap (the fp8 overlap path, timed beside the default path in the same run) adds its time, kdtree's
    bf16 time over it and its % of the fp8 floor to the fp8 rows; the bf16 table and the plot leave it out."""
    r = results()
    r["implementations"].insert(1, "kdtree_fp8_overlap")
    r["workloads"][0]["fp8"]["impls"]["kdtree_fp8_overlap"] = {"median_us": 40.0, "correct": False}
    table = markdown_table(r)
    bf16_head = table.splitlines()[0]
    assert "kdtree_fp8_overlap" not in bf16_head and bf16_head.count("µs") == 3, bf16_head  # floor, kdtree, triton
    fp8_row = [line for line in table.splitlines() if line.startswith("| G2 | 30.0")][0]
    # the default path as before, then overlap 40.0 (failed its check: ✗), bf16 / overlap = 80 / 40, 30 / 40 of floor
    assert fp8_row.endswith("| 48.0 | 480.0 | 10.0 | 1.67 | 62 % | 40.0 ✗ | 2.00 | 75 % |"), fp8_row
    r["workloads"][0]["fp8"]["impls"]["kdtree_fp8_overlap"] = {"error": "RuntimeError: not yet verified"}
    assert "| 62 % | error | — | — |" in markdown_table(r)


def test_estimate_carries_the_fraction_of_floor():
    rows = estimate_rows(results())
    assert [(r["name"], r["cache"]) for r in rows] == [("G2", "bf16"), ("G2", "fp8")]
    bf16 = rows[0]
    target_floor = max(50.0 * 4e6 / RTX_PRO_6000["bytes_per_s"], 50.0 * 1e8 / RTX_PRO_6000["flops_per_s"]) * 1e6
    assert abs(bf16["target_floor_us"] - target_floor) < 1e-9
    assert abs(bf16["estimate_us"] - target_floor * 80.0 / 50.0) < 1e-9  # 62.5 % of the floor there too
    assert "not a measurement" in markdown(results(), rows)
    wrong = results()
    wrong["workloads"][0]["impls"]["kdtree"]["correct"] = False  # a failed check is not estimated from
    assert [r["cache"] for r in estimate_rows(wrong)] == ["fp8"]
