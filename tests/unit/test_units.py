from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("20G", 20 << 30),
        ("20GiB", 20 << 30),
        ("20gib", 20 << 30),
        ("512M", 512 << 20),
        ("1.5T", 3 << 39),
        ("20GB", 20 * 10**9),
        (" 4 G ", 4 << 30),
        ("100K", 100 << 10),
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["20", "", "G", "-1G", "0G", "1.2.3G", "20 apples", "1e3G"])
def test_bad_sizes_are_refused_with_a_hint(text: str) -> None:
    with pytest.raises(BadInput, match="size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1d", 86400),
        ("01:30:00", 5400),
        ("5:00", 300),
        ("1.5h", 5400),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["60", "", "soon", "1x", "0s", "-5m", "1h 30m", "::"])
def test_bad_durations_are_refused_with_a_hint(text: str) -> None:
    with pytest.raises(BadInput, match="duration"):
        parse_duration(text)


@given(st.integers(min_value=1, max_value=1 << 50))
def test_format_size_is_short(size: int) -> None:
    assert len(format_size(size)) <= 7


def test_formatting() -> None:
    assert format_size(None) == "-" and format_size(20 << 30) == "20.0G"
    assert format_duration(None) == "-" and format_duration(65) == "1m05s" and format_duration(3 * 3600) == "3h00m"


# The regular expressions the parsers used before they dropped `re` (for the quick submit's start-up): the
# parsers must still accept exactly what these accepted, with the same values.
# With one change on purpose: \d matched Unicode's other digits too ("٣h" was 3 hours), which then passed
# unseen as numbers; only 0-9 are digits now (re.ASCII).
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$", re.ASCII)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])", re.ASCII)
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def _size_before(text: str) -> int | None:
    match = _SIZE_RE.match(text)
    if not match:
        return None
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    unit = match.group(2).upper()
    factor = (
        scale.get(unit[:1])
        if unit[1:] in ("", "I", "IB")
        else 10 ** (3 * "KMGT".index(unit[0]) + 3)
        if (unit[1:] == "B" and unit[0] in "KMGT")
        else None
    )
    size = None if factor is None else int(float(match.group(1)) * factor)
    return size if size else None


def _duration_before(text: str) -> float | None:
    cleaned = text.strip().lower()
    if re.fullmatch(r"\d+(:\d{1,2}){1,2}", cleaned, re.ASCII):
        seconds = 0
        for part in cleaned.split(":"):
            seconds = seconds * 60 + int(part)
        return seconds or None
    if cleaned and _DURATION_PART.sub("", cleaned) == "":
        return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(cleaned)) or None
    return None


SIZE_TEXT = st.text(st.sampled_from([*"0123456789. \t\n", "٣", *"gGiIbBkKmMtTx", "²"]), max_size=8)
DURATION_TEXT = st.text(st.sampled_from([*"0123456789.: \t", "٣", *"dhmsHMx", "²"]), max_size=9)


@pytest.mark.parametrize(
    ("parse", "before", "texts"),
    [(parse_size, _size_before, SIZE_TEXT), (parse_duration, _duration_before, DURATION_TEXT)],
    ids=["size", "duration"],
)
@given(data=st.data())
def test_parsers_accept_what_the_regular_expressions_did(
    parse: Callable[[str], float],
    before: Callable[[str], float | None],
    texts: st.SearchStrategy[str],
    data: st.DataObject,
) -> None:
    text = data.draw(texts)
    try:
        got: float | None = parse(text)
    except BadInput:
        got = None
    assert got == before(text)
