"""What suspending and preemption cost each job and user: preemptions, suspends, bytes moved, time suspended.

Pure functions over the journal's events (``events.jsonl``: a ``preempted`` event per preemption, with the
job it was for; a ``suspended`` event per suspend, with the bytes its GPU state took to host memory) and the
job records (``suspended_for``, and ``suspended_at`` for a job suspended now). ``gpuq show``, ``gpuq report``
and ``/metrics`` read them through here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuq_scheduler.jobs.fastsuspend import Fallback
from gpuq_scheduler.jobs.fastsuspend import Path as SuspendPath
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store import journal
from gpuq_scheduler.jobs.store.events import Event, Kind, Preempted, Resumed, Suspended
from gpuq_scheduler.jobs.units import format_duration, format_size


@dataclass
class Moves:
    """One job's (or user's) count: preemptions (requeues among them), suspends, bytes moved to host memory
    (each suspend's GPU state; a resume moves them back), and seconds spent suspended."""

    preemptions: int = 0
    requeues: int = 0
    suspends: int = 0
    bytes: int = 0
    seconds: float = 0.0
    # How the job's last suspend moved its memory, and why not the fast way (one job's, not summed for users):
    # None before events said (gpuq older than #40).
    last: tuple[SuspendPath, Fallback | None, str] | None = None

    def __bool__(self) -> bool:
        return bool(self.preemptions or self.suspends or self.seconds)

    def add(self, other: Moves) -> None:
        self.preemptions += other.preemptions
        self.requeues += other.requeues
        self.suspends += other.suspends
        self.bytes += other.bytes
        self.seconds += other.seconds

    def text(self) -> str:
        """What it cost, for people: "preempted 2 times (1 requeued); suspended 2 times, 40.5G moved, 3m12s
        suspended"."""
        parts = []
        if self.preemptions:
            requeued = f" ({self.requeues} requeued)" if self.requeues else ""
            parts.append(f"preempted {_times(self.preemptions)}{requeued}")
        spent = f"{format_duration(self.seconds)} suspended" if self.seconds else ""
        if self.suspends:
            moved = f"suspended {_times(self.suspends)}, {format_size(self.bytes)} moved"
            parts.append(f"{moved}, {spent}" if spent else moved)
        elif spent:  # the journal could not be read (a shared queue's is root's): the table's figure alone
            parts.append(spent)
        if self.last is not None:
            path, fallback, detail = self.last
            if path is SuspendPath.DRIVER:
                why = fallback.explain(detail) if fallback is not None else ""
                parts.append(f"last by the driver's checkpoint ({why})" if why else "last by the driver's checkpoint")
            else:
                place = {
                    SuspendPath.IN_PLACE: ", in place: its context kept on the GPU",
                    SuspendPath.CONTEXT_KEPT: ", its context kept on the GPU (no driver's checkpoint)",
                }.get(path, "")
                parts.append(f"last by the fast path{place}")
        return "; ".join(parts)


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def from_events(events: Iterable[Event]) -> dict[int, Moves]:
    """Each job's preemptions and suspends from the journal. A preemption is counted once per (victim,
    preemptor): a suspend the driver refused that fell back to a requeue is one preemption, requeued."""
    moves: dict[int, Moves] = {}
    seen: set[tuple[int, object]] = set()
    for event in events:
        if isinstance(event, Suspended):
            found = moves.setdefault(event.job, Moves())
            found.suspends += 1
            found.bytes += event.bytes
            if event.path is not None:  # None: written before suspends had paths (#40)
                found.last = event.path, event.fallback, event.detail or ""
        elif isinstance(event, Preempted):
            found = moves.setdefault(event.job, Moves())
            if (event.job, event.preemptor) not in seen:
                seen.add((event.job, event.preemptor))
                found.preemptions += 1
            if event.requeue:
                found.requeues += 1
    return moves


def read(events_path: Path, job: int | None = None) -> dict[int, Moves]:
    """``from_events`` over a state directory's journal (one job's, if given); nothing where it cannot be read
    (a shared queue's journal is root's: a user's ``gpuq show`` then shows the time suspended only)."""
    try:
        return from_events(journal.read(events_path, (Kind.PREEMPTED, Kind.SUSPENDED), job))
    except OSError:
        return {}


def of_job(record: JobRecord, moves: Mapping[int, Moves], now: float) -> Moves:
    """The job's count, with its time suspended from its record (so far, if it is suspended now)."""
    found = Moves(**vars(moves[record.id])) if record.id in moves else Moves()
    found.seconds = record.suspended_for
    if record.state is JobState.SUSPENDED and record.suspended_at is not None:
        found.seconds += max(0.0, now - record.suspended_at)
    return found


def by_user(records: Iterable[JobRecord], moves: Mapping[int, Moves], now: float) -> dict[str, Moves]:
    """Each user's total over their jobs (users none of whose jobs was ever suspended are left out)."""
    users: dict[str, Moves] = {}
    for record in records:
        found = of_job(record, moves, now)
        if found:
            users.setdefault(record.user, Moves()).add(found)
    return users


def away(events: Iterable[Event], records: Iterable[JobRecord], now: float) -> dict[int, list[tuple[float, float]]]:
    """Each job's stretches of time suspended, (from, to), for the timeline to mark: from the journal's
    ``suspended`` and ``resumed`` events, and, for a job suspended now, until ``now`` (from its record's
    ``suspended_at`` where the journal could not be read)."""
    spans: dict[int, list[tuple[float, float]]] = {}
    since: dict[int, float] = {}
    for event in events:
        if isinstance(event, Suspended):
            since[event.job] = event.t
        elif isinstance(event, Resumed) and event.job in since:
            spans.setdefault(event.job, []).append((since.pop(event.job), event.t))
    for record in records:
        if record.state is not JobState.SUSPENDED:
            continue
        start = since.get(record.id, record.suspended_at)
        if start is not None:
            spans.setdefault(record.id, []).append((start, now))
    return spans
