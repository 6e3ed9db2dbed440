"""Pure rules for a job's host limits (docs/containment.md): which of ``--cpus``, ``--ram`` and ``--pids`` its
cgroup gets, from its own options or a shared queue's defaults, where the controllers are there to enforce
them, and what a queue refuses at intake. No I/O: the daemon gives the controllers its containment found.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TypeVar

from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.options import PIDS


@dataclass(frozen=True)
class HostLimits:
    """cpu.max as CPUs, memory.max in bytes, pids.max in tasks; None: no limit."""

    cpus: float | None = None
    ram: int | None = None
    pids: int | None = None


NONE = HostLimits()
T = TypeVar("T")
_CONTROLLERS = (("--cpus", "cpu", "cpus"), ("--ram", "memory", "ram"), ("--pids", "pids", "pids"))


def own(spec: JobSpec) -> HostLimits:
    """What the job asked for itself."""
    return HostLimits(spec.cpus, spec.ram, spec.value(PIDS))


def for_job(spec: JobSpec, defaults: HostLimits, controllers: Collection[str]) -> HostLimits:
    """The job's own limits, else the queue's defaults, each only where its controller is there: a default
    that cannot be enforced is left out (a job's own is refused at submit, and ``unenforceable`` after)."""
    asked = own(spec)
    return HostLimits(
        _pick(asked.cpus, defaults.cpus, "cpu" in controllers),
        _pick(asked.ram, defaults.ram, "memory" in controllers),
        _pick(asked.pids, defaults.pids, "pids" in controllers),
    )


def _pick(mine: T | None, default: T | None, enforced: bool) -> T | None:
    if not enforced:
        return None
    return mine if mine is not None else default


def unenforceable(spec: JobSpec, controllers: Collection[str], why: str) -> str:
    """Why the job's own limit cannot be enforced now ("" if it can): its controller was there when it was
    submitted and is not under this daemon."""
    asked = own(spec)
    for flag, controller, key in _CONTROLLERS:
        if getattr(asked, key) is not None and controller not in controllers:
            return f"{flag} cannot be enforced here any more ({why}); submit it again without it"
    return ""


def over_cap(spec: JobSpec, most_pids: int | None) -> str:
    """Why a shared queue refuses the job's --pids ("" if it does not): more than its admin's max_pids."""
    pids = spec.value(PIDS)
    if most_pids is not None and pids is not None and pids > most_pids:
        return f"--pids {pids} is more than this queue allows (max_pids {most_pids})"
    return ""
