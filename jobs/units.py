"""Parsing and printing of the quantities users type: memory sizes and durations."""

from __future__ import annotations

import re

from gpuq_scheduler.jobs.errors import BadInput

_SIZE_UNITS = {
    "K": 1 << 10, "KI": 1 << 10, "KIB": 1 << 10, "KB": 10**3,
    "M": 1 << 20, "MI": 1 << 20, "MIB": 1 << 20, "MB": 10**6,
    "G": 1 << 30, "GI": 1 << 30, "GIB": 1 << 30, "GB": 10**9,
    "T": 1 << 40, "TI": 1 << 40, "TIB": 1 << 40, "TB": 10**12,
}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")


def parse_size(text: str) -> int:
    """``20G``, ``20GiB``, ``512M``, ``1.5T`` -> bytes. G/GiB are binary (as nvidia-smi counts); GB is decimal.

    A bare number is refused: ``--mem 20`` could mean bytes, MiB or GiB, and a wrong guess wastes a night.
    """
    match = _SIZE_RE.match(text)
    if not match:
        raise BadInput(f"cannot read size {text!r}: write a number and a unit, like 20G, 20GiB or 512M")
    number, unit = float(match.group(1)), match.group(2).upper()
    if unit not in _SIZE_UNITS:
        raise BadInput(f"unknown size unit {match.group(2)!r} in {text!r}: use K, M, G or T (binary) or KB, MB, GB, TB")
    size = int(number * _SIZE_UNITS[unit])
    if size <= 0:
        raise BadInput(f"size {text!r} must be more than zero")
    return size


def format_size(size: int | None) -> str:
    """Bytes -> a short binary size (``20.0G``); ``-`` for None."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "K", "M", "G"):
        if abs(value) < 1024:
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}T"


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_DURATION_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``2h``, ``1h30m``, ``1d``, ``HH:MM:SS``, ``MM:SS`` -> seconds.

    A bare number is refused for the same reason as sizes (Slurm reads minutes, timeout(1) seconds).
    """
    cleaned = text.strip().lower()
    seconds: float
    if re.fullmatch(r"\d+(:\d{1,2}){1,2}", cleaned):
        parts = [int(p) for p in cleaned.split(":")]
        seconds = 0
        for part in parts:
            seconds = seconds * 60 + part
    elif cleaned and _DURATION_PART.sub("", cleaned) == "":
        seconds = sum(float(n) * _DURATION_SECONDS[u] for n, u in _DURATION_PART.findall(cleaned))
    else:
        raise BadInput(f"cannot read duration {text!r}: write it like 90s, 30m, 2h, 1h30m, 1d or 01:30:00")
    if seconds <= 0:
        raise BadInput(f"duration {text!r} must be more than zero")
    return seconds


def format_duration(seconds: float | None) -> str:
    """Seconds -> ``1h02m``, ``3m05s``, ``12.3s``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"
