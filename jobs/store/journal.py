"""The append-only journal of state transitions (``events.jsonl``): history for people and reports.

The job table is the truth; the journal is what happened, in order. One JSON object per line,
written with O_APPEND in a single write so concurrent lines never interleave.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def append(path: Path, events: list[dict[str, Any]]) -> None:
    if not events:
        return
    data = "".join(json.dumps(event, separators=(",", ":")) + "\n" for event in events).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read(path: Path) -> Iterator[dict[str, Any]]:
    """Events in order; a torn last line (a crash mid-write) is skipped, not fatal."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        for line in handle:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event


def read_kinds(path: Path, kinds: tuple[str, ...], job: int | None = None) -> Iterator[dict[str, Any]]:
    """The events of these kinds (of one job, if given), in order: a journal of 100,000 jobs is scanned, not
    parsed, since ``append`` writes each line compactly (``"event":"suspended"``) and only matches are read."""
    marks = [f'"event":"{kind}"'.encode() for kind in kinds]
    mine = None if job is None else f'"job":{job},'.encode()
    with path.open("rb") as handle:
        for line in handle:
            if not any(mark in line for mark in marks) or (mine is not None and mine not in line):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") in kinds and (job is None or event.get("job") == job):
                yield event
