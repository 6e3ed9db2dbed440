"""Applying what clients asked for through the spool: cancel, hold, release, update, drain, pause (and
suspend and resume, which ``daemon.suspension.suspending`` carries out).

Who asked is the request file's owner (from the OS). A job's owner, root, or the user the daemon runs
as may act on a job; refusals are logged and journalled, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.accounts import user_name
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import Outcome
from gpuq_scheduler.jobs.store import spool
from gpuq_scheduler.jobs.store.action_values import Update
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.store.events import Asked, Event, Kind, QueueSet, Refused
from gpuq_scheduler.launcher.daemon import endings, handoff, reserving
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.daemon.suspension import suspending

log = logging.getLogger("gpuq.requests")


def _may_act(scheduler: SchedulerState, uid: int, record: JobRecord) -> bool:
    return accounts.may_act(uid, record.uid, scheduler.admins, scheduler.state.owner())


def _named(scheduler: SchedulerState, ids: tuple[int, ...]) -> list[JobRecord]:
    """Active jobs named by ids; an array id stands for its active members."""
    found: list[JobRecord] = []
    for job_id in ids:
        if job_id in scheduler.arrays:
            found.extend(r for r in scheduler.pending.values() if r.array_id == job_id)
            found.extend(j.record for j in scheduler.running.values() if j.record.array_id == job_id)
            found.extend(j.record for j in scheduler.suspended.values() if j.record.array_id == job_id)
        elif job_id in scheduler.pending:
            found.append(scheduler.pending[job_id])
        elif job_id in scheduler.running:
            found.append(scheduler.running[job_id].record)
        elif job_id in scheduler.suspended:
            found.append(scheduler.suspended[job_id].record)
    return found


def cancel(scheduler: SchedulerState, request: spool.CancelRequest, now: float, events: list[Event]) -> None:
    who = user_name(request.uid)
    pending: list[JobRecord] = []
    named = _named(scheduler, request.job_ids)
    # Staged jobs first: cancelling the job ahead of one could otherwise end it, and start the staged one,
    # before the staged one's cancel is sent.
    named.sort(key=lambda record: record.id not in scheduler.staged)
    for record in named:
        if not _may_act(scheduler, request.uid, record):
            log.warning("refused cancel of job %d (owner %s) from %s", record.id, record.user, who)
            events.append(Refused(now, Kind.CANCEL_REFUSED, who, record.id))
            continue
        if record.id in scheduler.staged:  # its shim may be starting it: it ends once we know which
            handoff.cancel(scheduler, record.id, who)
            events.append(Asked(now, Kind.CANCEL_REQUESTED, record.id, who))
            continue
        if record.id in scheduler.pending:
            pending.append(record)
            continue
        if record.id in scheduler.suspended:
            suspending.thaw(scheduler, record.id)  # it must run to end: SIGTERM, then SIGKILL after the grace
        scheduler.cancel(scheduler.running.get(record.id) or scheduler.suspended[record.id], who)
        events.append(Asked(now, Kind.CANCEL_REQUESTED, record.id, who))
    if pending:
        endings.finish_pending(scheduler, [(record, Outcome.cancelled(who)) for record in pending], now, events)


def control(scheduler: SchedulerState, request: spool.ControlRequest, now: float, events: list[Event]) -> None:
    """Apply one control request. Each ``Action`` has its handler below; one without is an error here, never
    taken for another."""
    who = user_name(request.uid)
    queue_wide, on_job = QUEUE_ACTIONS.get(request.action), JOB_ACTIONS.get(request.action)
    on_running = RUNNING_ACTIONS.get(request.action)
    if queue_wide is None and on_job is None and on_running is None:
        raise ValueError(f"control action {request.action!r} has no handler in launcher.daemon.requests")
    if queue_wide is not None:
        _queue_control(scheduler, request, who, now, events, queue_wide)
        return
    if on_running is not None:  # suspend, resume: running and suspended jobs (``suspension.suspending`` checks who)
        on_running(scheduler, request, now, events)
        return
    assert on_job is not None
    for record in _named(scheduler, request.ids):
        if record.id not in scheduler.pending:
            continue  # already running or ended: hold, release and update apply to pending jobs
        if not _may_act(scheduler, request.uid, record):
            log.warning("refused %s of job %d (owner %s) from %s", request.action, record.id, record.user, who)
            events.append(Refused(now, Kind.refused(request.action), who, record.id))
            continue
        handoff.withdraw(scheduler, record.id)  # held or changed, it may no longer be the one to go next
        if on_job(scheduler, record, request, who):
            written = {} if request.values is None else request.values.to_json()  # an update's, in its event
            events.append(Asked(now, Kind.done(request.action), record.id, who, written))


def _hold(scheduler: SchedulerState, record: JobRecord, request: spool.ControlRequest, who: str) -> bool:
    return _set_held(scheduler, record, True, f"held by {who}; `gpuq release {record.id}` lets it run")


def _release(scheduler: SchedulerState, record: JobRecord, request: spool.ControlRequest, who: str) -> bool:
    return _set_held(scheduler, record, False, "")


def _set_held(scheduler: SchedulerState, record: JobRecord, held: bool, reason: str) -> bool:
    scheduler.table.set_held([record.id], held, reason)
    scheduler.lives.update(record.replace(held=held, reason=reason))
    return True


def _update(scheduler: SchedulerState, record: JobRecord, request: spool.ControlRequest, who: str) -> bool:
    """Whether the update applied: one the queue's bounds refuse is logged and changes nothing."""
    try:
        spec = _updated(record, request.values_as(Update))
        longest = scheduler.shared.max_time if scheduler.shared else None
        if longest is not None and spec.time_limit is not None and spec.time_limit > longest:
            raise BadInput(f"--time is longer than this queue allows (max_time {longest:g}s)")
    except BadInput as err:
        log.warning("refused update of job %d: %s", record.id, err)
        return False
    scheduler.table.update_spec(record.id, spec)
    scheduler.lives.update(record.replace(spec=spec))
    return True


def _updated(record: JobRecord, update: Update) -> JobSpec:
    priority = record.spec.priority if update.priority is None else update.priority
    limit = record.spec.time_limit if update.time_limit is None else update.time_limit
    return dataclasses.replace(record.spec, priority=priority, time_limit=limit)


def _queue_control(
    scheduler: SchedulerState,
    request: spool.ControlRequest,
    who: str,
    now: float,
    events: list[Event],
    apply: Callable[[SchedulerState, tuple[int, ...], str], None],
) -> None:
    owner = scheduler.state.owner()
    if not accounts.may_act(request.uid, owner, scheduler.admins, owner):
        log.warning("refused %s from %s", request.action, who)
        events.append(Refused(now, Kind.refused(request.action), who))
        return
    apply(scheduler, request.ids, who)
    scheduler.table.set_setting("drained", sorted(scheduler.drained))
    scheduler.table.set_setting("paused_by", scheduler.paused_by)
    events.append(QueueSet(now, Kind.done(request.action), request.ids, who))


def _drain(scheduler: SchedulerState, gpus: tuple[int, ...], who: str) -> None:
    scheduler.drained |= set(gpus)


def _undrain(scheduler: SchedulerState, gpus: tuple[int, ...], who: str) -> None:
    scheduler.drained -= set(gpus)


def _pause(scheduler: SchedulerState, gpus: tuple[int, ...], who: str) -> None:
    scheduler.paused_by = who


def _unpause(scheduler: SchedulerState, gpus: tuple[int, ...], who: str) -> None:
    scheduler.paused_by = None


# What each control action does: to the queue (its owner, an admin or root may), or to each pending job it
# names (its owner, an admin or root may). tests/unit/test_spool.py checks these cover every Action.
QUEUE_ACTIONS: dict[Action, Callable[[SchedulerState, tuple[int, ...], str], None]] = {
    Action.DRAIN: _drain,
    Action.UNDRAIN: _undrain,
    Action.PAUSE: _pause,
    Action.UNPAUSE: _unpause,
}
JOB_ACTIONS: dict[Action, Callable[[SchedulerState, JobRecord, spool.ControlRequest, str], bool]] = {
    Action.HOLD: _hold,
    Action.RELEASE: _release,
    Action.UPDATE: _update,
}
RUNNING_ACTIONS: dict[Action, Callable[[SchedulerState, spool.ControlRequest, float, list[Event]], None]] = {
    Action.SUSPEND: suspending.request,
    Action.RESUME: suspending.request,
    Action.RESERVE: reserving.request,
    Action.UNRESERVE: reserving.request,  # no job named (daemon.reserving)
}
