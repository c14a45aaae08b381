"""Figures as people read them in a report line: byte counts (40 bytes, 48.0 KiB,
1.2 GiB), shares (76.6%) and durations (57.5 ms, 1.20 s)."""

from __future__ import annotations


def size_text(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"


def percent_text(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def seconds_text(x: float) -> str:
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def plural(n: int, what: str) -> str:
    """``n`` of ``what``, with thousands separated: "1 worker", "1,024 workers"."""
    return f"{n:,} {what}{'' if n == 1 else 's'}"
