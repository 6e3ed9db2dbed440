from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [("20G", 20 << 30), ("20GiB", 20 << 30), ("20gib", 20 << 30), ("512M", 512 << 20), ("1.5T", 3 << 39),
     ("20GB", 20 * 10**9), (" 4 G ", 4 << 30), ("100K", 100 << 10)],
)  # fmt: skip
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["20", "", "G", "-1G", "0G", "1.2.3G", "20 apples", "1e3G"])
def test_bad_sizes_are_refused_with_a_hint(text: str) -> None:
    with pytest.raises(BadInput, match="size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1d", 86400), ("01:30:00", 5400), ("5:00", 300),
     ("1.5h", 5400)],
)  # fmt: skip
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
