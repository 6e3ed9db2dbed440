"""Parsing and printing of the quantities users type: memory sizes and durations."""

from __future__ import annotations

from gpuq_scheduler.jobs.errors import BadInput

# No regular expressions here: `re` (with the enum it loads) is a heavy import for the quick path, and
# `gpuq submit --mem 10G --time 2h` parses both. str.isdecimal() is what \d matches in a str pattern.
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

_SIZE_UNITS = {
    "K": 1 << 10,
    "KI": 1 << 10,
    "KIB": 1 << 10,
    "KB": 10**3,
    "M": 1 << 20,
    "MI": 1 << 20,
    "MIB": 1 << 20,
    "MB": 10**6,
    "G": 1 << 30,
    "GI": 1 << 30,
    "GIB": 1 << 30,
    "GB": 10**9,
    "T": 1 << 40,
    "TI": 1 << 40,
    "TIB": 1 << 40,
    "TB": 10**12,
}


def parse_size(text: str) -> int:
    """``20G``, ``20GiB``, ``512M``, ``1.5T`` -> bytes. G/GiB are binary (as nvidia-smi counts); GB is decimal.

    A bare number is refused: ``--mem 20`` could mean bytes, MiB or GiB, and a wrong guess wastes a night.
    """
    body = text.strip()
    split = len(body.rstrip(_LETTERS))
    digits, letters = body[:split].rstrip(), body[split:]
    if not letters or not _is_number(digits):
        raise BadInput(f"cannot read size {text!r}: write a number and a unit, like 20G, 20GiB or 512M")
    unit = letters.upper()
    if unit not in _SIZE_UNITS:
        raise BadInput(f"unknown size unit {letters!r} in {text!r}: use K, M, G or T (binary) or KB, MB, GB, TB")
    value = float(digits) * _SIZE_UNITS[unit]
    if not value < 1 << 62:  # infinite for 400 digits: int() of it would raise OverflowError
        raise BadInput(f"size {text[:40]!r} is more than any GPU holds; give it in G or T, like 20G")
    size = int(value)
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


def format_energy(joules: float | None) -> str:
    """Joules -> ``850 J``, ``12.3 kJ`` or ``1.25 kWh``; ``-`` for None."""
    if joules is None:
        return "-"
    if joules < 1000:
        return f"{joules:.0f} J"
    if joules < 3.6e6:
        return f"{joules / 1000:.1f} kJ"
    return f"{joules / 3.6e6:.2f} kWh"


def format_gpu_hours(hours: float | None) -> str:
    """GPU-hours with the digits a short job needs (``0.0042``) and a long one does not (``12.5``)."""
    if hours is None:
        return "-"
    return f"{hours:.1f}" if hours >= 10 else f"{hours:.2f}" if hours >= 0.1 else f"{hours:.4f}"


_DURATION_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``2h``, ``1h30m``, ``1d``, ``HH:MM:SS``, ``MM:SS`` -> seconds.

    A bare number is refused for the same reason as sizes (Slurm reads minutes, timeout(1) seconds).
    """
    cleaned = text.strip().lower()
    seconds: float
    clock = cleaned.split(":")
    parts = _duration_parts(cleaned)
    if (
        2 <= len(clock) <= 3
        and cleaned.isascii()
        and clock[0].isdecimal()
        and all(len(p) in (1, 2) and p.isdecimal() for p in clock[1:])
    ):
        seconds = 0
        for part in clock:
            seconds = seconds * 60 + int(part)
    elif parts:
        seconds = sum(float(number) * _DURATION_SECONDS[unit] for number, unit in parts)
    else:
        raise BadInput(f"cannot read duration {text!r}: write it like 90s, 30m, 2h, 1h30m, 1d or 01:30:00")
    if seconds <= 0:
        raise BadInput(f"duration {text!r} must be more than zero")
    if not seconds < 1e15:  # also NaN and inf; 1e15 s is 30 million years: checked in full by jobs.rules
        raise BadInput(f"duration {text[:40]!r} is longer than any time limit can be; give it like 2h or 3d")
    return seconds


def _is_number(text: str) -> bool:
    """ASCII digits, or digits, a point and digits: ``[0-9]+(\\.[0-9]+)?`` (not Unicode's other digits)."""
    whole, point, fraction = text.partition(".")
    return text.isascii() and whole.isdecimal() and (not point or fraction.isdecimal())


def _duration_parts(text: str) -> list[tuple[str, str]]:
    """``1h30m`` -> [("1", "h"), ("30", "m")]: the whole text as numbers each followed by d, h, m or s;
    [] if it is anything else (or empty)."""
    parts, start = [], 0
    for at, char in enumerate(text):
        if char in _DURATION_SECONDS:
            if not _is_number(text[start:at]):
                return []
            parts.append((text[start:at], char))
            start = at + 1
    return parts if start == len(text) else []


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
