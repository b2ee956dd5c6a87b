"""How gpuprof prints durations and sizes: one definition each, used by the
tables, the diagnosis, the memory summary and the reports."""

from __future__ import annotations

__all__ = ["TIME_UNITS", "format_bytes", "format_time"]

TIME_UNITS = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}


def format_time(ns: float, unit: str | None = None) -> str:
    """Nanoseconds as torch.profiler prints durations: us, ms or s with 3 decimals
    (the largest unit that keeps the figure >= 1, or ``unit``: s, ms, us, ns)."""
    if unit is not None:
        return f"{ns / TIME_UNITS[unit]:.3f}{unit}"
    us = ns / 1e3
    if abs(us) >= 1e6:
        return f"{us / 1e6:.3f}s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def format_bytes(n: float, style: str = "torch") -> str:
    """Bytes for people.

    ``style="torch"``: as torch.profiler's memory columns print them (Gb, Mb, Kb or b,
    two decimals), for the op tables. ``style="binary"``: 512 B, 1.5 KiB, 256.0 MiB,
    1.25 GiB (sign kept), for the memory summary and the diagnosis.
    """
    if style == "torch":
        for unit, scale in (("Gb", 1 << 30), ("Mb", 1 << 20), ("Kb", 1 << 10)):
            if abs(n) >= scale:
                return f"{n / scale:.2f} {unit}"
        return f"{int(n)} b"
    if style != "binary":
        raise ValueError(f"format_bytes(): style must be 'torch' or 'binary', got {style!r}")
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            break
        n /= 1024
    if unit == "B":
        return f"{sign}{int(n)} B"
    return f"{sign}{n:.2f} {unit}" if unit == "GiB" else f"{sign}{n:.1f} {unit}"
