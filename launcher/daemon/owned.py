"""What the steps keep between ticks, one group per step that owns it. ``SchedulerState`` holds one of each;
only that step changes it (and ``SchedulerState.forget``, which drops an ended job from all of them).

Where placement reads a collection here, it is a tracked one (``launcher.daemon.tracked``), bound to the
state's ``Changes``, so that changing it is what makes placement look again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuq_scheduler.jobs.store.calendar import Calendar
from gpuq_scheduler.launcher.daemon.tracked import Changes, TrackedDict
from gpuq_scheduler.launcher.policy import memory
from gpuq_scheduler.launcher.policy.preemption import Settings


@dataclass
class Monitor:
    """``daemon.watching`` and ``daemon.clients``: the idle limits, lost GPUs, and when each looks next (what a
    sample says of a running job is that job's own: ``lives.Running``)."""

    # Interactive jobs (gpuq run, gpuq alloc) are released after this many seconds without GPU work (None:
    # never), and batch jobs whose GPUs did no work this long say so in their reason (None: never): a shared
    # queue's config sets them, a personal one GPUQ_IDLE_LIMIT and GPUQ_IDLE_REPORT.
    idle_limit: float | None = None
    idle_report: float | None = None
    lost_since: dict[int, float] = field(default_factory=dict)  # GPU index -> when it was first seen lost
    next_sample: float = 0.0
    next_idle_check: float = 0.0
    next_batch_check: float = 0.0
    next_client_check: float = 0.0  # when to look again for waiting interactive jobs whose client is gone


class MemAuto:
    """``daemon.learning`` (--mem auto): what each kind of job has shown and the probe of each kind now (both
    read by placement); the most each running job has held on one GPU so far, and when a probe's peak last
    grew, are its own (``lives.Running``)."""

    def __init__(self, changes: Changes, learned: dict[str, memory.Peak]) -> None:
        self.learned: TrackedDict[str, memory.Peak] = TrackedDict(changes, learned)
        self.probes: TrackedDict[str, int] = TrackedDict(changes)


class Forks(Protocol):
    """The server that forks the suspend helpers (``suspension.forker.Forker``, the suspend step's to start): typed
    here by what is asked of it, so the state imports nothing of that step's."""

    @property
    def alive(self) -> bool: ...

    def fork(self, order: dict[str, Any], wake: str, pipe: int) -> tuple[int, float]: ...


@dataclass
class Suspensions:
    """``daemon.suspension.suspending``: the server that forks the helpers (``forker.Forker``);
    ``daemon.suspension.pools``: GPUQ_FAST_POOL. The suspends and resumes under way are their jobs' phases; a
    resume asked for, a pool asked back, are a job's marks (``launcher.daemon.lives``)."""

    forker: Forks | None = None
    pool_mode: str = "auto"


@dataclass
class Preemption:
    """``daemon.preempting``: its settings. What it keeps of each job (its victims, their preemptors, the GPUs a
    waiting job takes) is that job's marks (``launcher.daemon.lives``)."""

    settings: Settings = field(default_factory=Settings)


@dataclass
class Booked:
    """``daemon.reserving``: the calendar (as ``reservations.json`` holds it: the daemon is its only writer),
    its settings (an unused reservation's idle time; a user's GPU-hours reserved ahead, None: no quota), and when
    to look again for work its owner must hear of. Its victims are marked so (``launcher.daemon.lives``)."""

    calendar: Calendar
    idle: float | None = 3600.0
    quota: float | None = None
    next_look: float = 0.0
    dirty: bool = False
