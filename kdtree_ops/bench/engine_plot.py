"""The engine bench's chart: each configuration's tokens/s over no speculation's, grouped by batch size, as SVG.

    python -m kdtree_ops.bench.engine_plot DIR/engine_bench.json [OUT.svg [TITLE]]

`python -m kdtree_ops bench --engine` writes DIR/engine_bench.svg beside its table after every configuration; this
command redraws it from a committed engine_bench.json. Plain SVG, no plotting library: the bench runs where only
torch and SGLang are installed. The baseline is the `none` row where the records have one (a dashed line at 1.0),
else the first configuration's; profiled and failed runs are left out, as in the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from xml.sax.saxutils import escape

COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
          "#bab0ac")
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 760, 380, 60, 220, 40, 50


def load_records(path) -> list[dict]:
    """engine_bench.json's records (a JSON object a line)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def relative_rates(records: list[dict]) -> tuple[str, list[int], dict[str, dict[int, float]]]:
    """(baseline name, batch sizes, {configuration: {batch size: tokens/s over the baseline's}}), ok unprofiled runs
    only, batch sizes the baseline measured."""
    runs = [r for r in records if r.get("ok") and not r.get("profiled")]
    if not runs:
        return "", [], {}
    base = next((r for r in runs if r["config"] == "none"), runs[0])
    base_rate = {row["batch"]: row["tokens_per_s"] for row in base["rows"]}
    sizes = sorted(base_rate)
    ratios = {r["config"]: {row["batch"]: row["tokens_per_s"] / base_rate[row["batch"]]
                            for row in r["rows"] if row["batch"] in base_rate} for r in runs}
    return base["config"], sizes, ratios


def svg_chart(records: list[dict], title: str) -> str:
    """The chart of `records` (module docstring) as an SVG document."""
    base, sizes, ratios = relative_rates(records)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = max([1.0] + [v for by in ratios.values() for v in by.values()]) * 1.1
    y = lambda v: TOP + plot_h * (1 - v / top)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
           f'font-size="12">', f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14">{escape(title)}</text>']
    step = 0.5 if top <= 4 else 1.0
    tick = 0.0
    while tick <= top:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:g}×</text>')
        tick += step
    out.append(f'<text x="14" y="{TOP + plot_h / 2:.0f}" transform="rotate(-90 14 {TOP + plot_h / 2:.0f})" '
               f'text-anchor="middle">tokens/s over {escape(base)}</text>')
    names = list(ratios)
    group_w = plot_w / max(len(sizes), 1)
    bar_w = group_w * 0.8 / max(len(names), 1)
    for g, size in enumerate(sizes):
        x0 = LEFT + g * group_w + group_w * 0.1
        for i, name in enumerate(names):
            value = ratios[name].get(size)
            if value is None:
                continue
            out.append(f'<rect class="bar" data-config="{escape(name)}" data-batch="{size}" data-ratio="{value:.4f}" '
                       f'x="{x0 + i * bar_w:.1f}" y="{y(value):.1f}" width="{bar_w * 0.9:.1f}" '
                       f'height="{y(0) - y(value):.1f}" fill="{COLORS[i % len(COLORS)]}"/>')
        out.append(f'<text x="{x0 + group_w * 0.4:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">B={size}</text>')
    out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="black" '
               f'stroke-dasharray="4 3"/>')
    for i, name in enumerate(names):
        ly = TOP + 10 + 18 * i
        out.append(f'<rect x="{WIDTH - RIGHT + 16}" y="{ly - 9}" width="12" height="12" '
                   f'fill="{COLORS[i % len(COLORS)]}"/>')
        out.append(f'<text x="{WIDTH - RIGHT + 34}" y="{ly + 1}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    source = Path(argv[0])
    target = Path(argv[1]) if len(argv) == 2 else source.with_suffix(".svg")
    title = argv[2] if len(argv) == 3 else f"End to end, {source.parent.name}"
    target.write_text(svg_chart(load_records(source), title))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
