"""One typed life per live job (pueue's ``TaskStatus``): what the daemon holds of each job between its submit
and its end is one record, in one phase, carrying that phase's own data and nothing else:

    pending ──stage──> staged ──start──> running ──suspend──> suspended
       ^  <──unstage──   │                │  ^                   │
       │                 └──start─────────┘  └──────resume───────┘
       └──────────────requeue (from running or suspended)──────────┘

A phase is changed only by its moves (:class:`Lives`' methods), and a move the phase does not allow raises
:class:`ImpossibleMove`: a bug in the daemon, never bad input. A job's end is one removal (``Lives.end``).

The steps read the lives through the indexes placement has always read (``pending``, ``running``,
``suspended``, ``staged``): read-only views kept by the moves, each a tracked dict (``launcher.daemon.tracked``),
so a move is what makes placement look again.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from gpuq_scheduler.jobs.model import JobRecord, Launch
from gpuq_scheduler.launcher.daemon.tracked import Changes, TrackedDict


class Phase(enum.Enum):
    PENDING = "pending"
    STAGED = "staged"
    RUNNING = "running"
    SUSPENDED = "suspended"


class ImpossibleMove(RuntimeError):
    """A move its job's phase does not allow (or a job that is not live): the daemon's own mistake."""


@dataclass
class Running:
    """A job on its shim (running, or suspended to host memory): its record, how it was launched, its processes."""

    record: JobRecord
    launch: Launch
    pids: set[int] = field(default_factory=set)


@dataclass
class Staged:
    """A pending job handed to the shim of the running job ``after``, to start on its GPUs when it ends
    (``launcher.daemon.handoff``). Out of placement until that job's end says whether it started."""

    after: int
    gpus: tuple[int, ...]
    uuids: tuple[str, ...]
    dropping: bool = False  # taken back: it starts only if the drop reached the shim too late
    cancel_by: str | None = None  # cancelled while staged: it ends cancelled, started or not


@dataclass(frozen=True)
class Pending:
    phase: ClassVar[Phase] = Phase.PENDING
    record: JobRecord


@dataclass(frozen=True)
class StagedLife:
    phase: ClassVar[Phase] = Phase.STAGED
    record: JobRecord
    staged: Staged


@dataclass(frozen=True)
class RunningLife:
    phase: ClassVar[Phase] = Phase.RUNNING
    job: Running


@dataclass(frozen=True)
class SuspendedLife:
    phase: ClassVar[Phase] = Phase.SUSPENDED
    job: Running


Life = Pending | StagedLife | RunningLife | SuspendedLife


class Lives:
    """Every live job's life, by id, and the indexes the steps read."""

    def __init__(self, changes: Changes) -> None:
        self._lives: dict[int, Life] = {}
        self._pending: TrackedDict[int, JobRecord] = TrackedDict(changes)  # pending and staged jobs' records
        self._running: TrackedDict[int, Running] = TrackedDict(changes)
        self._suspended: TrackedDict[int, Running] = TrackedDict(changes)
        self._staged: TrackedDict[int, Staged] = TrackedDict(changes)

    # What the steps read.
    @property
    def pending(self) -> Mapping[int, JobRecord]:
        """The jobs waiting for GPUs, staged ones among them (placement leaves those out)."""
        return self._pending

    @property
    def running(self) -> Mapping[int, Running]:
        return self._running

    @property
    def suspended(self) -> Mapping[int, Running]:
        return self._suspended

    @property
    def staged(self) -> Mapping[int, Staged]:
        return self._staged

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._lives

    def __len__(self) -> int:
        return len(self._lives)

    def get(self, job_id: int) -> Life | None:
        return self._lives.get(job_id)

    def phase(self, job_id: int) -> Phase | None:
        life = self._lives.get(job_id)
        return None if life is None else life.phase

    # The moves.
    def load(self, pending: Iterable[JobRecord], running: Iterable[Running], suspended: Iterable[Running]) -> None:
        """Start again from what the table says (a daemon's start, a tick rolled back)."""
        for job_id in list(self._lives):
            self.end(job_id)
        for record in pending:
            self.add(record)
        for job in running:
            self._put(RunningLife(job))
        for job in suspended:
            self._put(SuspendedLife(job))

    def add(self, record: JobRecord) -> None:
        """A job new to the daemon: pending."""
        if record.id in self._lives:
            raise ImpossibleMove(f"job {record.id} is already {self._lives[record.id].phase.value}")
        self._put(Pending(record))

    def update(self, record: JobRecord) -> None:
        """A pending or staged job's record as it is now (held, released, resolved, modified)."""
        life = self._life(record.id, "be updated", Phase.PENDING, Phase.STAGED)
        if isinstance(life, StagedLife):
            self._put(StagedLife(record, life.staged))
        else:
            self._put(Pending(record))

    def stage(self, job_id: int, staged: Staged) -> None:
        """A pending job handed to a running job's shim, to start when that one ends."""
        life = self._life(job_id, "be staged", Phase.PENDING)
        assert isinstance(life, Pending)
        self._put(StagedLife(life.record, staged))

    def unstage(self, job_id: int) -> Staged:
        """A staged job pending again (its predecessor ended without starting it, or it was taken back)."""
        life = self._life(job_id, "be unstaged", Phase.STAGED)
        assert isinstance(life, StagedLife)
        self._put(Pending(life.record))
        return life.staged

    def start(self, job: Running) -> None:
        """A pending or staged job started: it is on its GPUs."""
        self._life(job.record.id, "start", Phase.PENDING, Phase.STAGED)
        self._put(RunningLife(job))

    def suspend(self, job_id: int) -> Running:
        """A running job now suspended to host memory: its GPUs are free for others."""
        life = self._life(job_id, "be suspended", Phase.RUNNING)
        assert isinstance(life, RunningLife)
        self._put(SuspendedLife(life.job))
        return life.job

    def resume(self, job_id: int) -> Running:
        """A suspended job holding its GPUs again (from the moment its resume begins)."""
        life = self._life(job_id, "resume", Phase.SUSPENDED)
        assert isinstance(life, SuspendedLife)
        self._put(RunningLife(life.job))
        return life.job

    def requeue(self, record: JobRecord) -> None:
        """A running or suspended job back in the queue, as ``record`` (pending). Or a job the daemon does not
        hold (its record read back from the table): pending all the same."""
        if record.id in self._lives:
            self._life(record.id, "be requeued", Phase.RUNNING, Phase.SUSPENDED)
        self._put(Pending(record))

    def end(self, job_id: int) -> Life | None:
        """The job ended (or left the daemon's view): its life goes, with everything it held. None: not live."""
        life = self._lives.pop(job_id, None)
        self._unindex(job_id, life)
        return life

    @contextlib.contextmanager
    def narrowed(self, job_id: int) -> Iterator[None]:
        """Only ``job_id`` pending while inside (``daemon.isolation`` tries the pending jobs one at a time); the
        others are pending again after, with what the moves inside did to any of them."""
        everyone = dict(self._pending)
        self._pending.clear()
        if job_id in everyone:
            self._pending[job_id] = everyone[job_id]
        try:
            yield
        finally:
            for other, life in self._lives.items():
                if isinstance(life, (Pending, StagedLife)):
                    self._pending[other] = life.record

    def _life(self, job_id: int, verb: str, *allowed: Phase) -> Life:
        life = self._lives.get(job_id)
        if life is None:
            raise ImpossibleMove(f"job {job_id} cannot {verb}: it is not live")
        if life.phase not in allowed:
            raise ImpossibleMove(f"job {job_id} cannot {verb}: it is {life.phase.value}")
        return life

    def _put(self, life: Life) -> None:
        job_id = life.job.record.id if isinstance(life, (RunningLife, SuspendedLife)) else life.record.id
        self._unindex(job_id, self._lives.get(job_id), keep=life)
        self._lives[job_id] = life
        if isinstance(life, Pending):
            self._pending[job_id] = life.record
        elif isinstance(life, StagedLife):
            self._pending[job_id] = life.record
            self._staged[job_id] = life.staged
        elif isinstance(life, RunningLife):
            self._running[job_id] = life.job
        else:
            self._suspended[job_id] = life.job

    def _unindex(self, job_id: int, life: Life | None, keep: Life | None = None) -> None:
        """Take ``job_id`` out of the indexes ``life`` put it in (those ``keep`` puts it back in stay, so that
        a record replaced in place is one change, not two)."""
        if life is None:
            return
        kept = {keep.phase} if keep is not None else set()
        stays_pending = kept & {Phase.PENDING, Phase.STAGED}
        if isinstance(life, (Pending, StagedLife)) and not stays_pending:
            self._pending.pop(job_id, None)
        if isinstance(life, StagedLife) and Phase.STAGED not in kept:
            self._staged.pop(job_id, None)
        if isinstance(life, RunningLife) and Phase.RUNNING not in kept:
            self._running.pop(job_id, None)
        if isinstance(life, SuspendedLife) and Phase.SUSPENDED not in kept:
            self._suspended.pop(job_id, None)
