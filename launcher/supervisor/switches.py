"""Fast-start parts switched off one at a time, to measure what each gains (``bench/faststart.sh``).

``GPUQ_FASTSTART_OFF`` in the daemon's environment (its shims inherit it): a comma-separated list of
``handoff`` (no job is staged behind a running one), ``files`` (a staged job's files are made when written, not
ahead), ``born`` (a staged job's first process is made at its turn, not ahead) and ``zygote`` (each shim clones
its waiters itself). For benchmarks only: every part is on without it. (``blanks``, the next submit's first
process made before it came, went on 2026-11-29: it gained nothing on workload A's gap; docs/benchmarks.md.)
"""

from __future__ import annotations

import os

ENV = "GPUQ_FASTSTART_OFF"


def off(part: str) -> bool:
    """Whether the fast-start ``part`` is switched off."""
    return part in os.environ.get(ENV, "").split(",")
