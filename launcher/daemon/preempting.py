"""Automatic preemption, the daemon's side: a waiting job takes the GPUs of running preemptible jobs.

Which jobs, and whether at all, is ``launcher.policy.preemption`` (pure); here the daemon gathers what that
policy looks at, suspends the victims (``launcher.daemon.suspension.suspending``, as ``gpuq suspend`` does), starts the
waiting job on their GPUs once they are off them, and keeps their places:

* **One taking at a time.** ``decide`` looks at the first job in queue order that could not start (not one
  held back by its user's cap or its array's throttle) once a pass; while its victims are being suspended
  (its mark's ``taking``, ``launcher.daemon.lives``) nothing else is preempted.
* **The preemptor starts on its victims' GPUs** (``launch_ready``) as soon as every victim is off them
  (suspended, or ended), in the same pass, before placement looks: nothing else can take those GPUs first.
  If a victim's suspend fails or is undone, or the waiting job went (started elsewhere, cancelled), the
  taking is dropped, and the victims already suspended resume at once.
* **Room is kept** (``holdings``): the waiting job's on its victims' GPUs while they are being suspended, and
  each victim's while suspended: its GPU memory stays reserved for it against
  every later placement, so the only job ever on its memory is its preemptor. It resumes (``suspending``
  starts it) as soon as its preemptor is no longer running: before any later job could take its GPUs.
* **Hand-offs.** A waiting job staged to follow a running job (``launcher.daemon.handoff``) that may preempt
  is taken back first and never staged again: it starts on its victims' GPUs instead.
* **A preemptor is never a victim** while its own victims are suspended: they wait for it, not for a third.
* **Records.** Each victim's pause file (``run/<id>.paused``) names its preemptor and why, so a restarted
  daemon resumes it in turn; events.jsonl has a ``preempted`` event per victim; its reason says
  "suspended for job 12 (priority 10 > 0)".
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping

from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.config import Shared
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.options import GPU_IDS, RESERVATION
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.events import Preempted
from gpuq_scheduler.jobs.store.statedir import read_bytes
from gpuq_scheduler.jobs.units import parse_duration
from gpuq_scheduler.launcher.daemon import fences, handoff
from gpuq_scheduler.launcher.daemon.lives import Marks, Phase, Running, Taking
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.daemon.suspension import hostmem, pausefiles, pools, suspending
from gpuq_scheduler.launcher.daemon.watching import sight
from gpuq_scheduler.launcher.gpus.fake import FakeGpus
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot
from gpuq_scheduler.launcher.policy import fairshare, reserved
from gpuq_scheduler.launcher.policy.placement import GpuView, Holding, Request
from gpuq_scheduler.launcher.policy.preemption import Job, Settings, choose, why_preemptible
from gpuq_scheduler.launcher.supervisor import containment

log = logging.getLogger("gpuq.preempt")

BY = ("priority", "fair_share")


def settings(shared: Shared | None, environ: Mapping[str, str]) -> Settings:
    """A shared queue's ``[shared]`` preemption settings; a personal queue's GPUQ_PREEMPT (on/off, default
    off), GPUQ_PREEMPT_MIN_RUNTIME (default 10m), GPUQ_PREEMPT_BY (priority,fair_share) and
    GPUQ_PREEMPT_GRACE (default 60s)."""
    if shared is not None:
        return Settings(
            enabled=shared.preemption,
            min_runtime=shared.preemption_min_runtime,
            by_priority="priority" in shared.preemption_by,
            by_fair_share="fair_share" in shared.preemption_by,
            grace=shared.preemption_grace,
        )
    enabled = environ.get("GPUQ_PREEMPT", "off")
    if enabled not in ("on", "off"):
        raise BadInput(f"GPUQ_PREEMPT={enabled!r}: set it to on or off")
    min_runtime = parse_duration(environ.get("GPUQ_PREEMPT_MIN_RUNTIME", "10m"))
    by = [word for word in environ.get("GPUQ_PREEMPT_BY", "").split(",") if word]
    if any(word not in BY for word in by):
        raise BadInput(f"GPUQ_PREEMPT_BY={','.join(by)!r}: name priority and/or fair_share, comma-separated")
    grace = parse_duration(environ.get("GPUQ_PREEMPT_GRACE", "60s"))
    return Settings(enabled == "on", min_runtime, "priority" in by, "fair_share" in by, grace=grace)


def recover(scheduler: SchedulerState) -> None:
    """At start-up: a suspended job an earlier daemon preempted resumes once its preemptor is not running."""
    for job_id in scheduler.suspended:
        paused = pausefiles.read(scheduler.state, job_id)
        preemptor = paused.get("for")
        marks = scheduler.lives.marks(job_id)
        if isinstance(preemptor, int):
            marks.preempted_by = (preemptor, str(paused.get("why") or ""))
            marks.resume_wanted = marks.resume_wanted or "gpuq"
        times = paused.get("preemptions")
        if isinstance(times, int):
            marks.preemptions = times


def holdings(scheduler: SchedulerState) -> list[Holding]:
    """Placement's view of the places kept for preempted jobs, and of what a waiting job taking GPUs will hold
    there: reserved as if they ran (so nothing placed meanwhile fills the room it was chosen for)."""
    kept = []
    for job_id, marks in scheduler.lives.marked():
        job = scheduler.suspended.get(job_id)
        if job is not None and marks.preempted_by is not None:
            kept.append(Holding(job_id, job.record.gpus, job.record.spec.mem_per_gpu, None))
        record = scheduler.pending.get(job_id)
        if record is not None and marks.taking is not None:
            kept.append(Holding(job_id, marks.taking.gpus, record.spec.mem_per_gpu, None))
    return kept


def launch_ready(
    scheduler: SchedulerState, now: float, launch: Callable[[JobRecord, tuple[int, ...], tuple[str, ...], float], None]
) -> None:
    """Start each waiting job whose victims are all off its GPUs; drop a taking that can no longer be. End
    the requeued victims whose grace period is over."""
    _end_signalled(scheduler)
    lives = scheduler.lives
    for job_id, taking in scheduler.lives.takings().items():
        record = scheduler.pending.get(job_id)
        still = [v for v in taking.victims if v in scheduler.running]
        # Its suspend was refused or undone: a --preemptible job is requeued instead, any other stays.
        failed = [v for v in still if v not in scheduler.acting and v not in scheduler.stopped_for]
        for victim in [v for v in failed if scheduler.running[v].record.spec.preemptible and record is not None]:
            marks = lives.marks(victim)
            why = marks.preempted_by[1] if marks.preempted_by is not None else ""
            marks.preempted_by = None
            _requeue(scheduler, scheduler.running[victim], job_id, why, now)
            failed.remove(victim)
        if record is None or failed or any(gpu in scheduler.drained for gpu in taking.gpus):
            lives.take(job_id, None)
            for victim in failed:  # still running; one still suspending stays preempted: it resumes at once
                lives.marks(victim).preempted_by = None
                lives.marks(victim).unsuspendable = True
            log.info("job %d no longer takes the GPUs of %s", job_id, sorted(taking.victims))
            continue
        if still:
            continue
        lives.take(job_id, None)
        lives.due(job_id)
        launch(record, taking.gpus, taking.uuids, now)


def decide(scheduler: SchedulerState, now: float, snapshot: list[GpuSnapshot]) -> None:
    """Once a pass: may the first waiting job take running jobs' GPUs? If so, begin suspending them."""
    settings = scheduler.preemption.settings
    if not settings.enabled or not scheduler.pending or not scheduler.running or scheduler.lives.takings():
        return
    head = _head(scheduler)
    if head is None:
        return
    marked = scheduler.lives.marked()
    victims_of = {marks.preempted_by[0] for _, marks in marked if marks.preempted_by is not None}
    unsuspendable = {job_id for job_id, marks in marked if marks.unsuspendable}
    staged_before = {staged.after for job_id, staged in scheduler.staged.items() if job_id != head.id}
    over = _fair_share(scheduler, now, settings.by_fair_share)
    waiting = Job(
        head.id,
        head.spec.gpus,
        head.spec.mem_per_gpu,
        head.user,
        head.spec.priority,
        _user_priority(scheduler, head.user),
        head.spec.preemptible,
        head.user in over,
    )
    candidates: list[Job] = []
    holdings_now = holdings(scheduler) + fences.holdings(scheduler)
    for job_id, job in scheduler.running.items():
        if (
            job_id in scheduler.acting
            or job_id in victims_of
            or job_id in staged_before
            or not job.record.gpus
            or job_id in scheduler.stopped_for
        ):
            holdings_now.append(_holding(job.record))
            continue
        candidate = _job(scheduler, job, now, over, False)
        if not why_preemptible(waiting, candidate, settings):  # the common case: no look at the host
            holdings_now.append(_holding(job.record))
            continue
        # One that cannot be suspended is requeued instead, if it said it can take that (--preemptible).
        requeue = job_id in unsuspendable or bool(suspending.refusal(scheduler, job))
        if requeue and not job.record.spec.preemptible:
            holdings_now.append(_holding(job.record))
            continue
        candidates.append(dataclasses.replace(candidate, requeue=requeue))
    if not candidates:
        return
    views = sight.views(scheduler, snapshot)
    pinned = head.spec.value(GPU_IDS)
    if pinned:  # --gpu-ids: only the jobs on the GPUs it named may make room for it
        views = [view for view in views if view.index in pinned]
    views = _unreserved(scheduler, head, views, now)
    choice = choose(waiting, views, holdings_now, candidates, now, settings, scheduler.policy)
    if choice is None:
        return
    if head.id in scheduler.staged:  # handed to the shim of a job it would follow: taken back first (then
        # never staged again), it preempts once given back. After the commit: it may have been staged in this
        # very pass, and its shim must hear of it before the drop.
        scheduler.after_commit.append(lambda: handoff.withdraw(scheduler, head.id))
        scheduler.lives.marks(head.id).no_handoff = True  # only rules a hand-off out: placement need not look
        return
    requeued = {c.job_id for c in candidates if c.requeue}
    suspended = [c.job_id for c in candidates if c.job_id in choice.victims and not c.requeue]
    moved = sum(suspending.host_need(scheduler, scheduler.running[job_id]) for job_id in suspended)
    available, total = hostmem.host_memory(isinstance(scheduler.source, FakeGpus))
    available += sum(pools.reclaimable(scheduler, set(suspended)).values())  # given back for them if need be
    if moved + hostmem.margin(total) > available:
        return  # all of them at once would not fit in host memory with the margin
    pools.make_room(scheduler, set(suspended), moved, now, scheduler.journal)  # for all of them at once
    uuids = {gpu.index: gpu.uuid for gpu in snapshot}
    taking = Taking(set(choice.victims), choice.gpus, tuple(uuids[i] for i in choice.gpus))
    scheduler.lives.take(head.id, taking)
    for victim in choice.victims:
        why = choice.why[victim]
        if victim in requeued:
            _requeue(scheduler, scheduler.running[victim], head.id, why, now)
            continue
        marks = scheduler.lives.marks(victim)
        marks.preempted_by = (head.id, why)
        marks.preemptions += 1
        pausefiles.note_preemption(scheduler.state, victim, head.id, why, marks.preemptions)
        suspending.begin_suspend(scheduler, scheduler.running[victim], f"job {head.id}", now)
        scheduler.journal.append(Preempted(now, victim, why, preemptor=head.id))
        log.info("suspending job %d for job %d (%s)", victim, head.id, why)

    def undo() -> None:  # the pass failed: none of it was recorded (a suspend begun is undone as after a restart)
        for victim in [v for v in choice.victims if v in scheduler.lives]:
            scheduler.lives.marks(victim).preempted_by = None
        if head.id in scheduler.lives:
            scheduler.lives.take(head.id, None)

    scheduler.on_rollback.append(undo)


def _unreserved(scheduler: SchedulerState, head: JobRecord, views: list[GpuView], now: float) -> list[GpuView]:
    """The GPUs a reservation lets the head use (``launcher.policy.reserved``): it takes no others' jobs."""
    booked = scheduler.booked.calendar.reservations
    name, preemptible = str(head.spec.value(RESERVATION) or ""), head.spec.preemptible
    request = Request(head.id, head.spec.gpus, head.spec.mem_per_gpu, head.spec.time_limit, user=head.user)
    allowed, _, _ = reserved.fence(
        [request], booked, now, [v.index for v in views], lambda _: name, lambda _: preemptible
    )
    only = set(allowed[0].only or [v.index for v in views]) if allowed else set()
    return [view for view in views if view.index in only]


def reason(scheduler: SchedulerState, job_id: int) -> str:
    """A taking's waiting job's reason: whose GPUs it takes."""
    taking = scheduler.lives.marks(job_id).taking
    assert taking is not None  # placement asks only of the jobs taking GPUs
    return f"taking the GPUs of job(s) {', '.join(map(str, sorted(taking.victims)))}, suspending them"


def _head(scheduler: SchedulerState) -> JobRecord | None:
    """The first job in the last plan's order still waiting for GPUs (not for its cap or throttle)."""
    cap = scheduler.shared.max_gpus_per_user if scheduler.shared else None
    held: dict[str, int] = {}
    in_array: dict[int, int] = {}
    for job in scheduler.running.values():
        held[job.record.user] = held.get(job.record.user, 0) + len(job.record.gpus)
        if job.record.array_id is not None:
            in_array[job.record.array_id] = in_array.get(job.record.array_id, 0) + 1
    if any(staged.dropping for staged in scheduler.staged.values()):
        return None  # being taken back from a hand-off: it comes first once given back
    # Staged jobs are out of placement, and come first in queue order (launcher.daemon.handoff).
    staged = sorted((scheduler.pending[i] for i in scheduler.staged if i in scheduler.pending), key=_rank)
    for record in [*staged, *(scheduler.pending.get(request.job_id) for request in scheduler.plan_order)]:
        if record is None or not record.spec.gpus or record.id in scheduler.fence_waits:
            continue
        if cap is not None and held.get(record.user, 0) + record.spec.gpus > cap:
            continue
        info = scheduler.arrays.get(record.array_id) if record.array_id is not None else None
        if info is not None and info.throttle and in_array.get(info.id, 0) >= info.throttle:
            continue
        return record
    return None


def _requeue(scheduler: SchedulerState, job: Running, preemptor: int | str, why: str, now: float) -> None:
    """The fallback where a job cannot be suspended: its signal now (SIGUSR1, or its --preempt-signal), then,
    after the grace period, the usual stop (SIGTERM, SIGKILL); however it ends, it is requeued, not counted
    against its retries, and told GPUQ_PREEMPTED=1 and GPUQ_RESTART_COUNT when it runs again. ``preemptor``: a
    job's id, or a reservation's name (``launcher.daemon.reserving``)."""
    record = job.record
    cannot = suspending.refusal(scheduler, job) or "its suspend failed"
    if isinstance(preemptor, str):
        words = f"reservation {preemptor}"
        outcome = Outcome(JobState.FAILED, Cause.PREEMPTED, reason=f"preempted for {words} ({why})")
    else:
        words, outcome = f"job {preemptor}", Outcome.preempted(preemptor, why)
    scheduler.lives.stop(record.id, outcome)  # its stop comes once its grace is over (``_end_signalled``)
    marks = scheduler.lives.marks(record.id)
    marks.signalled_until = time.monotonic() + scheduler.preemption.settings.grace
    marks.preemptions += 1
    scheduler.table.set_reasons(
        {record.id: f"requeued for {words} ({why}); it cannot be suspended: {cannot}"}, state=JobState.RUNNING
    )
    found = suspending.subject(scheduler, record.id)
    signum = getattr(signal, "SIG" + (record.spec.preempt_signal or "USR1"))
    path = scheduler.state.restarts_file(record.id)

    def tell() -> None:  # once recorded: a pass rolled back signals nobody
        with contextlib.suppress(OSError, ValueError):
            count = int(read_bytes(path).decode().strip() or 0) if os.path.exists(path) else 0
            write_atomic(path, f"{count + 1}\n".encode(), durable=False)
        with contextlib.suppress(OSError):
            containment.signal_all(containment.Box.from_json(found["box"]), int(found["leader"]), signum)

    scheduler.after_commit.append(tell)

    def undo() -> None:  # the pass failed: it was not signalled, and is not being requeued
        if scheduler.lives.phase(record.id) is Phase.ENDING:
            scheduler.lives.unstop(record.id)
            scheduler.lives.marks(record.id).signalled_until = None

    scheduler.on_rollback.append(undo)
    for_job, for_reservation = (None, preemptor) if isinstance(preemptor, str) else (preemptor, None)
    preempted = Preempted(now, record.id, why, preemptor=for_job, reservation=for_reservation, requeue=cannot)
    scheduler.journal.append(preempted)
    log.info("requeueing job %d for %s (%s): %s", record.id, words, why, cannot)


def _end_signalled(scheduler: SchedulerState) -> None:
    """Stop the signalled victims whose grace period is over (a job that ended by itself meanwhile is gone)."""
    now = time.monotonic()
    for job_id, marks in scheduler.lives.marked():
        job = scheduler.running.get(job_id)
        if job is not None and marks.signalled_until is not None and now >= marks.signalled_until:
            marks.signalled_until = None
            scheduler.stop(job)


def _rank(record: JobRecord) -> tuple[int, int]:
    return -record.spec.priority, record.id


def _job(scheduler: SchedulerState, job: Running, now: float, over: set[str], requeue: bool) -> Job:
    record = job.record
    marks = scheduler.lives.peek(record.id) or Marks()
    started = max(record.started_at or now, marks.resumed_at or 0.0)
    return Job(
        record.id,
        record.gpus,
        record.spec.mem_per_gpu,
        record.user,
        record.spec.priority,
        _user_priority(scheduler, record.user),
        record.spec.preemptible,
        record.user in over,
        ran=now - started,
        held=pools.gpu_state(scheduler, job),
        preemptions=marks.preemptions,
        ends_by=_ends_by(record),
        requeue=requeue,
    )


def _holding(record: JobRecord) -> Holding:
    return Holding(record.id, record.gpus, record.spec.mem_per_gpu, _ends_by(record))


def _ends_by(record: JobRecord) -> float | None:
    limit, started = record.spec.time_limit, record.started_at
    return None if limit is None or started is None else started + limit + record.suspended_for


def _user_priority(scheduler: SchedulerState, user: str) -> int:
    return scheduler.shared.priority.get(user, 0) if scheduler.shared else 0


def _fair_share(scheduler: SchedulerState, now: float, wanted: bool) -> set[str]:
    """The users whose recent GPU use is over an equal share of it among those with jobs here."""
    if not wanted or scheduler.usage is None:
        return set()
    runs = [(j.record.user, len(j.record.gpus), j.record.started_at or now) for j in scheduler.running.values()]
    used = fairshare.recent_use(scheduler.usage, runs, now)
    users = {r.user for r in scheduler.pending.values()} | {user for user, _, _ in runs}
    share = sum(used.get(user, 0.0) for user in users) / max(len(users), 1)
    return {user for user in users if used.get(user, 0.0) > share}


requeue = _requeue  # for reservations' victims that cannot be suspended (``launcher.daemon.reserving``)
