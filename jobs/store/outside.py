"""``outside.json``: the processes holding GPU memory that gpuq did not start, as the daemon last saw them
(``launcher.daemon.outsiders`` writes it when it changes; `gpuq status` reads it without asking the GPUs).
Each entry: {"gpu", "pid", "user", "name", "used"}."""

from __future__ import annotations

import json
from typing import Any

from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import StateDir

FILE = "outside.json"


def read(state: StateDir) -> list[dict[str, Any]]:
    try:
        with open(state.at(FILE), "rb") as handle:
            data = json.loads(handle.read(4 << 20))
    except (OSError, ValueError, RecursionError):
        return []
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def write(state: StateDir, holders: list[dict[str, Any]]) -> None:
    write_atomic(state.at(FILE), json.dumps(holders).encode(), durable=False, mode=0o644)
