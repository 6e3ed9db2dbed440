"""Applying what clients asked for through the spool: cancel, hold, release, update, drain, pause (and
suspend and resume, which ``daemon.suspending`` carries out).

Who asked is the request file's owner (from the OS). A job's owner, root, or the user the daemon runs
as may act on a job; refusals are logged and journalled, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.accounts import user_name
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import Outcome
from gpuq_scheduler.jobs.store import spool
from gpuq_scheduler.jobs.units import parse_duration
from gpuq_scheduler.launcher.daemon import endings, handoff, suspending
from gpuq_scheduler.launcher.daemon.state import SchedulerState

log = logging.getLogger("gpuq.requests")


def _may_act(scheduler: SchedulerState, uid: int, record: JobRecord) -> bool:
    return accounts.may_act(uid, record.uid, scheduler.admins, os.getuid())


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


def cancel(scheduler: SchedulerState, request: spool.CancelRequest, now: float, events: list[dict[str, Any]]) -> None:
    who = user_name(request.uid)
    pending: list[JobRecord] = []
    named = _named(scheduler, request.job_ids)
    # Staged jobs first: cancelling the job ahead of one could otherwise end it, and start the staged one,
    # before the staged one's cancel is sent.
    named.sort(key=lambda record: record.id not in scheduler.staged)
    for record in named:
        if not _may_act(scheduler, request.uid, record):
            log.warning("refused cancel of job %d (owner %s) from %s", record.id, record.user, who)
            events.append({"t": now, "job": record.id, "event": "cancel-refused", "by": who})
            continue
        if record.id in scheduler.staged:  # its shim may be starting it: it ends once we know which
            handoff.cancel(scheduler, record.id, who)
            events.append({"t": now, "job": record.id, "event": "cancel-requested", "by": who})
            continue
        if record.id in scheduler.pending:
            pending.append(record)
            continue
        if record.id in scheduler.suspended:
            suspending.thaw(scheduler, record.id)  # it must run to end: SIGTERM, then SIGKILL after the grace
        scheduler.cancel(scheduler.running.get(record.id) or scheduler.suspended[record.id], who)
        events.append({"t": now, "job": record.id, "event": "cancel-requested", "by": who})
    if pending:
        endings.finish_pending(scheduler, [(record, Outcome.cancelled(who)) for record in pending], now, events)


def control(scheduler: SchedulerState, request: spool.ControlRequest, now: float, events: list[dict[str, Any]]) -> None:
    who = user_name(request.uid)
    scheduler.changes += 1
    if request.action in ("drain", "undrain", "pause", "unpause"):
        _queue_control(scheduler, request, who, now, events)
        return
    if request.action in ("suspend", "resume"):
        suspending.request(scheduler, request, now, events)
        return
    for record in _named(scheduler, request.ids):
        if record.id not in scheduler.pending:
            continue  # already running or ended: hold, release and update apply to pending jobs
        if not _may_act(scheduler, request.uid, record):
            log.warning("refused %s of job %d (owner %s) from %s", request.action, record.id, record.user, who)
            events.append({"t": now, "job": record.id, "event": f"{request.action}-refused", "by": who})
            continue
        handoff.withdraw(scheduler, record.id)  # held or changed, it may no longer be the one to go next
        if request.action in ("hold", "release"):
            held = request.action == "hold"
            reason = f"held by {who}; `gpuq release {record.id}` lets it run" if held else ""
            scheduler.table.set_held([record.id], held, reason)
            scheduler.pending[record.id] = record.replace(held=held, reason=reason)
        else:
            try:
                spec = _updated(record, request.values)
                longest = scheduler.shared.max_time if scheduler.shared else None
                if longest is not None and spec.time_limit is not None and spec.time_limit > longest:
                    raise BadInput(f"--time is longer than this queue allows (max_time {longest:g}s)")
            except (BadInput, ValueError, TypeError) as err:
                log.warning("refused update of job %d: %s", record.id, err)
                continue
            scheduler.table.update_spec(record.id, spec)
            scheduler.pending[record.id] = record.replace(spec=spec)
        events.append({"t": now, "job": record.id, "event": request.action, "by": who, **request.values})


def _updated(record: JobRecord, values: dict[str, Any]) -> Any:
    changes: dict[str, Any] = {}
    if "priority" in values:
        changes["priority"] = int(values["priority"])
    if "time_limit" in values:
        limit = values["time_limit"]
        changes["time_limit"] = parse_duration(limit) if isinstance(limit, str) else float(limit)
    return dataclasses.replace(record.spec, **changes)


def _queue_control(
    scheduler: SchedulerState, request: spool.ControlRequest, who: str, now: float, events: list[dict[str, Any]]
) -> None:
    owner = scheduler.state.root.stat().st_uid
    if not accounts.may_act(request.uid, owner, scheduler.admins, os.getuid()):
        log.warning("refused %s from %s", request.action, who)
        events.append({"t": now, "event": f"{request.action}-refused", "by": who})
        return
    if request.action == "drain":
        scheduler.drained |= set(request.ids)
    elif request.action == "undrain":
        scheduler.drained -= set(request.ids)
    elif request.action == "pause":
        scheduler.paused_by = who
    else:
        scheduler.paused_by = None
    scheduler.table.set_setting("drained", sorted(scheduler.drained))
    scheduler.table.set_setting("paused_by", scheduler.paused_by)
    events.append({"t": now, "event": request.action, "gpus": list(request.ids), "by": who})
