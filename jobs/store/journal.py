"""The append-only journal of state transitions (``events.jsonl``): history for people and reports.

The job table is the truth; the journal is what happened, in order. One JSON object per line,
written with O_APPEND in a single write so concurrent lines never interleave. What a line holds is an
event of ``jobs.store.events``: written by its ``to_json``, read back by ``events.from_json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.store import events
from gpuq_scheduler.jobs.store.events import Event, Kind


def append(path: Path, happened: Sequence[Event]) -> None:
    """Add events in one write, each a line of its ``to_json`` (the one place the daemon's are encoded)."""
    if not happened:
        return
    data = "".join(json.dumps(event.to_json(), separators=(",", ":")) + "\n" for event in happened).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read(path: Path, kinds: Collection[Kind] | None = None, job: int | None = None) -> Iterator[Event]:
    """The events in order: of these kinds, and of this job, where given; none where there is no journal.

    Every line is parsed; only those of the kinds and job asked become events. A torn last line (a crash
    mid-write) is skipped, not fatal, and so is a line this gpuq cannot read (a kind a newer gpuq wrote): the
    journal is history, and one line of it never hides the rest.
    """
    wanted = None if kinds is None else frozenset(kind.value for kind in kinds)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        while chunk := handle.readlines(CHUNK):
            for data in _parsed(chunk):
                if not isinstance(data, dict):
                    continue
                if (wanted is not None and data.get("event") not in wanted) or (
                    job is not None and data.get("job") != job
                ):
                    continue
                try:
                    yield events.from_json(data)
                except BadInput:
                    continue


CHUNK = 1 << 18  # bytes of lines parsed in one call: a few thousand events


def _parsed(lines: list[bytes]) -> list[Any]:
    """The lines' JSON values. Parsed as one array where they are whole (one call for thousands of lines
    costs half what a call per line does: bench/journal_read.py), else line by line, leaving out the torn."""
    try:
        return list(json.loads(b"[" + b",".join(lines) + b"]"))
    except ValueError:
        pass
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found
