"""The journal's events (``events.jsonl``), typed: one dataclass per kind of event, or per small family of
kinds that carry the same facts, with one writer (``to_json``) and one reader (``from_json``) derived from
their fields (``jobs.store.event_codec``), so no call site builds an event as a dict of its own, and no
reader picks one apart by its keys.

On disk each event stays what gpuq wrote before its events were typed (tests/fixtures/journal-1f61ec5 is a
real one, read by the tests): ``{"t": ..., "job": ..., "event": "<kind>", <its fields>}``, a field whose
default is None left out while it is None (as ``after`` of a job that started on its own; an ending's
``signal`` or ``culprit``), unless it is marked ``null`` (a suspend's ``fallback``). A ``flat`` field
(an update's values, the facts of a suspend's fast path gpuq does not name) spreads its keys beside the
others, and reading gathers every key the event does not declare back into it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.fastsuspend import Fallback
from gpuq_scheduler.jobs.fastsuspend import Path as SuspendPath
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.event_codec import codec
from gpuq_scheduler.jobs.store.kinds import Kind as Kind


@dataclass(frozen=True)
class Event:
    """What every event has: when (wall time) and what. ``KINDS``: the kinds a class stands for."""

    KINDS: ClassVar[frozenset[Kind]] = frozenset()

    t: float

    def __post_init__(self) -> None:
        kind = getattr(self, "kind", None)
        if kind not in self.KINDS:
            raise ValueError(f"{type(self).__name__} is not an event of kind {kind!r}")

    def to_json(self) -> dict[str, Any]:
        """The event as the journal holds it: the one writer."""
        return codec(type(self)).write(self)


def _only(*kinds: Kind) -> Any:
    return frozenset(kinds)


@dataclass(frozen=True)
class Submitted(Event):
    KINDS = _only(Kind.SUBMITTED)
    job: int
    user: str
    kind: Kind = Kind.SUBMITTED


@dataclass(frozen=True)
class Started(Event):
    """``after``: the job it was staged behind, whose end started it (``launcher.daemon.handoff``)."""

    KINDS = _only(Kind.STARTED)
    job: int
    gpus: tuple[int, ...]
    after: int | None = None
    kind: Kind = Kind.STARTED


@dataclass(frozen=True)
class Ended(Event):
    """A job's end, its kind its state's. A job that never ran (cancelled while pending) has no exit code,
    signal, attempt or culprit."""

    KINDS = _only(Kind.SUCCEEDED, Kind.FAILED, Kind.CANCELLED, Kind.TIMEOUT, Kind.LOST)
    kind: Kind
    job: int
    reason: str
    cause: Cause
    exit_code: int | None = None
    signal: int | None = None
    attempt: int | None = None
    culprit: int | None = None

    @property
    def state(self) -> JobState:
        return JobState(self.kind.value)


@dataclass(frozen=True)
class Again(Event):
    """A job back in the queue: a retry after a failure, or a requeue (its culprit: the job that took its
    memory)."""

    KINDS = _only(Kind.RETRY, Kind.REQUEUED)
    kind: Kind
    job: int
    reason: str
    culprit: int | None = None


@dataclass(frozen=True)
class ArrayHeld(Event):
    KINDS = _only(Kind.ARRAY_HELD)
    array: int
    reason: str
    kind: Kind = Kind.ARRAY_HELD


@dataclass(frozen=True)
class Asked(Event):
    """A request acted on for one job by user ``by``; an update's values beside it."""

    KINDS = _only(
        Kind.CANCEL_REQUESTED,
        Kind.HOLD,
        Kind.RELEASE,
        Kind.UPDATE,
        Kind.SUSPENDING,
        Kind.RESUME_REQUESTED,
        Kind.RESUMING,
    )
    kind: Kind
    job: int
    by: str
    values: Mapping[str, Any] = field(default_factory=dict, metadata={"flat": True})


@dataclass(frozen=True)
class QueueSet(Event):
    """A drain, undrain, pause or unpause, by user ``by`` (``gpus``: the GPUs drained or undrained)."""

    KINDS = _only(Kind.DRAIN, Kind.UNDRAIN, Kind.PAUSE, Kind.UNPAUSE)
    kind: Kind
    gpus: tuple[int, ...]
    by: str


@dataclass(frozen=True)
class Refused(Event):
    """A request refused: of job ``job`` (None: of the queue, or a reservation's, ``name``)."""

    KINDS = frozenset(kind for kind in Kind if kind.value.endswith("-refused"))
    kind: Kind
    by: str
    job: int | None = None
    why: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Suspended(Event):
    """A suspend done: ``bytes`` the job held on its GPUs, now in host memory; ``steps`` and ``helper`` its
    timings; the path it took and why (``launcher.daemon.suspension.fastpath``: None before gpuq had one), and
    ``more`` of its facts gpuq does not name here."""

    KINDS = _only(Kind.SUSPENDED)
    job: int
    bytes: int
    steps: Any = None
    helper: Any = None
    path: SuspendPath | None = None
    fallback: Fallback | None = field(default=None, metadata={"null": True})  # written null: readers look for it
    detail: str | None = None
    more: Mapping[str, Any] = field(default_factory=dict, metadata={"flat": True})
    kind: Kind = Kind.SUSPENDED

    @staticmethod
    def of(t: float, job: int, bytes: int, steps: Any, helper: Any, facts: Mapping[str, Any]) -> Suspended:
        """The event of a suspend done, ``facts`` of its path as its helper sent them (JSON), read as the
        journal's reader reads them: their values checked, the ones not named here kept in ``more``."""
        line = {**facts, "t": t, "job": job, "event": Kind.SUSPENDED.value, "bytes": bytes, "steps": steps}
        event = from_json({**line, "helper": helper})
        assert isinstance(event, Suspended)
        return event


@dataclass(frozen=True)
class Resumed(Event):
    KINDS = _only(Kind.RESUMED)
    job: int
    steps: Any = None
    helper: Any = None
    pool: int | None = None  # pinned host memory kept for its next suspend (``launcher.daemon.suspension.pools``)
    kind: Kind = Kind.RESUMED


@dataclass(frozen=True)
class PoolGivenBack(Event):
    """A running job told to unpin the host memory it kept for its next suspend: how much, why, which pids."""

    KINDS = _only(Kind.POOL_GIVEN_BACK)
    job: int
    bytes: int
    why: str
    pids: tuple[int, ...] = ()
    kind: Kind = Kind.POOL_GIVEN_BACK


@dataclass(frozen=True)
class StepFailed(Event):
    """A resume that failed (tried again), or a suspend undone (the driver refused it, or a restart)."""

    KINDS = _only(Kind.RESUME_FAILED, Kind.SUSPEND_UNDONE)
    kind: Kind
    job: int
    why: str


@dataclass(frozen=True)
class Rejected(Event):
    """A request file set aside: its name, why, and its owner's uid (None: gone before it was looked at)."""

    KINDS = _only(Kind.REJECTED)
    file: str
    reason: str
    uid: int | None
    kind: Kind = Kind.REJECTED


@dataclass(frozen=True)
class Watchdog(Event):
    """A rule of the watchdog broken (``rule`` and ``action``: ``launcher.policy.watchdog_rules``'s values, which
    jobs/ may not import)."""

    KINDS = _only(Kind.WATCHDOG)
    job: int
    rule: str
    action: str
    gpu: int
    pids: tuple[int, ...]
    held: int
    reason: str
    kind: Kind = Kind.WATCHDOG


@dataclass(frozen=True)
class GpuLost(Event):
    KINDS = _only(Kind.GPU_LOST)
    job: int
    reason: str
    kind: Kind = Kind.GPU_LOST


@dataclass(frozen=True)
class IdleReleased(Event):
    """An interactive job's GPUs released after ``idle`` seconds without work."""

    KINDS = _only(Kind.IDLE_RELEASED)
    job: int
    idle: float
    kind: Kind = Kind.IDLE_RELEASED


@dataclass(frozen=True)
class Preempted(Event):
    """A job preempted for job ``preemptor`` (``"for"`` on disk) or for a reservation; ``requeue``: why it
    could not be suspended, where it was requeued instead."""

    KINDS = _only(Kind.PREEMPTED)
    job: int
    why: str
    preemptor: int | None = field(default=None, metadata={"key": "for"})
    reservation: str | None = None
    requeue: str | None = None
    kind: Kind = Kind.PREEMPTED


@dataclass(frozen=True)
class Reserved(Event):
    KINDS = _only(Kind.RESERVED)
    name: str
    user: str
    gpus: tuple[int, ...]
    start: float
    end: float
    by: str
    said: tuple[str, ...]
    kind: Kind = Kind.RESERVED


@dataclass(frozen=True)
class ReservationEnded(Event):
    KINDS = _only(Kind.RESERVATION_ENDED)
    name: str
    why: str
    kind: Kind = Kind.RESERVATION_ENDED


@dataclass(frozen=True)
class ReservationWarning(Event):
    """What a reservation's owner is told of work that may not end in time (``said``: the new lines)."""

    KINDS = _only(Kind.RESERVATION_WARNING)
    name: str
    user: str
    said: tuple[str, ...]
    kind: Kind = Kind.RESERVATION_WARNING


CLASSES: tuple[type[Event], ...] = (
    Submitted,
    Started,
    Ended,
    Again,
    ArrayHeld,
    Asked,
    QueueSet,
    Refused,
    Suspended,
    Resumed,
    PoolGivenBack,
    StepFailed,
    Rejected,
    Watchdog,
    GpuLost,
    IdleReleased,
    Preempted,
    Reserved,
    ReservationEnded,
    ReservationWarning,
)
CLASS_OF: dict[Kind, type[Event]] = {kind: cls for cls in CLASSES for kind in cls.KINDS}


def from_json(data: Mapping[str, Any]) -> Event:
    """The event a journal's line holds: the one reader. An unknown kind, or a field of the wrong type, is a
    ``BadInput`` (the journal's reader skips that line, as it skips a torn one)."""
    name = data.get("event")
    try:
        kind = Kind(name)
    except ValueError:
        raise BadInput(f"an event of unknown kind {str(name)[:40]!r}") from None
    return codec(CLASS_OF[kind]).read(data)
