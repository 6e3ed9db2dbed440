"""Which pending jobs may be placed now, and why each of the others waits: paused, held, its array's fail-fast
guard still deciding (``lifecycle.guard``), in backoff, behind
its dependencies, or waiting for its kind's ``--mem auto`` probe (``launcher.daemon.learning``). A job whose
dependency failed never will run: it is cancelled here, saying why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gpuq_scheduler.jobs.model import ArrayInfo, JobRecord
from gpuq_scheduler.jobs.outcome import Outcome
from gpuq_scheduler.jobs.store.events import Event
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.launcher.daemon import endings, fences, learning
from gpuq_scheduler.launcher.daemon.lives import Lives
from gpuq_scheduler.launcher.daemon.owned import MemAuto
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.gpus.mps import Fence
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot
from gpuq_scheduler.launcher.policy import lifecycle
from gpuq_scheduler.launcher.policy.placement import Policy


class Learning(Protocol):
    """What ``--mem auto``'s reservations ask of the state (``daemon.learning``): what each kind has shown and its
    probes, the table (a --like job's peak), placement's policy, the GPUs as last seen, the fence, the lives."""

    @property
    def mem_auto(self) -> MemAuto: ...

    @property
    def table(self) -> JobTable: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def last_snapshot(self) -> list[GpuSnapshot]: ...

    @property
    def fence(self) -> Fence: ...

    @property
    def lives(self) -> Lives: ...


def eligible(scheduler: SchedulerState, now: float) -> tuple[list[JobRecord], dict[int, str]]:
    """Pending jobs free to be placed now, and why each of the others waits (paused, held, backoff,
    dependencies). A job whose dependency failed never will be: it is cancelled here, saying why (the state is
    for that: ``endings.finish_pending`` takes it whole)."""
    ready: list[JobRecord] = []
    waiting: dict[int, str] = {}
    events: list[Event] = []
    deps: dict[int, list[JobRecord]] = {}
    never: list[tuple[JobRecord, Outcome]] = []
    # Read once: the state's tracked fields are data descriptors, which Python reads a third slower than a
    # plain attribute, and this loop runs over every pending job on every pass (10,000 in the harness's D).
    lives, table = scheduler.lives, scheduler.table
    staged, fence_waits, not_before = lives.staged, scheduler.fence_waits, lives.not_before
    guard_waits = scheduler.guard_waits
    for record in list(lives.pending.values()):
        if record.id in staged:
            continue  # behind a running job, on its GPUs: not placed anywhere else meanwhile
        if record.id in fence_waits:  # placed, its memory reserved: its MPS fence is starting
            waiting[record.id] = fences.waiting_reason(scheduler, record.id)
            continue
        if record.held:
            waiting[record.id] = record.reason or "held"
        elif record.array_id is not None and record.array_id in guard_waits:  # the guard decides first
            waiting[record.id] = guard_waits[record.array_id][0]
        elif not_before.get(record.id, 0) > now:
            waiting[record.id] = f"{record.reason} (in {not_before[record.id] - now:.0f}s)"
        elif record.spec.after:
            for dep in record.spec.after:
                if dep not in deps:
                    deps[dep] = _job_list(scheduler.arrays, lives, table, dep)
            readiness = lifecycle.dependencies(record.spec, deps)
            if isinstance(readiness, lifecycle.Never):
                never.append((record, Outcome.not_run(readiness.reason)))
            elif isinstance(readiness, lifecycle.Waiting):
                waiting[record.id] = readiness.reason
            else:
                ready.append(record)
        else:
            ready.append(record)
    ready = _with_learned_memory(scheduler, ready, waiting)
    if never:
        endings.finish_pending(scheduler, never, now, events)
    scheduler.journal.extend(events)
    if scheduler.paused_by is not None:
        waiting.update(
            {r.id: f"the queue is paused (by {scheduler.paused_by}); `gpuq unpause` starts it again" for r in ready}
        )
        return [], waiting
    return ready, waiting


def _with_learned_memory(scheduler: Learning, ready: list[JobRecord], waiting: dict[int, str]) -> list[JobRecord]:
    """``--mem auto`` jobs with the reservation they get now (``daemon.learning``); those that wait for
    their kind's probe move to ``waiting``."""
    if not any(record.spec.mem_auto for record in ready):
        return ready
    placed: list[JobRecord] = []
    for record in ready:
        if not record.spec.mem_auto:
            placed.append(record)
            continue
        resolved = learning.resolve(
            scheduler.mem_auto, scheduler.table, scheduler.policy, scheduler.last_snapshot, scheduler.fence, record
        )
        if isinstance(resolved, str):
            waiting[record.id] = resolved
        else:
            scheduler.lives.update(resolved)
            placed.append(resolved)
    return placed


def _job_list(arrays: Mapping[int, ArrayInfo], lives: Lives, table: JobTable, job_id: int) -> list[JobRecord]:
    """A dependency's records: the job, or an array's members (``arrays``: the active ones; ended ones are
    forgotten)."""
    if job_id in arrays:
        return table.members(job_id)
    record = lives.pending.get(job_id) or table.get(job_id)
    return table.members(job_id) if record is None else [record]
