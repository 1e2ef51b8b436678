"""A log-scale grouped bar chart written as PNG with the standard library only.

The GPU test machine has no matplotlib and reaches no package registry; report.py uses matplotlib when it
imports and this otherwise, so every run commits a plot. Text is drawn with a built-in 5x7 font
(upper case, digits and a few signs).
"""

from __future__ import annotations

import math
import struct
import zlib

__all__ = ["bar_chart_png"]

_FONT = {  # 5x7 glyphs, rows top to bottom
    "0": "01110 10001 10011 10101 11001 10001 01110", "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111", "3": "11111 00010 00100 00010 00001 10001 01110",
    "4": "00010 00110 01010 10010 11111 00010 00010", "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110", "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110", "9": "01110 10001 10001 01111 00001 00010 01100",
    "A": "01110 10001 10001 11111 10001 10001 10001", "B": "11110 10001 10001 11110 10001 10001 11110",
    "C": "01110 10001 10000 10000 10000 10001 01110", "D": "11100 10010 10001 10001 10001 10010 11100",
    "E": "11111 10000 10000 11110 10000 10000 11111", "F": "11111 10000 10000 11110 10000 10000 10000",
    "G": "01110 10001 10000 10111 10001 10001 01111", "H": "10001 10001 10001 11111 10001 10001 10001",
    "I": "01110 00100 00100 00100 00100 00100 01110", "J": "00111 00010 00010 00010 00010 10010 01100",
    "K": "10001 10010 10100 11000 10100 10010 10001", "L": "10000 10000 10000 10000 10000 10000 11111",
    "M": "10001 11011 10101 10101 10001 10001 10001", "N": "10001 10001 11001 10101 10011 10001 10001",
    "O": "01110 10001 10001 10001 10001 10001 01110", "P": "11110 10001 10001 11110 10000 10000 10000",
    "Q": "01110 10001 10001 10001 10101 10010 01101", "R": "11110 10001 10001 11110 10100 10010 10001",
    "S": "01111 10000 10000 01110 00001 00001 11110", "T": "11111 00100 00100 00100 00100 00100 00100",
    "U": "10001 10001 10001 10001 10001 10001 01110", "V": "10001 10001 10001 10001 10001 01010 00100",
    "W": "10001 10001 10001 10101 10101 10101 01010", "X": "10001 10001 01010 00100 01010 10001 10001",
    "Y": "10001 10001 10001 01010 00100 00100 00100", "Z": "11111 00001 00010 00100 01000 10000 11111",
    " ": "00000 00000 00000 00000 00000 00000 00000", ".": "00000 00000 00000 00000 00000 01100 01100",
    "_": "00000 00000 00000 00000 00000 00000 11111", "-": "00000 00000 00000 11111 00000 00000 00000",
    "/": "00001 00010 00010 00100 01000 01000 10000", "%": "11000 11001 00010 00100 01000 10011 00011",
    "(": "00010 00100 01000 01000 01000 00100 00010", ")": "01000 00100 00010 00010 00010 00100 01000",
    ":": "00000 01100 01100 00000 01100 01100 00000", ",": "00000 00000 00000 00000 01100 00100 01000",
    "=": "00000 00000 11111 00000 11111 00000 00000", "+": "00000 00100 00100 11111 00100 00100 00000",
}
_COLORS = [(120, 120, 120), (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189)]


class _Canvas:
    def __init__(self, width: int, height: int):
        self.w, self.h = width, height
        self.px = bytearray(b"\xff" * (3 * width * height))

    def rect(self, x0, y0, x1, y1, color):
        x0, x1 = max(0, int(min(x0, x1))), min(self.w, int(max(x0, x1)))
        y0, y1 = max(0, int(min(y0, y1))), min(self.h, int(max(y0, y1)))
        row = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            start = 3 * (y * self.w + x0)
            self.px[start : start + len(row)] = row

    def text(self, x, y, s, color=(0, 0, 0), scale=2):
        for ch in s.upper():
            rows = _FONT.get(ch, _FONT[" "]).split()
            for r, bits in enumerate(rows):
                for c, bit in enumerate(bits):
                    if bit == "1":
                        self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale, y + (r + 1) * scale, color)
            x += 6 * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[3 * y * self.w : 3 * (y + 1) * self.w]) for y in range(self.h))

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def text_width(s: str, scale: int = 2) -> int:
    return 6 * scale * len(s)


def bar_chart_png(groups: list[str], series: dict[str, list[float | None]], title: str, ylabel: str) -> bytes:
    """PNG bytes: one group of bars per entry of `groups`, one bar per series, log-scale y."""
    values = [v for vs in series.values() for v in vs if v and v > 0]
    lo = 10 ** math.floor(math.log10(min(values))) if values else 1.0
    hi = 10 ** math.ceil(math.log10(max(values))) if values else 10.0
    hi = max(hi, lo * 10)
    group_w, bar_w = 24 + 16 * len(series), 16
    left, right, top, bottom = 90, 20, 70 + 20 * ((len(series) + 2) // 3), 50
    width = max(left + right + group_w * len(groups), 640)
    height = top + 360 + bottom
    cv = _Canvas(width, height)
    plot_h = height - top - bottom

    def y_of(v):
        return top + plot_h * (1 - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)))

    cv.text(left, 10, title)
    for i, name in enumerate(series):  # legend, three per line
        x, y = left + 260 * (i % 3), 36 + 20 * (i // 3)
        cv.rect(x, y, x + 14, y + 14, _COLORS[i % len(_COLORS)])
        cv.text(x + 20, y + 1, name)
    decade = lo
    while decade <= hi * 1.0001:  # grid lines and labels at decades
        y = y_of(decade)
        cv.rect(left, y, width - right, y + 1, (210, 210, 210))
        label = f"{decade:g}"
        cv.text(left - 8 - text_width(label), y - 7, label)
        decade *= 10
    cv.text(4, top - 22, ylabel)
    cv.rect(left, top, left + 1, top + plot_h, (0, 0, 0))
    cv.rect(left, top + plot_h, width - right, top + plot_h + 1, (0, 0, 0))
    for g, name in enumerate(groups):
        x0 = left + g * group_w + 12
        for s, vs in enumerate(series.values()):
            v = vs[g]
            if v and v > 0:
                cv.rect(x0 + s * bar_w, y_of(v), x0 + (s + 1) * bar_w - 2, top + plot_h, _COLORS[s % len(_COLORS)])
        cv.text(x0 + (group_w - 24 - text_width(name)) // 2, top + plot_h + 10, name)
    return cv.png()
