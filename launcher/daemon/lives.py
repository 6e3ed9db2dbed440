"""One typed life per live job (pueue's ``TaskStatus``): what the daemon holds of each job between its submit
and its end is one record, in one phase, carrying that phase's own data and nothing else:

    pending ──stage──> staged ──start──> running ──act──> suspending ──suspend──> suspended
       ^  <──unstage──   │                ^  ^  <──acted──┘                         │
       │                 └─────start──────┘  └─acted── resuming <──act── running <──resume
       └──────requeue (from running, suspending, resuming or suspended)──────┘

A suspended job holds its GPUs again from the moment its resume begins (``resume``); its helper then acts
(``act``: resuming) until it is done (``acted``). A suspend that fails is undone the same way (``acted``).

A phase is changed only by its moves (:class:`Lives`' methods), and a move the phase does not allow raises
:class:`ImpossibleMove`: a bug in the daemon, never bad input. A job's end is one removal (``Lives.end``).

The steps read the lives through the indexes placement has always read (``pending``, ``running``,
``suspended``, ``staged``, and ``acting``: the suspends and resumes under way): read-only views kept by the
moves, tracked (``launcher.daemon.tracked``) where placement reads them, so a move is what makes it look again.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from gpuq_scheduler.jobs.model import JobRecord, Launch
from gpuq_scheduler.jobs.outcome import Step
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.launcher.daemon.tracked import Changes, TrackedDict


class Phase(enum.Enum):
    PENDING = "pending"
    STAGED = "staged"
    RUNNING = "running"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    RESUMING = "resuming"


class ImpossibleMove(RuntimeError):
    """A move its job's phase does not allow (or a job that is not live): the daemon's own mistake."""


@dataclass
class Running:
    """A job on its shim (running, or suspended to host memory): its record, how it was launched, its processes,
    and what the samples of its GPUs said of it this run (``daemon.watching``, ``daemon.learning``)."""

    record: JobRecord
    launch: Launch
    pids: set[int] = field(default_factory=set)
    held: dict[int, int] = field(default_factory=dict)  # GPU index -> bytes its processes held, the last sample
    peak: int = 0  # the most it held on one GPU in a sample
    active_at: float | None = None  # monotonic: when its GPUs last did work, or this daemon first watched it


@dataclass
class Staged:
    """A pending job handed to the shim of the running job ``after``, to start on its GPUs when it ends
    (``launcher.daemon.handoff``). Out of placement until that job's end says whether it started."""

    after: int
    gpus: tuple[int, ...]
    uuids: tuple[str, ...]
    dropping: bool = False  # taken back: it starts only if the drop reached the shim too late
    cancel_by: str | None = None  # cancelled while staged: it ends cancelled, started or not


class Child(Protocol):
    """The helper a suspend or resume runs in, as a life holds it (``suspension.suspender.Helper``: the suspend
    step's to start; typed here by what is asked of it, so the lives import nothing of that step's)."""

    pid: int
    started: float

    def result(self) -> dict[str, Any] | None: ...

    def times(self, result: dict[str, Any]) -> dict[str, float]: ...


@dataclass
class Acting:
    """A suspend or resume under way (``launcher.daemon.suspension.suspending``): its child, or (after a restart)
    the one an earlier daemon left."""

    step: Step
    by: str
    child: Child | None = None
    left: tuple[int, float] | None = None  # an earlier daemon's child (pid, start): waited for first
    action: Action | None = None  # what the child does: suspend, or resume (a resume, or a suspend undone)
    began: float = 0.0  # wall time
    bytes: int = 0  # what the job held on its GPUs when its suspend began (the last sample)
    retry_at: float = 0.0  # wall time: a failed resume (or undo) is tried again from then
    again: bool = False  # no child of ours: start one (after a restart, or a failure) once ``left`` is gone


@dataclass(frozen=True)
class Pending:
    phase: ClassVar[Phase] = Phase.PENDING
    record: JobRecord
    not_before: float | None = None  # wall time: a requeued job's backoff, not placed before it


@dataclass(frozen=True)
class StagedLife:
    phase: ClassVar[Phase] = Phase.STAGED
    record: JobRecord
    staged: Staged


@dataclass(frozen=True)
class RunningLife:
    phase: ClassVar[Phase] = Phase.RUNNING
    job: Running

    @property
    def record(self) -> JobRecord:
        return self.job.record


@dataclass(frozen=True)
class SuspendingLife:
    phase: ClassVar[Phase] = Phase.SUSPENDING
    job: Running
    acting: Acting

    @property
    def record(self) -> JobRecord:
        return self.job.record


@dataclass(frozen=True)
class SuspendedLife:
    phase: ClassVar[Phase] = Phase.SUSPENDED
    job: Running

    @property
    def record(self) -> JobRecord:
        return self.job.record


@dataclass(frozen=True)
class ResumingLife:
    phase: ClassVar[Phase] = Phase.RESUMING
    job: Running
    acting: Acting

    @property
    def record(self) -> JobRecord:
        return self.job.record


Life = Pending | StagedLife | RunningLife | SuspendingLife | SuspendedLife | ResumingLife
ON_GPUS = (Phase.RUNNING, Phase.SUSPENDING, Phase.RESUMING)  # a job with a helper acting holds its GPUs


class Lives:
    """Every live job's life, by id, and the indexes the steps read."""

    def __init__(self, changes: Changes) -> None:
        self._lives: dict[int, Life] = {}
        self._pending: TrackedDict[int, JobRecord] = TrackedDict(changes)  # pending and staged jobs' records
        self._running: TrackedDict[int, Running] = TrackedDict(changes)  # running, suspending and resuming
        self._suspended: TrackedDict[int, Running] = TrackedDict(changes)
        self._staged: TrackedDict[int, Staged] = TrackedDict(changes)
        self._acting: dict[int, Acting] = {}  # suspending and resuming (placement does not read it)
        self._not_before: TrackedDict[int, float] = TrackedDict(changes)  # pending jobs in their backoff

    # What the steps read.
    @property
    def pending(self) -> Mapping[int, JobRecord]:
        """The jobs waiting for GPUs, staged ones among them (placement leaves those out)."""
        return self._pending

    @property
    def running(self) -> Mapping[int, Running]:
        """The jobs on their GPUs, those being suspended or resumed among them."""
        return self._running

    @property
    def suspended(self) -> Mapping[int, Running]:
        return self._suspended

    @property
    def staged(self) -> Mapping[int, Staged]:
        return self._staged

    @property
    def acting(self) -> Mapping[int, Acting]:
        """The suspends and resumes under way."""
        return self._acting

    @property
    def not_before(self) -> Mapping[int, float]:
        """The pending jobs in a backoff (a retry's, a preempted job's), each with when it may start."""
        return self._not_before

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
    def load(
        self,
        pending: Iterable[JobRecord],
        running: Iterable[Running],
        suspended: Iterable[Running],
        not_before: Mapping[int, float],
    ) -> None:
        """Start again from what the table says (a daemon's start, a tick rolled back)."""
        for job_id in list(self._lives):
            self.end(job_id)
        for record in pending:
            self._put(Pending(record, not_before.get(record.id)))
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
            assert isinstance(life, Pending)
            self._put(Pending(record, life.not_before))

    def due(self, job_id: int) -> None:
        """A pending job's backoff is over (it is being started): placement need not look at its end again."""
        life = self._life(job_id, "end its backoff", Phase.PENDING, Phase.STAGED)
        if isinstance(life, Pending) and life.not_before is not None:
            self._put(Pending(life.record))

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

    def act(self, job_id: int, acting: Acting) -> None:
        """A running job's suspend (or resume) begins, or one under way starts again with a new helper."""
        suspends = acting.step is Step.SUSPENDING
        phase = Phase.SUSPENDING if suspends else Phase.RESUMING
        life = self._life(job_id, f"begin {acting.step.value}", Phase.RUNNING, phase)
        assert isinstance(life, (RunningLife, SuspendingLife, ResumingLife))
        self._put(SuspendingLife(life.job, acting) if suspends else ResumingLife(life.job, acting))

    def acted(self, job_id: int) -> Acting:
        """The suspend or resume under way is over and the job runs on its GPUs: resumed, its suspend undone,
        or about to act again."""
        life = self._life(job_id, "end a suspend or resume", Phase.SUSPENDING, Phase.RESUMING)
        assert isinstance(life, (SuspendingLife, ResumingLife))
        self._put(RunningLife(life.job))
        return life.acting

    def suspend(self, job_id: int) -> Running:
        """A job being suspended is now in host memory: its GPUs are free for others."""
        life = self._life(job_id, "be suspended", Phase.SUSPENDING)
        assert isinstance(life, SuspendingLife)
        life.job.held = {}  # its GPUs hold nothing of it now
        self._put(SuspendedLife(life.job))
        return life.job

    def resume(self, job_id: int) -> Running:
        """A suspended job holding its GPUs again (from the moment its resume begins)."""
        life = self._life(job_id, "resume", Phase.SUSPENDED)
        assert isinstance(life, SuspendedLife)
        self._put(RunningLife(life.job))
        return life.job

    def requeue(self, record: JobRecord, not_before: float | None = None) -> None:
        """A job that ran (running, suspended, or between the two) back in the queue, as ``record``, not placed
        before ``not_before``. Or a job the daemon does not hold (its record read back from the table): pending
        all the same."""
        if record.id in self._lives:
            self._life(record.id, "be requeued", *ON_GPUS, Phase.SUSPENDED)
        self._put(Pending(record, not_before))

    def end(self, job_id: int) -> Life | None:
        """The job ended (or left the daemon's view): its life goes, with everything it held. None: not live."""
        life = self._lives.pop(job_id, None)
        if life is not None:
            for index, _ in self._entries(life):
                index.pop(job_id, None)
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
        """The job's life, in one of the phases ``allowed``."""
        life = self._lives.get(job_id)
        if life is None:
            raise ImpossibleMove(f"job {job_id} cannot {verb}: it is not live")
        if life.phase not in allowed:
            raise ImpossibleMove(f"job {job_id} cannot {verb}: it is {life.phase.value}")
        return life

    def _entries(self, life: Life) -> list[tuple[dict[int, Any], Any]]:
        """The indexes a life is in, each with what it holds of it."""
        if isinstance(life, Pending):
            if life.not_before is not None:
                return [(self._pending, life.record), (self._not_before, life.not_before)]
            return [(self._pending, life.record)]
        if isinstance(life, StagedLife):
            return [(self._pending, life.record), (self._staged, life.staged)]
        if isinstance(life, RunningLife):
            return [(self._running, life.job)]
        if isinstance(life, SuspendedLife):
            return [(self._suspended, life.job)]
        return [(self._running, life.job), (self._acting, life.acting)]

    def _put(self, life: Life) -> None:
        """``life`` in place of the job's last: out of the indexes it leaves, into those it enters (one it stays
        in is written once, so that a record replaced in place is one change, not two)."""
        job_id = life.record.id
        entries = self._entries(life)
        old = self._lives.get(job_id)
        for index, _ in self._entries(old) if old is not None else []:
            if not any(index is kept for kept, _ in entries):
                index.pop(job_id, None)
        self._lives[job_id] = life
        for index, value in entries:
            index[job_id] = value
