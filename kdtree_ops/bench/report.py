"""The benchmark's outputs: a Markdown table, a JSON record and a bar plot.

Table columns per workload: floor (µs, and which ceiling binds), each implementation's median µs, kdtree's
speedup over each baseline, and kdtree's % of floor (= floor / time · 100: 100 % would be the roofline). The fp8
table beside it: the same workloads over an e4m3 cache, kdtree by its default path and, where the run timed it, by the
fp8 overlap path (kdtree_fp8_overlap), each against the fp8 floor and against kdtree's bf16 time.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

import torch

__all__ = ["environment", "markdown_table", "write_report"]


def _commit() -> str:
    if os.environ.get("KDTREE_OPS_COMMIT"):
        return os.environ["KDTREE_OPS_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment() -> dict:
    """Device, software versions, commit and date of this run."""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(device=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   l2_bytes=props.L2_cache_size)
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        pass
    try:
        from importlib.metadata import version

        env["sglang"] = version("sglang")
    except Exception:
        pass
    return env


def _fmt_us(x) -> str:
    if x is None:
        return "—"
    return f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def _bf16_impls(results: dict) -> list[str]:
    """The implementations of the main (bf16) table: all but those of an fp8 cache alone."""
    from .baselines import FP8_ONLY

    return [i for i in results["implementations"] if i not in FP8_ONLY]


def markdown_table(results: dict) -> str:
    impls = _bf16_impls(results)
    baselines = [i for i in impls if i != "kdtree"]
    head = ["workload", "shape", "floor µs", *[f"{i} µs" for i in impls],
            *[f"× vs {b}" for b in baselines], "% of floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in results["workloads"]:
        times = {i: (w["impls"].get(i) or {}).get("median_us") for i in impls}
        flags = {i: "" if (w["impls"].get(i) or {}).get("correct", True) else " ✗" for i in impls}
        row = [w["name"], w["shape"], f"{_fmt_us(w['floor']['floor_us'])} ({w['floor']['bound'][:3]})"]
        row += ["error" if "error" in (w["impls"].get(i) or {}) else _fmt_us(times[i]) + flags[i] for i in impls]
        k = times.get("kdtree")
        row += [f"{times[b] / k:.1f}" if k and times[b] else "—" for b in baselines]
        row.append(f"{100 * w['floor']['floor_us'] / k:.0f} %" if k else "—")
        lines.append("| " + " | ".join(row) + " |")
    fp8_rows = [w for w in results["workloads"] if "fp8" in w]
    if fp8_rows:
        # The fp8 overlap path's columns where the run timed it (kdtree_fp8_overlap: the A/B against kdtree's default).
        overlap = "kdtree_fp8_overlap" in results["implementations"]
        head = ["workload", "fp8 floor µs", "kdtree fp8 µs", "sglang_triton fp8 µs", "× vs sglang_triton fp8",
                "kdtree bf16 / fp8", "% of fp8 floor"]
        if overlap:
            head += ["kdtree fp8 overlap µs", "kdtree bf16 / overlap", "% of fp8 floor (overlap)"]
        lines += ["", "fp8 KV cache (e4m3, one scale for K and V; the floor counts a byte per cached element):", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for w in fp8_rows:
            f8 = w["fp8"]
            t8 = {i: (f8["impls"].get(i) or {}).get("median_us") for i in ("kdtree", "sglang_triton",
                                                                             "kdtree_fp8_overlap")}
            ok = {i: "" if (f8["impls"].get(i) or {}).get("correct", True) else " ✗" for i in t8}
            k8, k16 = t8["kdtree"], (w["impls"].get("kdtree") or {}).get("median_us")
            floor8 = f8["floor"]["floor_us"]
            row = [w["name"], f"{_fmt_us(floor8)} ({f8['floor']['bound'][:3]})",
                   _fmt_us(k8) + ok["kdtree"], _fmt_us(t8["sglang_triton"]) + ok["sglang_triton"],
                   f"{t8['sglang_triton'] / k8:.1f}" if k8 and t8["sglang_triton"] else "—",
                   f"{k16 / k8:.2f}" if k8 and k16 else "—",
                   f"{100 * floor8 / k8:.0f} %" if k8 else "—"]
            if overlap:
                ko = t8["kdtree_fp8_overlap"]
                error = "error" in (f8["impls"].get("kdtree_fp8_overlap") or {})
                row += ["error" if error else _fmt_us(ko) + ok["kdtree_fp8_overlap"],
                        f"{k16 / ko:.2f}" if ko and k16 else "—", f"{100 * floor8 / ko:.0f} %" if ko else "—"]
            lines.append("| " + " | ".join(row) + " |")
    env, ceil = results["environment"], results["ceilings"]
    lines += [
        "",
        f"{env.get('device', '?')}, torch {env['torch']}, commit {env['commit'][:12]}, {env['date']}. "
        f"Ceilings measured in this run: read {ceil['read_bytes_per_s'] / 1e12:.2f} TB/s (what the floor divides bytes "
        f"by), copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write), "
        f"bf16 matmul {ceil['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s. Times: median µs of CUDA-graph replays; "
        "✗ = failed the correctness check against the float64 reference.",
    ]
    return "\n".join(lines) + "\n"


def _plot(results: dict, path: Path) -> str:
    """Bar plot, log-scale µs per workload per implementation (+ floor); returns what drew it."""
    names = [w["name"] for w in results["workloads"]]
    series = {"floor": [w["floor"]["floor_us"] for w in results["workloads"]]}
    for impl in _bf16_impls(results):
        series[impl] = [(w["impls"].get(impl) or {}).get("median_us") for w in results["workloads"]]
    env = results["environment"]
    title = f"tree verify attention, bf16: {env.get('device', '?')}, commit {env['commit'][:10]}"
    ylabel = "us per call (median of CUDA-graph replays)"
    import matplotlib  # write_report records its absence as a note: the table and JSON do not need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names) + 2), 4.5))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, [v if v else float("nan") for v in values], width, label=label)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return "matplotlib"


def write_report(results: dict, out_dir: str | os.PathLike) -> dict:
    """Writes bench.md, bench.json and bench.png into out_dir; returns {name: path} of what was written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    (out / "bench.md").write_text(markdown_table(results))
    written["markdown"] = str(out / "bench.md")
    try:
        results["plot_renderer"] = _plot(results, out / "bench.png")
        written["plot"] = str(out / "bench.png")
    except Exception as e:  # a plot must not cost the table and the JSON
        results.setdefault("notes", []).append(f"no plot: {type(e).__name__}: {e}")
    (out / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
    written["json"] = str(out / "bench.json")
    return written
