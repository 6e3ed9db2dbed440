"""Suspending a running job to host memory and resuming it (``gpuq suspend/resume``), beside the pass.

A suspend or resume is recorded as begun in the job table (``Step``) before its first act, then done by a
child process (``launcher.daemon.suspension.suspender``; ``forker``) that wakes the daemon's pass once its result is
written: a checkpoint of tens of gigabytes takes tens of seconds, and the queue goes on meanwhile. While it
suspends, a job still holds its GPUs; once suspended, it is out of ``scheduler.running`` (placement, the
watchdog and hand-offs see no job on its GPUs) and in ``scheduler.suspended``, whose exit files are still
read. A resume waits until its own GPUs are free again (the driver's restore onto another GPU is not
established: docs/suspend.md), takes them back into ``running`` at once, and restores.

Crash safety: both of the child's actions are idempotent, and the step is on disk. A daemon that finds a
suspend begun undoes it (runs a resume: the job never left its GPUs, which nobody took); one that finds a
resume begun finishes it (the job holds its GPUs again from the start). It first waits for the child an
earlier daemon left, named in the job's pause file, so two never act on one job at once.

The pause file (``run/<id>.paused``, ``suspension.pausefiles``) also tells the job's shim how long it was
suspended: its time limit does not run meanwhile (``shim.suspended_for``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.accounts import user_name
from gpuq_scheduler.jobs.model import JobRecord, Mode
from gpuq_scheduler.jobs.outcome import JobState, Step, in_host_memory
from gpuq_scheduler.jobs.store import spool
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.store.events import Asked, Event, Kind, Refused, Resumed, StepFailed, Suspended
from gpuq_scheduler.jobs.store.statedir import read_bytes
from gpuq_scheduler.launcher.daemon.lives import Acting, Running
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.daemon.suspension import inplace, pausefiles, pools
from gpuq_scheduler.launcher.daemon.suspension.forker import Forker
from gpuq_scheduler.launcher.daemon.suspension.hostmem import host_memory, margin, room
from gpuq_scheduler.launcher.daemon.suspension.pools import gpu_state
from gpuq_scheduler.launcher.daemon.suspension.suspender import Forks, freeze, start_helper
from gpuq_scheduler.launcher.gpus.fake import FakeGpus
from gpuq_scheduler.launcher.policy import hostroom
from gpuq_scheduler.launcher.policy.placement import Holding
from gpuq_scheduler.launcher.supervisor import processes
from gpuq_scheduler.launcher.supervisor.containment import Box

log = logging.getLogger("gpuq.suspend")

RETRY = 5.0  # seconds before a resume that failed (its GPU filled by someone outside gpuq, say) is tried again


def request(scheduler: SchedulerState, request: spool.ControlRequest, now: float, events: list[Event]) -> None:
    """``gpuq suspend`` or ``gpuq resume`` of the jobs named (an array id: its members in the state to act on)."""
    who = user_name(request.uid)
    pool = scheduler.running if request.action is Action.SUSPEND else scheduler.suspended
    named = [job for job_id in request.ids for job in _named(pool, job_id)]
    for job in named:
        record = job.record
        if not accounts.may_act(request.uid, record.uid, scheduler.admins, os.getuid()):
            log.warning("refused %s of job %d (owner %s) from %s", request.action, record.id, record.user, who)
            events.append(Refused(now, Kind.refused(request.action), who, record.id))
            continue
        marks = scheduler.lives.marks(record.id)
        if record.id in scheduler.acting or marks.resume_wanted is not None:
            continue  # already under way
        if request.action is Action.RESUME:
            marks.resume_wanted = who
            events.append(Asked(now, Kind.RESUME_REQUESTED, record.id, who))
            continue
        why = refusal(scheduler, job)
        if why:
            log.warning("refused suspend of job %d: %s", record.id, why)
            scheduler.table.set_reasons({record.id: f"not suspended: {why}"}, state=JobState.RUNNING)
            events.append(Refused(now, Kind.SUSPEND_REFUSED, who, record.id, why))
            continue
        _begin(scheduler, job, Step.SUSPENDING, Action.SUSPEND, who, now)
        events.append(Asked(now, Kind.SUSPENDING, record.id, who))


def _named(pool: Mapping[int, Running], job_id: int) -> list[Running]:
    if job_id in pool:
        return [pool[job_id]]
    return [job for job in pool.values() if job.record.array_id == job_id]


def refusal(scheduler: SchedulerState, job: Running) -> str:
    """Why this running job cannot be suspended now ("" if it can)."""
    job_id = job.record.id
    if job_id in scheduler.stopped_for:
        return "gpuq is stopping it"
    if why := inplace.refusal(scheduler, job):
        return why
    if any(staged.after == job_id for staged in scheduler.staged.values()):
        return "a job is staged to start on its GPUs when it ends; try again once that one started"
    if not job.record.gpus:
        return "it holds no GPU"
    if job.record.spec.mode is Mode.TORCHRUN:
        return "it runs a process per GPU under torchrun, whose NCCL state the driver's checkpoint does not cover"
    cuda = _cuda_processes(scheduler, job)
    if len(cuda) > 1 and any(processes.maps_library(pid, "libnccl") for pid in cuda):
        return "it runs several CUDA processes that use NCCL, whose state the driver's checkpoint does not cover"
    available, total = host_memory(isinstance(scheduler.source, FakeGpus))
    box = Box.from_json(subject(scheduler, job_id)["box"])
    left = room(box.cgroup if box is not None else None)  # its --ram: the copy is charged to its cgroup
    available += sum(pools.reclaimable(scheduler, {job_id}).values())  # given back for it if need be
    return hostroom.refusal(host_need(scheduler, job), 0, available, margin(total), left)


def host_need(scheduler: SchedulerState, job: Running) -> int:
    """Bytes of host memory the job's suspend would take: its GPU state, less the pinned host memory its
    processes kept from their last suspend (a pool, ``daemon.suspension.pools``), which the host's available memory
    already leaves out (``fastpath.pool_of``: never more than they hold resident)."""
    return max(0, gpu_state(scheduler, job) - pools.held(scheduler, job))


def _cuda_processes(scheduler: SchedulerState, job: Running) -> set[int]:
    """The job's processes that the last look at its GPUs found holding memory there."""
    return {
        pid
        for gpu in scheduler.last_snapshot
        if gpu.index in job.record.gpus
        for pid in (gpu.processes or {})
        if pid in job.pids
    }


def begin_suspend(scheduler: SchedulerState, job: Running, who: str, now: float) -> None:
    """Begin suspending a running job that ``refusal`` passed (for preemption: ``launcher.daemon.preempting``)."""
    _begin(scheduler, job, Step.SUSPENDING, Action.SUSPEND, who, now)


def _begin(scheduler: SchedulerState, job: Running, step: Step, action: Action, who: str, now: float) -> None:
    """Record the step; once that is committed, start its child (a daemon that dies before the commit leaves
    nothing done that its successor does not know of). The pause file names the child for a later daemon."""
    record = job.record
    if record.step is not step and not scheduler.table.mark_step(record.id, step):
        return
    job.record = record.replace(step=step)
    acting = Acting(step, who, action=action, began=now, bytes=gpu_state(scheduler, job))
    scheduler.lives.act(record.id, acting)
    order = {"action": action, "bytes": acting.bytes or 0, **subject(scheduler, record.id)}
    if action == "suspend":  # other jobs' pools given back where its copy needs the room: its helper waits
        need = host_need(scheduler, job)
        order["room_coming"] = pools.make_room(scheduler, {record.id}, need, now, scheduler.journal)
        order["keep_context"] = inplace.context_room(scheduler, job)  # what may stay on its GPUs, frozen
    else:  # whether its processes keep their pinned host memory afterwards, by the host's room now
        order["keep"] = pools.keep_after_resume(scheduler, job)

    def start() -> None:
        paused = pausefiles.read(scheduler.state, record.id)
        if step is Step.SUSPENDING and paused.get("since") is None:
            paused["since"] = time.monotonic()  # its time limit stops running now
        pausefiles.write(scheduler.state, record.id, paused)
        try:
            acting.child = start_helper(order, str(scheduler.state.inner_wake), forker(scheduler))
        except OSError as err:  # out of processes: undone (a suspend) or tried again (a resume), as after a failure
            log.warning("cannot start the %s of job %d: %s", action, record.id, err)
            acting.again, acting.retry_at = True, time.time() + RETRY
            return
        paused["child"] = [acting.child.pid, acting.child.started]
        pausefiles.write(scheduler.state, record.id, paused)

    scheduler.after_commit.append(start)
    # A pass that fails drops ``start``: then the step is undone (a suspend) or finished (a resume) as after
    # a restart, whether or not it was recorded.
    scheduler.on_rollback.append(lambda: setattr(acting, "again", True))


def forker(scheduler: SchedulerState) -> Forks | None:
    """The server that forks this daemon's helpers (``launcher.daemon.suspension.forker``), started with the daemon and
    again if it died; none for a daemon of one thread (the fake inventory's), which forks them itself."""
    found = scheduler.suspensions.forker
    if (found is None or not found.alive) and len(os.listdir("/proc/self/task")) > 1:
        with contextlib.suppress(OSError):  # none: each helper is a fresh interpreter
            found = scheduler.suspensions.forker = Forker()
    return found if found is not None and found.alive else None


def subject(scheduler: SchedulerState, job_id: int) -> dict[str, Any]:
    """The job's first process and containment (from its pid file), and which checkpoint to use."""
    try:
        info = json.loads(read_bytes(scheduler.state.pid_file(job_id)))
    except (OSError, ValueError):
        info = {}
    fake = isinstance(scheduler.source, FakeGpus)
    return {
        "leader": info.get("pid", -1),
        "box": info.get("box"),
        "fake": fake,
        "usage": os.environ.get("GPUQ_FAKE_USAGE") if fake else None,
        "fast_dir": fast if os.path.isdir(fast := scheduler.state.fast_dir(job_id)) else None,
    }


def recover(scheduler: SchedulerState) -> None:
    """At start-up: undo a suspend an earlier daemon began, finish a resume it began (see the module's doc)."""
    now = time.time()
    for job in list(scheduler.running.values()):
        if job.record.step is Step.SUSPENDING:
            acting = Acting(Step.SUSPENDING, "gpuq", left=_left(scheduler, job.record.id), again=True)
            scheduler.lives.act(job.record.id, acting)
    for job_id, job in list(scheduler.suspended.items()):
        if job.record.step is Step.RESUMING:
            scheduler.lives.resume(job_id)  # it holds its GPUs again
            resuming = Acting(Step.RESUMING, "gpuq", left=_left(scheduler, job_id), again=True)
            scheduler.lives.act(job_id, resuming)
    for acting in scheduler.acting.values():
        acting.began = now
    forker(scheduler)  # ready before the first suspend (NVML's thread runs by now, where it starts one)


def _left(scheduler: SchedulerState, job_id: int) -> tuple[int, float]:
    child = pausefiles.read(scheduler.state, job_id).get("child")
    if isinstance(child, list) and len(child) == 2:
        return int(child[0]), float(child[1])
    return -1, 0.0


def advance(scheduler: SchedulerState, now: float, events: list[Event], claims: Callable[[], list[Holding]]) -> None:
    """Once a pass: collect the children that finished, start the resumes whose GPUs are free (``claims``:
    placement's holdings, for a job suspended in place: ``inplace.fits``)."""
    for job_id, acting in list(scheduler.acting.items()):
        if acting.child is None and not acting.again:
            continue  # its child starts once this pass is committed
        if acting.child is None:  # recovered: run again once the earlier daemon's child is gone
            if (acting.left is not None and processes.is_alive(*acting.left)) or now < acting.retry_at:
                continue
            job = scheduler.running[job_id]  # a job with a helper acting holds its GPUs (``lives``)
            scheduler.lives.acted(job_id)
            if job_id not in scheduler.stopped_for:  # one being stopped needs no helper: it ends
                _begin(scheduler, job, acting.step, Action.RESUME, acting.by, now)
            continue
        result = acting.child.result()
        if result is None:
            continue
        _settle(scheduler, job_id, acting, result, now, events)
    _start_resumes(scheduler, now, events, claims)


def _settle(
    scheduler: SchedulerState,
    job_id: int,
    acting: Acting,
    result: dict[str, Any],
    now: float,
    events: list[Event],
) -> None:
    job = scheduler.running[job_id]  # a job with a helper acting holds its GPUs (``lives``)
    steps = {k: round(float(v), 3) for k, v in (result.get("steps") or {}).items()}
    helper = acting.child.times(result) if acting.child is not None else {}
    if acting.step is Step.SUSPENDING and acting.action is Action.SUSPEND and result.get("ok"):
        facts = dict(result.get("path") or {})  # the path it took, and why (daemon/suspension/fastpath.py)
        host_bytes = inplace.moved(facts) or acting.bytes
        scheduler.table.mark_suspended(job_id, host_bytes, now)
        record = job.record.replace(state=JobState.SUSPENDED, step=None, host_bytes=host_bytes, suspended_at=now)
        job.record = record
        scheduler.lives.suspend(job_id)
        events.append(Suspended.of(now, job_id, host_bytes, steps, helper, facts))
        marks = scheduler.lives.marks(job_id)
        if marks.preempted_by is not None and job_id in scheduler.suspended:  # it resumes by itself once its
            marks.resume_wanted = "gpuq"  # preemptor is not running
            preemptor, why = marks.preempted_by
            reason = f"suspended for job {preemptor} ({why}); {in_host_memory(host_bytes)}"
            scheduler.table.set_reasons({job_id: reason}, state=JobState.SUSPENDED)
            job.record = job.record.replace(reason=reason)
        return
    if acting.step is Step.RESUMING and result.get("ok"):
        scheduler.table.mark_resumed(job_id, now)
        scheduler.lives.acted(job_id)
        pausefiles.unpause(scheduler.state, job_id)
        marks = scheduler.lives.marks(job_id)
        marks.preempted_by = None
        marks.resumed_at = now  # preemption's minimum runtime counts from here
        spent = max(0.0, now - (job.record.suspended_at or now))
        job.record = job.record.replace(
            state=JobState.RUNNING,
            step=None,
            host_bytes=None,
            suspended_at=None,
            suspended_for=job.record.suspended_for + spent,
            reason="",
        )
        pool = int(result.get("pool") or 0)  # pinned host memory it kept for its next suspend (``pools``)
        events.append(Resumed(now, job_id, steps, helper, pool))
        return
    if not result.get("ok") and (acting.action is Action.RESUME or result.get("undone") is False):
        # A resume (or a suspend's undo) that failed: it stays on its GPUs, its step recorded, and the
        # resume is tried again next pass.
        log.warning("%s of job %d failed: %s", acting.step.value, job_id, result.get("why"))
        events.append(StepFailed(now, Kind.RESUME_FAILED, job_id, str(result.get("why"))))
        again = Acting(acting.step, acting.by, began=now, retry_at=now + RETRY, again=True)
        if job_id in scheduler.stopped_for:
            scheduler.lives.acted(job_id)  # being stopped: it ends, tried again never
        else:
            scheduler.lives.act(job_id, again)
        return
    if acting.step is Step.SUSPENDING:  # refused by the driver and undone, or undone after a restart
        scheduler.table.undo_step(job_id)
        scheduler.lives.acted(job_id)
        pausefiles.unpause(scheduler.state, job_id)
        job.record = job.record.replace(step=None)
        why = str(result.get("why") or "a daemon restarted in the middle of it")
        if acting.action is Action.SUSPEND:
            scheduler.table.set_reasons({job_id: f"not suspended: {why}"}, state=JobState.RUNNING)
        events.append(StepFailed(now, Kind.SUSPEND_UNDONE, job_id, why))


def _start_resumes(
    scheduler: SchedulerState, now: float, events: list[Event], claims: Callable[[], list[Holding]]
) -> None:
    """Resume the jobs asked for whose GPUs no running job holds (nor one starting on them); one suspended in
    place once its share fits again there."""
    wanted = [(job_id, marks) for job_id, marks in scheduler.lives.marked() if marks.resume_wanted is not None]
    if not wanted:
        return
    busy = {gpu for job in scheduler.running.values() for gpu in job.record.gpus}
    busy |= {gpu for staged in scheduler.staged.values() for gpu in staged.gpus}
    for job_id, marks in wanted:
        who = marks.resume_wanted or "gpuq"
        job = scheduler.suspended.get(job_id)
        if job is None:
            marks.resume_wanted = None
            continue
        preemptor = marks.preempted_by[0] if marks.preempted_by is not None else None
        if preemptor is not None and (preemptor in scheduler.running or preemptor in scheduler.lives.takings()):
            continue  # its place was kept: only its preemptor is on its memory
        if inplace.is_client(scheduler, job_id):
            wait = inplace.waits(scheduler, job, claims())
        else:
            wait = "GPU(s)" if preemptor is None and busy & set(job.record.gpus) else ""
        if wait:
            held = in_host_memory(job.record.host_bytes or 0)
            reason = f"{held}; waiting for {wait} {_listed(job.record)} to resume"
            if reason != job.record.reason:
                scheduler.table.set_reasons({job_id: reason}, state=JobState.SUSPENDED)
                job.record = job.record.replace(reason=reason)
            continue
        marks.resume_wanted = None
        if not scheduler.table.mark_step(job_id, Step.RESUMING):
            continue
        job.record = job.record.replace(step=Step.RESUMING)
        scheduler.lives.resume(job_id)  # its GPUs are its own again, from now
        busy |= set(job.record.gpus)
        _begin(scheduler, job, Step.RESUMING, Action.RESUME, who, now)
        events.append(Asked(now, Kind.RESUMING, job_id, who))


def wants_resumes(scheduler: SchedulerState) -> bool:
    """Whether a suspended job's resume was asked for (it waits for its GPUs)."""
    return any(marks.resume_wanted is not None for _, marks in scheduler.lives.marked())


def thaw(scheduler: SchedulerState, job_id: int) -> None:
    """Let a suspended job's processes run (to be cancelled: a frozen process cannot end on SIGTERM); its
    CUDA state stays in host memory, and a CUDA call it makes blocks until SIGKILL ends it."""
    found = subject(scheduler, job_id)
    with contextlib.suppress(OSError):
        freeze(Box.from_json(found["box"]), int(found["leader"]), False)


def _listed(record: JobRecord) -> str:
    return ",".join(map(str, record.gpus))
