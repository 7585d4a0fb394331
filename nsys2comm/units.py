"""Units: the one place that knows how many ns a unit holds and how numbers are written for people.

Catalog columns hold integer ns and bytes; these helpers only rescale or format them for display.
Percentages: whole numbers unless asked. Durations: three significant digits in the largest unit that keeps the
value >= 1. Sizes: binary prefixes. Bandwidths: one decimal in GB/s (1e9 bytes per second).
"""

from __future__ import annotations

import math

NS_PER_UNIT = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_TIME_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))
NOT_AVAILABLE = "n/a"
# decimals of a percentage: the summary's lines, and the *_pct columns of the CLI's rows (nsys2comm.output)
PCT_DECIMALS = 1


def ns_to(ns: float | None, unit: str) -> float | None:
    """A time in ns expressed in ``unit`` ('ns', 'us', 'ms', 's'); None stays None."""
    return None if ns is None else ns / NS_PER_UNIT[unit]


def is_num(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)


JSON_DIGITS = 6  # significant digits of every float in a JSON document (summary --json, diff --json)


def round_floats(v, digits: int = JSON_DIGITS):
    """The one rounding rule of every JSON output: floats to ``digits`` significant digits, never coarser than whole
    units (1234567.8 -> 1234568.0); NaN, infinities and 0 as they are; dicts and lists recursively, the rest as is."""
    if isinstance(v, float):
        if not math.isfinite(v) or v == 0:
            return v
        return float(f"{v:.{max(digits, math.floor(math.log10(abs(v))) + 1)}g}")
    if isinstance(v, dict):
        return {k: round_floats(x, digits) for k, x in v.items()}
    if isinstance(v, list):
        return [round_floats(x, digits) for x in v]
    return v


def pct(v: float | None, decimals: int = 0) -> str:
    """'42%' (or '42.3%' with decimals=1); 'n/a' for None."""
    return NOT_AVAILABLE if v is None else f"{v:.{decimals}f}%"


def duration(ns: float | None) -> str:
    """'1.23 ms', '45.6 µs', '789 ns'; 'n/a' for None."""
    if ns is None:
        return NOT_AVAILABLE
    for scale, unit in _TIME_UNITS:
        v = ns / scale
        if abs(round(v, 2)) >= 1 or scale == 1.0:
            return f"{_sig3(v)} {unit}"
    return f"{ns:.0f} ns"


def _sig3(v: float) -> str:
    a = abs(v)
    return f"{v:,.0f}" if a >= 99.95 else f"{v:.1f}" if a >= 9.995 else f"{v:.2f}"


def gbps(v: float) -> str:
    return f"{v:.1f} GB/s"


def size(n: float | int | None) -> str:
    """'512 B', '64 KiB', '1.5 MiB' ... (binary prefixes); 'n/a' for None."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return NOT_AVAILABLE
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
