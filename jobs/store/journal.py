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
