"""Interactive jobs whose client is gone: a `gpuq run` or `gpuq alloc` that ended (its terminal closed, a
kill -9) before its job started withdraws the job. Its placeholder (``jobs.hold``) would otherwise start
when GPUs free, find nobody to serve, and end: a job that never ran, recorded as if it had."""

from __future__ import annotations

from gpuq_scheduler.jobs.hold import client_alive
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import Outcome
from gpuq_scheduler.jobs.store.events import Event
from gpuq_scheduler.launcher.daemon import endings
from gpuq_scheduler.launcher.daemon.lives import Lives
from gpuq_scheduler.launcher.daemon.owned import Monitor
from gpuq_scheduler.launcher.daemon.state import SchedulerState

CHECK_EVERY = 1.0  # seconds between looks at the clients of waiting interactive jobs


def gone(record: JobRecord) -> bool:
    return record.spec.client is not None and client_alive(record.spec.command) is False


def gone_waiting(monitor: Monitor, lives: Lives, now: float, *, every: float = CHECK_EVERY) -> list[JobRecord]:
    """The waiting interactive jobs whose client is gone, to withdraw: one /proc read per such job, once a second."""
    if now < monitor.next_client_check:
        return []
    monitor.next_client_check = now + every
    # A job staged behind a running one is its shim's to start: if its client is gone by then, the placeholder
    # ends as a hang-up would end a program (jobs.hold), never as a success.
    return [r for r in lives.pending.values() if r.id not in lives.staged and gone(r)]


def withdraw(scheduler: SchedulerState, records: list[JobRecord], now: float) -> None:
    """End ``records`` withdrawn (the state is ``endings.finish_pending``'s, which takes it whole)."""
    if not records:
        return
    events: list[Event] = []
    endings.finish_pending(scheduler, [(r, Outcome.withdrawn(_why(r))) for r in records], now, events)
    scheduler.journal.extend(events)


def _why(record: JobRecord) -> str:
    return f"its client (gpuq run or alloc, pid {record.spec.client}) ended before the job started"
