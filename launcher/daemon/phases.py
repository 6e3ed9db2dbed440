"""What a job's life (``launcher.daemon.lives``) is made of: its phases, each a record carrying that phase's own
data, what a job on its shim is (``Running``), its marks (``Marks``), and the refusal of a move its phase does
not allow (``ImpossibleMove``). Only ``Lives``' moves make or change them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from gpuq_scheduler.jobs.model import JobRecord, Launch
from gpuq_scheduler.jobs.outcome import Outcome, Step
from gpuq_scheduler.jobs.store.actions import Action


class Phase(enum.Enum):
    PENDING = "pending"
    STAGED = "staged"
    RUNNING = "running"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    RESUMING = "resuming"
    ENDING = "ending"


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
    grew_at: float | None = None  # a --mem auto probe's: when its peak last grew (a sample's time)


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


@dataclass
class Taking:
    """A waiting job whose victims are being suspended (``daemon.preempting``): it starts on ``gpus`` once they
    are off them."""

    victims: set[int]
    gpus: tuple[int, ...]
    uuids: tuple[str, ...]


@dataclass
class Marks:
    """What the steps keep of a live job whatever its phase, each field its step's own; dropped with its life."""

    # daemon.preempting: the GPUs a waiting job takes (``Lives.take``: placement reads it); a waiting job that
    # preempts, never staged behind a running job; a victim's preemptor and why (it resumes once that one is not
    # running); how often it was preempted; when it last resumed (wall time: its minimum runtime counts from
    # there); a requeued victim's end of grace (monotonic); a job whose suspend failed, never suspended again.
    taking: Taking | None = None
    no_handoff: bool = False
    preempted_by: tuple[int, str] | None = None
    preemptions: int = 0
    resumed_at: float | None = None
    signalled_until: float | None = None
    unsuspendable: bool = False
    # daemon.suspension.suspending: who asked for its resume, while it waits for its GPUs.
    resume_wanted: str | None = None
    # daemon.suspension.pools: when it was told to give its pool back (monotonic), while it still keeps it.
    pool_told: float | None = None
    # daemon.reserving: the reservation it was suspended for; one over, its place kept until it resumes; its
    # suspend for one was undone once (the next time it is requeued instead).
    victim_of: str | None = None
    returning: bool = False
    undone: bool = False


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
class OnShim:
    """A life whose job is on its shim (running, or suspended to host memory): its record is the job's."""

    job: Running

    @property
    def record(self) -> JobRecord:
        return self.job.record


@dataclass(frozen=True)
class RunningLife(OnShim):
    phase: ClassVar[Phase] = Phase.RUNNING


@dataclass(frozen=True)
class SuspendingLife(OnShim):
    phase: ClassVar[Phase] = Phase.SUSPENDING
    acting: Acting


@dataclass(frozen=True)
class SuspendedLife(OnShim):
    phase: ClassVar[Phase] = Phase.SUSPENDED


@dataclass(frozen=True)
class ResumingLife(OnShim):
    phase: ClassVar[Phase] = Phase.RESUMING
    acting: Acting


@dataclass(frozen=True)
class EndingLife(OnShim):
    phase: ClassVar[Phase] = Phase.ENDING
    outcome: Outcome  # what it ends as, unless it succeeds first
    acting: Acting | None = None  # the suspend or resume under way when it was stopped: followed, not begun again


Life = Pending | StagedLife | RunningLife | SuspendingLife | SuspendedLife | ResumingLife | EndingLife
ON_GPUS = (Phase.RUNNING, Phase.SUSPENDING, Phase.RESUMING, Phase.ENDING)  # a helper acting: it holds its GPUs
