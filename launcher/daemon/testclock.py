"""A wall clock tests can move: ``GPUQ_TEST_WALL_OFFSET`` names a file holding seconds to add to
``time.time()`` in the daemon and the shims it forks (read at every call, so a test jumps the clock by
writing the file). For tests only, which use it to show that durations (time limits, idle time) follow
``time.monotonic()`` and a wall-clock jump (NTP, a suspended VM, an admin's `date -s`) changes no outcome.
Nothing is changed when it is unset.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

ENV = "GPUQ_TEST_WALL_OFFSET"


def install(environ: Mapping[str, str]) -> None:
    path = environ.get(ENV)
    if not path:
        return
    real = time.time

    def shifted() -> float:
        try:
            with open(path, "rb") as handle:
                return real() + float(handle.read() or b"0")
        except (OSError, ValueError):
            return real()

    time.time = shifted
