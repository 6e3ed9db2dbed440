"""Successor hand-off: the next job for a GPU given ahead of time to the shim of the job on it.

When a whole-GPU job runs and the job that would get its GPUs next is known, the daemon *stages* that job
behind it: it writes ``run/<id>.next`` (so a restarted daemon knows), commits, and sends the job down the
running job's shim pipe. The shim starts it the moment the first job ends, naming it in the first job's
exit file, written before the successor starts; the daemon records it as running when it reads that file,
once the burst of ends it came in has settled (``lifetime``). The next job on a GPU then starts without a
round trip through the daemon (``bench/handoff_bound.py`` measured what that is worth).

A staged job stays pending in the table and in ``scheduler.pending``, out of placement. The daemon takes
it back (a *drop*) when it no longer comes next: held or updated, the queue paused, its GPU drained, or a
job that ranks before it became ready. Until the first job's exit file says whether it started, a staged
job is neither placed elsewhere nor staged again: it runs once, on the GPUs it was staged for, or not at
all. A cancel reaches it down the same pipe (naming it, so it drops it or stops it, whichever applies), and
a shim whose daemon died (its pipe at end of file) starts nothing staged.

What is staged, kept narrow on purpose: a personal queue's whole-GPU jobs on the GPUs of a whole-GPU job of
the same size, in queue order, never past a job that does not qualify. Packed jobs, ``--mem auto``, torchrun,
throttled arrays, arrays whose fail-fast guard has not decided (``lifecycle.guard``: it must see each end
first), interactive jobs and a shared queue's fair share go the usual way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import os
from collections.abc import Iterator

from gpuq_scheduler.jobs.model import JobRecord, Launch, Mode
from gpuq_scheduler.jobs.options import GPU_IDS
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.events import Event, Started
from gpuq_scheduler.jobs.store.statedir import read_bytes
from gpuq_scheduler.launcher.daemon import endings, outcomes
from gpuq_scheduler.launcher.daemon.lives import Running, Staged
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.daemon.watching import sight
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot
from gpuq_scheduler.launcher.policy.placement import GpuView, Request, place
from gpuq_scheduler.launcher.supervisor import processes, switches
from gpuq_scheduler.launcher.supervisor.exits import BadExitFile, ExitFile

log = logging.getLogger("gpuq.handoff")


def load(scheduler: SchedulerState) -> None:
    """Read back what an earlier daemon (or this one, before a rolled-back tick) staged. A record whose job
    is no longer pending, or whose predecessor no longer runs, was settled in the same commit as that
    predecessor's end: it goes."""
    for job_id in list(scheduler.staged):
        scheduler.lives.unstage(job_id)
    with contextlib.suppress(OSError):
        for name in os.listdir(scheduler.state.run):
            if not name.endswith(".next") or not name[: -len(".next")].isdigit():
                continue
            job_id = int(name[: -len(".next")])
            path = scheduler.state.next_file(job_id)
            try:
                data = json.loads(read_bytes(path))
                staged = Staged(
                    int(data["after"]), tuple(data["gpus"]), tuple(data["uuids"]), cancel_by=data.get("cancel_by")
                )
            except (OSError, ValueError, KeyError, TypeError):
                staged = None
            if staged is None or job_id not in scheduler.pending or staged.after not in scheduler.running:
                endings.unlink(path)
                continue
            scheduler.lives.stage(job_id, staged)


def reason(staged: Staged) -> str:
    """Why a staged job is not placed, for `gpuq status`."""
    gpus = ",".join(str(g) for g in staged.gpus)
    return f"next on GPU {gpus}, when job {staged.after} ends"


def stage(scheduler: SchedulerState, upcoming: Iterator[JobRecord], snapshot: list[GpuSnapshot], now: float) -> None:
    """After a placement pass: take back staged jobs that no longer come next, then stage the jobs that come
    next (``upcoming``: the ready jobs this pass placed nowhere, in queue order) behind the running jobs whose
    GPUs they would get. Inside the tick's transaction; the shims are told after the commit."""
    if scheduler.shared is not None or switches.off("handoff"):
        return  # fair share decides who goes next at the moment a GPU frees: nothing is staged
    head = next(upcoming, None)
    views: dict[int, GpuView] = {}
    if scheduler.staged:
        views = {v.index: v for v in sight.views(scheduler, snapshot)}
        _review(scheduler, head, views)
    if scheduler.paused_by is not None or head is None:
        return
    followed = {s.after for s in scheduler.staged.values()}
    ahead = sorted(
        (job for job in scheduler.running.values() if job.record.id not in followed and _may_hand_off(scheduler, job)),
        key=lambda job: (job.record.started_at or now, job.record.id),
    )
    if not ahead:
        return
    views = views or {v.index: v for v in sight.views(scheduler, snapshot)}
    for job, record in zip(ahead, itertools.chain([head], upcoming), strict=False):
        if not _may_follow(scheduler, record, job) or not _fits(scheduler, record, job, views, now):
            return  # never past a job that cannot go next: it would be overtaken
        _stage(scheduler, record, job)


def _rank(record: JobRecord) -> tuple[int, int]:
    return -record.spec.priority, record.id  # queue order: priority first, then submission


def _may_hand_off(scheduler: SchedulerState, job: Running) -> bool:
    """A running job whose shim may be given its successor: whole GPUs, started by this daemon (a pipe to its
    shim), not being stopped, not interactive."""
    record = job.record
    return (
        bool(record.gpus)
        and record.spec.mem_per_gpu is None
        and record.spec.client is None
        and job.launch.cancel_by is None
        and record.id not in scheduler.stopped_for
        and not set(record.gpus) & scheduler.drained
        and scheduler.shims.has(record.id)
    )


def _may_follow(scheduler: SchedulerState, record: JobRecord, job: Running) -> bool:
    spec = record.spec
    throttled = record.array_id is not None and (info := scheduler.arrays.get(record.array_id)) and info.throttle
    # A member of an array whose fail-fast guard has not decided: handed off, it would start the moment the
    # member ahead fails, before the guard has seen that failure (and all of an array that fails would run).
    unproven = record.array_id is not None and record.array_id not in scheduler.guard_open
    return (
        not ((marks := scheduler.lives.peek(record.id)) and marks.no_handoff)  # it preempts instead (``preempting``)
        and spec.gpus == len(job.record.gpus)
        and spec.mem_per_gpu is None
        and not spec.mem_auto
        and spec.mode is not Mode.TORCHRUN
        and spec.client is None
        and not throttled
        and not unproven
    )


def _fits(scheduler: SchedulerState, record: JobRecord, job: Running, views: dict[int, GpuView], now: float) -> bool:
    """Whether placement would put ``record`` on ``job``'s GPUs once ``job`` has left them (what others run
    there outside gpuq still counts)."""
    freed = [dataclasses.replace(views[i], used=views[i].external) for i in job.record.gpus if i in views]
    if len(freed) != len(job.record.gpus):
        return False
    spec = record.spec
    request = Request(
        record.id, spec.gpus, None, spec.time_limit, None, record.user, spec.priority, tuple(spec.value(GPU_IDS))
    )
    plan = place([request], freed, [], now, scheduler.policy, scheduler.source.distance, 0, {}, {})
    return bool(plan.decisions) and set(plan.decisions[0].gpus) == set(job.record.gpus)


def _stage(scheduler: SchedulerState, record: JobRecord, job: Running) -> None:
    gpus, uuids = job.record.gpus, job.record.gpu_uuids
    env = processes.job_env(record.spec, record.id, gpus, uuids, scheduler.state.root, record)
    env.update(processes.preemption_env(record.spec, scheduler.state.restarts_file(record.id)))
    launch = scheduler.shim_launch(record, gpus, env)
    staged = Staged(job.record.id, gpus, uuids)
    endings.unlink(launch.exit_file, launch.pid_file)  # an earlier attempt's
    _write(scheduler, record.id, staged)
    scheduler.lives.stage(record.id, staged)
    scheduler.on_rollback.append(functools.partial(endings.unlink, scheduler.state.next_file(record.id)))
    after = job.record.id

    def tell() -> None:
        scheduler.shims.stage(after, launch)  # a shim with no pipe left ends its job without starting this one

    scheduler.after_commit.append(tell)


def _review(scheduler: SchedulerState, head: JobRecord | None, views: dict[int, GpuView]) -> None:
    """Take back staged jobs that no longer come next on their GPUs: their GPUs are lost or drained, a job
    that ranks before them is ready, or enough GPUs are free now to start them elsewhere at once (the job
    ahead may run for hours; no GPU sits idle while work waits)."""
    busy = {gpu for job in scheduler.running.values() for gpu in job.record.gpus}
    free = sum(
        1 for v in views.values() if v.available and v.index not in busy and v.external < scheduler.policy.negligible
    )
    for job_id, staged in scheduler.staged.items():
        if staged.dropping:
            continue
        record = scheduler.pending.get(job_id)
        if (
            record is None
            or record.held
            or scheduler.paused_by is not None
            or staged.after in scheduler.stopped_for
            or any(gpu not in views or not views[gpu].available for gpu in staged.gpus)
            or (head is not None and _rank(head) < _rank(record))
            or free >= record.spec.gpus
        ):
            withdraw(scheduler, job_id)


def withdraw(scheduler: SchedulerState, job_id: int) -> None:
    """Take a staged job back (held, updated, outranked...): it stays pending, and placement sees it again once
    its shim has given it back (``settle``), or the job it followed has ended without starting it. A no-op
    for a job that is not staged."""
    staged = scheduler.staged.get(job_id)
    if staged is None or staged.dropping:
        return
    staged.dropping = True
    scheduler.shims.drop(staged.after, job_id)  # now, as a cancel is sent: the job ahead may be ending


def cancel(scheduler: SchedulerState, job_id: int, who: str) -> None:
    """Cancel a staged job: its shim drops it, or stops it if it has started; either way it ends cancelled
    once the job it followed has ended (``settle``)."""
    staged = scheduler.staged[job_id]
    staged.cancel_by = who
    _write(scheduler, job_id, staged)  # a restarted daemon must still end it as cancelled
    scheduler.shims.cancel(job_id, shim_of=staged.after)  # now, as a running job's cancel is sent


def settle(
    scheduler: SchedulerState,
    ended: dict[int, tuple[ExitFile | None, Launch]],
    written: set[str] | None,
    now: float,
    events: list[Event],
) -> None:
    """Jobs ended this pass (id -> their exit file, None if they left none, and their launch, which names their
    shim): each job staged behind one of them started (its exit file names it) or did not. Started, it runs
    under the same shim from the moment the first ended; if not, it is pending again, or cancelled if a
    cancel came while it was staged. A staged job its shim gave back (an exit file saying it was dropped;
    ``written``: the exit files in ``run/``) is pending again at once."""
    for job_id, staged in list(scheduler.staged.items()):
        back = staged.after not in ended and _given_back(scheduler, job_id, written)
        if staged.after not in ended and not back:
            continue
        scheduler.lives.unstage(job_id)
        exit_data, first = ended.get(staged.after, (None, None))
        started = exit_data is not None and first is not None and exit_data.next == job_id
        # Not started: a give-back's exit file goes too. Started, its exit file is its own (it may have ended).
        if not started:
            scheduler.after_commit.append(functools.partial(endings.unlink, scheduler.state.exit_file(job_id)))
        scheduler.after_commit.append(functools.partial(_forget_record, scheduler, job_id))
        record = scheduler.pending.get(job_id)
        if record is None:  # nothing ends a staged job but this: say so if something did
            log.error("job %d, staged behind job %d, was no longer pending when that one ended", job_id, staged.after)
            continue
        if started:
            assert exit_data is not None and first is not None
            _started(scheduler, record, staged, first, exit_data.ended_at, events)
        elif staged.cancel_by:
            endings.finish_pending(scheduler, [(record, Outcome.cancelled(staged.cancel_by))], now, events)


def _given_back(scheduler: SchedulerState, job_id: int, written: set[str] | None) -> bool:
    """Whether the shim holding a staged job dropped it and said so in the job's exit file."""
    if written is not None and f"{job_id}.exit" not in written:
        return False
    try:
        exit_data = outcomes.read_exit(scheduler.state.exit_file(job_id))
    except BadExitFile as err:  # not a give-back: the job stays staged until the one ahead of it ends
        log.error("staged job %d's exit file is not one gpuq reads: %s", job_id, err)
        return False
    return exit_data is not None and exit_data.dropped


def _started(
    scheduler: SchedulerState,
    record: JobRecord,
    staged: Staged,
    first: Launch,
    started: float,
    events: list[Event],
) -> None:
    """``record`` started under the shim of the job it followed (``first``) when that one ended."""
    info = Launch(first.shim_pid, first.shim_start, scheduler.boot_id, None, cancel_by=staged.cancel_by)
    if record.held:
        scheduler.table.set_held([record.id], False)  # held too late: it had started
    scheduler.table.mark_running(record.id, staged.gpus, staged.uuids, started, info)
    if staged.cancel_by:
        scheduler.table.set_cancel_by(record.id, staged.cancel_by)
    running = record.replace(
        state=JobState.RUNNING, gpus=staged.gpus, gpu_uuids=staged.uuids, started_at=started, held=False
    )
    scheduler.lives.start(Running(running, info))
    if staged.cancel_by:  # its shim was told; a restarted daemon, with no pipe to that shim, signals it
        scheduler.stop(scheduler.running[record.id])
    events.append(Started(started, record.id, staged.gpus, staged.after))


def _forget_record(scheduler: SchedulerState, job_id: int) -> None:
    """Remove a settled job's ``.next`` once that is committed, unless this same pass staged it again (given
    back, then staged behind another job): that file is the new record."""
    if job_id not in scheduler.staged:
        endings.unlink(scheduler.state.next_file(job_id))


def _write(scheduler: SchedulerState, job_id: int, staged: Staged) -> None:
    body = {
        "after": staged.after,
        "gpus": list(staged.gpus),
        "uuids": list(staged.uuids),
        "cancel_by": staged.cancel_by,
    }
    # Not fsynced, like an exit file: a daemon crash keeps it, and a machine crash takes the shims with it.
    write_atomic(scheduler.state.next_file(job_id), json.dumps(body).encode(), durable=False)
