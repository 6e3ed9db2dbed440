"""One typed life per live job (pueue's ``TaskStatus``): what the daemon holds of each job between its submit
and its end is one record, in one phase, carrying that phase's own data and nothing else:

    pending ──stage──> staged ──start──> running ──act──> suspending ──suspend──> suspended
       ^  <──unstage──   │                ^  ^  <──acted──┘                         │
       │                 └─────start──────┘  └─acted── resuming <──act── running <──resume
       └──────requeue (from running, suspending, resuming, ending or suspended)──────┘

    running, suspending or resuming ──stop──> ending ──end──> (gone)     ending ──unstop──> as before

A suspended job holds its GPUs again from the moment its resume begins (``resume``); its helper then acts
(``act``: resuming) until it is done (``acted``). A suspend that fails is undone the same way (``acted``).
A job gpuq stops (the watchdog, a lost GPU, a requeued victim's grace over) is ending: it holds its GPUs, with the
outcome it gets unless it succeeds first, until its end; a helper acting on it when it was stopped is still followed
to its end, and starts nothing after (``acted`` and ``suspend`` leave it ending).

Besides its phase, a job has its marks (:class:`Marks`): what the steps keep of it whatever its phase (how often it
was preempted, a resume asked for), dropped with its life. A pass rolled back reads the phases back from the
table; the marks stay with the jobs still live (they were never the table's, and the steps undo their own marks
through ``on_rollback``), as do the helpers under way and the stops (``Scheduler.reload``).

A phase is changed only by its moves (:class:`Lives`' methods), and a move the phase does not allow raises
:class:`ImpossibleMove`: a bug in the daemon, never bad input. A job's end is one removal (``Lives.end``).

The steps read the lives through the indexes placement has always read (``pending``, ``running``,
``suspended``, ``staged``, and ``acting``: the suspends and resumes under way): read-only views kept by the
moves, tracked (``launcher.daemon.tracked``) where placement reads them, so a move is what makes it look again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import Outcome, Step
from gpuq_scheduler.launcher.daemon.phases import (
    ON_GPUS,
    Acting,
    Child,
    EndingLife,
    ImpossibleMove,
    Life,
    Marks,
    Pending,
    Phase,
    ResumingLife,
    Running,
    RunningLife,
    Staged,
    StagedLife,
    SuspendedLife,
    SuspendingLife,
    Taking,
)
from gpuq_scheduler.launcher.daemon.tracked import Changes, TrackedDict

__all__ = [  # the steps import a life's parts from here, where the moves are
    "ON_GPUS",
    "Acting",
    "Child",
    "EndingLife",
    "ImpossibleMove",
    "Life",
    "Marks",
    "Pending",
    "Phase",
    "ResumingLife",
    "Running",
    "RunningLife",
    "Staged",
    "StagedLife",
    "SuspendedLife",
    "SuspendingLife",
    "Taking",
]


class Lives:
    """Every live job's life, by id, and the indexes the steps read."""

    def __init__(self, changes: Changes) -> None:
        self._changes = changes
        self._lives: dict[int, Life] = {}
        self._marks: dict[int, Marks] = {}  # only the jobs a step marked: the steps' loops over them stay short
        self._pending: TrackedDict[int, JobRecord] = TrackedDict(changes)  # pending and staged jobs' records
        self._running: TrackedDict[int, Running] = TrackedDict(changes)  # running, suspending and resuming
        self._suspended: TrackedDict[int, Running] = TrackedDict(changes)
        self._staged: TrackedDict[int, Staged] = TrackedDict(changes)
        self._acting: dict[int, Acting] = {}  # suspending and resuming (placement does not read it)
        self._not_before: TrackedDict[int, float] = TrackedDict(changes)  # pending jobs in their backoff
        self._stopped_for: TrackedDict[int, Outcome] = TrackedDict(changes)  # ending

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

    @property
    def stopped_for(self) -> Mapping[int, Outcome]:
        """The jobs gpuq is stopping (ending), each with the outcome it gets unless it succeeds first."""
        return self._stopped_for

    def marks(self, job_id: int) -> Marks:
        """The live job's marks, to read or change (``take`` changes ``taking``)."""
        if job_id not in self._lives:
            raise ImpossibleMove(f"job {job_id} cannot be marked: it is not live")
        marks = self._marks.get(job_id)
        if marks is None:
            marks = self._marks[job_id] = Marks()
        return marks

    def peek(self, job_id: int) -> Marks | None:
        """The job's marks if a step marked it (a read that marks nothing: the loops over ``marked`` stay short)."""
        return self._marks.get(job_id)

    def marked(self) -> list[tuple[int, Marks]]:
        """The jobs a step has marked, with their marks (a list: a loop over it may change them)."""
        return list(self._marks.items())

    def takings(self) -> dict[int, Taking]:
        """The waiting jobs taking others' GPUs (``daemon.preempting``), each with what it takes."""
        return {job_id: marks.taking for job_id, marks in self._marks.items() if marks.taking is not None}

    def take(self, job_id: int, taking: Taking | None) -> None:
        """A waiting job takes others' GPUs (or no longer does): placement looks again."""
        self.marks(job_id).taking = taking
        self._changes.mark()

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
        """Start again from what the table says (a daemon's start, a tick rolled back): the jobs still live keep
        their marks."""
        marks = dict(self._marks)  # ``end`` drops them
        for job_id in list(self._lives):
            self.end(job_id)
        for record in pending:
            self._put(Pending(record, not_before.get(record.id)))
        for job in running:
            self._put(RunningLife(job))
        for job in suspended:
            self._put(SuspendedLife(job))
        self._marks = {job_id: kept for job_id, kept in marks.items() if job_id in self._lives}

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
        or about to act again. An ending job stays ending."""
        life = self._life(job_id, "end a suspend or resume", Phase.SUSPENDING, Phase.RESUMING, Phase.ENDING)
        if isinstance(life, EndingLife):
            if life.acting is None:
                raise ImpossibleMove(f"job {job_id} cannot end a suspend or resume: none is under way")
            self._put(EndingLife(life.job, life.outcome))
            return life.acting
        assert isinstance(life, (SuspendingLife, ResumingLife))
        self._put(RunningLife(life.job))
        return life.acting

    def suspend(self, job_id: int) -> Running:
        """A job being suspended is now in host memory: its GPUs are free for others. One stopped meanwhile
        stays ending, on its GPUs, until its end."""
        life = self._life(job_id, "be suspended", Phase.SUSPENDING, Phase.ENDING)
        if isinstance(life, EndingLife):
            self.acted(job_id)
            return life.job
        assert isinstance(life, SuspendingLife)
        life.job.held = {}  # its GPUs hold nothing of it now
        self._put(SuspendedLife(life.job))
        return life.job

    def stop(self, job_id: int, outcome: Outcome) -> None:
        """gpuq stops a job on its GPUs: it ends as ``outcome`` unless it succeeds first."""
        life = self._life(job_id, "be stopped", Phase.RUNNING, Phase.SUSPENDING, Phase.RESUMING)
        assert isinstance(life, (RunningLife, SuspendingLife, ResumingLife))
        acting = life.acting if isinstance(life, (SuspendingLife, ResumingLife)) else None
        self._put(EndingLife(life.job, outcome, acting))

    def unstop(self, job_id: int) -> None:
        """A stop taken back before it was sent (its pass rolled back): the job is as it was."""
        life = self._life(job_id, "be stopped no more", Phase.ENDING)
        assert isinstance(life, EndingLife)
        if life.acting is None:
            self._put(RunningLife(life.job))
        elif life.acting.step is Step.SUSPENDING:
            self._put(SuspendingLife(life.job, life.acting))
        else:
            self._put(ResumingLife(life.job, life.acting))

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
        self._marks.pop(job_id, None)
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
        if isinstance(life, EndingLife):
            entries: list[tuple[dict[int, Any], Any]] = [(self._running, life.job), (self._stopped_for, life.outcome)]
            return entries + ([(self._acting, life.acting)] if life.acting is not None else [])
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
