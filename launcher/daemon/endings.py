"""What follows a job's ending: record it, retry it, requeue an interrupted launch, deal with an
orphaned job, hold an array that fails fast, and run --notify commands.

Functions over the scheduler's state (like ``launcher.daemon.requests``), so the scheduler stays a table of
contents; the rules themselves are pure functions in ``launcher.policy.lifecycle``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store.events import Again, ArrayHeld, Ended, Event, Kind
from gpuq_scheduler.jobs.store.statedir import read_bytes
from gpuq_scheduler.launcher.daemon import fences, learning
from gpuq_scheduler.launcher.daemon.lives import Running
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.daemon.suspension import fastpath
from gpuq_scheduler.launcher.policy import lifecycle
from gpuq_scheduler.launcher.supervisor import containment, joblog, processes

log = logging.getLogger("gpuq.endings")


def finish(scheduler: SchedulerState, record: JobRecord, outcome: Outcome, ended: float, events: list[Event]) -> None:
    """Record how a job ended, then what follows: a retry, an array held, a notification."""
    ran = record.id in scheduler.running
    if ran:
        scheduler.charge(record, ended)
        learning.ended(scheduler.mem_auto, scheduler.table, scheduler.lives, record, outcome)
        fences.ended(scheduler, record.id)
        said = stopped_line(record.id, outcome, ended)
        if said is not None and record.log:  # after the commit: a crash before it reads the exit file again
            scheduler.after_commit.append(lambda: joblog.append_line(record.log, said))
    events.append(
        Ended(
            ended,
            Kind(outcome.state.value),
            record.id,
            outcome.recorded_reason(),
            outcome.cause,
            outcome.exit_code,
            outcome.signal,
            record.attempt,
            outcome.culprit,
        )
    )
    if ran and outcome.cause.not_its_fault:
        _requeue_victim(scheduler, record, outcome, ended, events)
        return
    biggest = max((g.total for g in scheduler.last_snapshot), default=None)
    again = lifecycle.retry(record, outcome, backoff=scheduler.retry_backoff, biggest_gpu=biggest) if ran else None
    if again is not None:
        scheduler.table.finish(record.id, outcome, ended)  # the attempt's outcome, then back in the queue
        scheduler.table.update_spec(record.id, again.spec)
        _queue_again(
            scheduler,
            record.id,
            again.reason,
            _run_files(scheduler, record.id),
            attempt=record.attempt + 1,
            not_before=ended + again.delay,
        )
        events.append(Again(ended, Kind.RETRY, record.id, again.reason))
        return
    scheduler.table.finish(record.id, outcome, ended)
    _ended(scheduler, record, outcome)


_STOPPED_BY_GPUQ = frozenset((Cause.OOM_PAST_SHARE, Cause.WATCHDOG, Cause.GPU_LOST))  # besides cancels and limits


def stopped_line(job_id: int, outcome: Outcome, ended: float) -> str | None:
    """The line for the end of a job's log when gpuq stopped it (a cancel, its time limit, a lost GPU) or its
    fence did, as Slurm writes one: "gpuq: job 7 cancelled by alice at 12:03:04". None when it ended itself."""
    at = time.strftime("%H:%M:%S", time.localtime(ended))
    rest = f"; {outcome.ended_with()}" if outcome.outlived else ""
    if outcome.state is JobState.CANCELLED:
        return f"gpuq: job {job_id} {outcome.reason} at {at}{rest}"
    if outcome.state in (JobState.TIMEOUT, JobState.LOST) or outcome.cause in _STOPPED_BY_GPUQ:
        return f"gpuq: job {job_id} stopped at {at}: {outcome.reason}{rest}"
    return None


def _requeue_victim(
    scheduler: SchedulerState, record: JobRecord, outcome: Outcome, ended: float, events: list[Event]
) -> None:
    """Another job took its memory, or preempted it: it runs again as the same attempt (its retries are its own
    to spend), after ``lifecycle.requeue_delay``, keeping the cause and culprit of the run it lost for `gpuq show`."""
    reason = f"queued again, not counted against its retries: {outcome.recorded_reason()}"
    delay = lifecycle.requeue_delay(outcome.cause, scheduler.retry_backoff)
    _queue_again(
        scheduler,
        record.id,
        reason,
        _run_files(scheduler, record.id),
        not_before=ended + delay if delay else None,
        outcome=outcome,
    )
    events.append(Again(ended, Kind.REQUEUED, record.id, reason, outcome.culprit))


def finish_pending(
    scheduler: SchedulerState, endings: list[tuple[JobRecord, Outcome]], now: float, events: list[Event]
) -> None:
    """End many jobs that never started (a cancelled array, say) in one transaction: no retries apply."""
    scheduler.table.finish_many([(record.id, outcome, now) for record, outcome in endings])
    for record, outcome in endings:
        ending = Ended(now, Kind(outcome.state.value), record.id, outcome.recorded_reason(), outcome.cause)
        events.append(ending)
        _ended(scheduler, record, outcome)


def _ended(scheduler: SchedulerState, record: JobRecord, outcome: Outcome) -> None:
    """What follows a recorded ending: forget the job, notify, and look at its array (once per tick)."""
    scheduler.forget(record.id)
    _clean_run_files(scheduler, record.id)
    if record.array_id is not None:
        scheduler.touched_arrays[record.array_id] = scheduler.touched_arrays.get(record.array_id, False) or (
            outcome.state in (JobState.FAILED, JobState.TIMEOUT, JobState.LOST)
        )
    elif record.spec.notify:
        _notify(
            scheduler,
            record.spec.notify,
            record.id,
            {
                "GPUQ_JOB_ID": str(record.id),
                "GPUQ_JOB_NAME": record.spec.display_name,
                "GPUQ_STATE": outcome.state.value,
                "GPUQ_EXIT_CODE": _text(outcome.exit_code),
                "GPUQ_SIGNAL": _text(outcome.signal),
                "GPUQ_REASON": outcome.recorded_reason(),
            },
            record,
        )
    if record.array_id is None and scheduler.private is not None:
        scheduler.private.forget(record.id)  # its private part, cached while it could run (and notify)


def follow_up_arrays(scheduler: SchedulerState, now: float) -> None:
    """For each array a member of which ended this tick: hold it if it fails fast, notify when done. An
    array whose members waited for the guard past the time its running members could still fail fast
    starts its next wave."""
    events: list[Event] = []
    touched, scheduler.touched_arrays = scheduler.touched_arrays, {}
    for array_id, failed in touched.items():
        _array_member_ended(scheduler, array_id, failed, now, events)
    for array_id, (_, until) in list(scheduler.guard_waits.items()):
        if now >= until:
            del scheduler.guard_waits[array_id]
    scheduler.journal.extend(events)


def judge_arrays(scheduler: SchedulerState, array_ids: list[int], now: float) -> None:
    """The fail-fast guard's word on these arrays (``lifecycle.guard``), as the daemon starts: whether their
    pending members wait for it, and whether they may be handed off."""
    for array_id in array_ids:
        _judge(scheduler, array_id, scheduler.table.members(array_id), now)


def _judge(scheduler: SchedulerState, array_id: int, members: list[JobRecord], now: float) -> lifecycle.Guard:
    verdict = lifecycle.guard(members)
    scheduler.guard_waits.pop(array_id, None)
    if isinstance(verdict, lifecycle.Undecided):
        scheduler.guard_open.discard(array_id)
        if verdict.wait is not None and now < verdict.until:
            scheduler.guard_waits[array_id] = (verdict.wait, verdict.until)
    else:
        scheduler.guard_open.add(array_id)
    return verdict


def _run_files(scheduler: SchedulerState, job_id: int) -> tuple[str, str]:
    return scheduler.state.exit_file(job_id), scheduler.state.pid_file(job_id)


def _clean_run_files(scheduler: SchedulerState, job_id: int) -> None:
    """Remove the shim's files once the outcome they carry is committed (a crash before that re-reads them)."""
    paths = (*_run_files(scheduler, job_id), scheduler.state.pause_file(job_id), scheduler.state.restarts_file(job_id))
    fast = scheduler.state.fast_dir(job_id)
    scheduler.after_commit.append(lambda: unlink(*paths))
    scheduler.after_commit.append(lambda: fastpath.remove(fast))


def _queue_again(
    scheduler: SchedulerState,
    job_id: int,
    reason: str,
    run_files: tuple[str, ...],
    *,
    attempt: int | None = None,
    not_before: float | None = None,
    outcome: Outcome | None = None,
) -> None:
    """Put a job that was running (or launching) back in the queue: in the table (``JobTable.requeue`` says
    what each argument keeps), in the daemon's view, and its ``run_files`` gone once that is committed."""
    scheduler.table.requeue(job_id, reason, attempt=attempt, not_before=not_before, outcome=outcome)
    fast = scheduler.state.fast_dir(job_id)  # the next run gets its own (``fastpath.prepare``)
    scheduler.after_commit.append(lambda: unlink(*run_files))
    scheduler.after_commit.append(lambda: fastpath.remove(fast))
    full = scheduler.table.get(job_id, with_env=True)
    if full is not None:
        scheduler.lives.requeue(full, not_before)
    else:
        scheduler.lives.end(job_id)


def unlink(*paths: str | os.PathLike[str]) -> None:
    """Remove run files that may already be gone."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _array_member_ended(
    scheduler: SchedulerState, array_id: int, failed: bool, now: float, events: list[Event]
) -> None:
    info = scheduler.arrays.get(array_id)
    if info is None:
        return
    members = scheduler.table.members(array_id)
    verdict = _judge(scheduler, array_id, members, now)
    if failed and isinstance(verdict, lifecycle.Hold):  # a failure holds it (again, after a release)
        why = verdict.reason
        unheld = [m.id for m in members if m.state is JobState.PENDING and not m.held]
        if unheld:
            scheduler.table.set_held(unheld, True, why)
            for job_id in unheld:
                if job_id in scheduler.pending:
                    scheduler.lives.update(scheduler.pending[job_id].replace(held=True, reason=why))
            events.append(ArrayHeld(now, array_id, why))
            log.warning("array %d %s", array_id, why)
    done = all(m.state.finished for m in members)
    if info.notify and not info.notified and done:
        counts: dict[str, int] = {}
        for member in members:
            counts[member.state.value] = counts.get(member.state.value, 0) + 1
        state = "succeeded" if counts.get("succeeded", 0) == len(members) else "failed"
        _notify(
            scheduler,
            info.notify,
            array_id,
            {
                "GPUQ_ARRAY_ID": str(array_id),
                "GPUQ_JOB_NAME": info.name,
                "GPUQ_STATE": state,
                "GPUQ_ARRAY_COUNTS": " ".join(f"{k}={v}" for k, v in sorted(counts.items())),
            },
            members[0],
        )
        scheduler.table.set_notified(array_id)
    if done:  # nothing more can happen to it (ended jobs never start again); the table keeps it
        del scheduler.arrays[array_id]
        scheduler.guard_waits.pop(array_id, None)
        scheduler.guard_open.discard(array_id)
        if scheduler.private is not None:
            scheduler.private.forget(array_id)


def _notify(
    scheduler: SchedulerState,
    command: str,
    job_id: int,
    outcome: dict[str, str],
    job: JobRecord,
) -> None:
    """Run the submitter's --notify command (as the submitter) with the outcome in its environment and the
    job's cwd (an array's: its first member's); never waits on it."""
    full = scheduler.table.get(job.id, with_env=True) or job
    full_env, log_path = {**full.spec.env, **outcome}, scheduler.state.notify_log(job_id)
    account = accounts.account(job.uid) if scheduler.shared is not None else None

    def run() -> None:
        try:
            processes.notify(command, full_env, full.spec.cwd, log_path, account)
        except OSError as err:
            log.warning("--notify for %d could not start: %s", job_id, err)

    scheduler.after_commit.append(run)  # notify about an outcome only once it is recorded


def requeue(scheduler: SchedulerState, job: Running, reason: str, events: list[Event], now: float) -> None:
    fences.ended(scheduler, job.record.id)
    scheduler.shims.lost(job.record.id)  # still there only if its shim died: nothing to reuse
    # A new run: no time suspended yet (its pause file goes with its exit file).
    run_files = (scheduler.state.exit_file(job.record.id), scheduler.state.pause_file(job.record.id))
    _queue_again(scheduler, job.record.id, reason, run_files)
    events.append(Again(now, Kind.REQUEUED, job.record.id, reason))


def orphaned(scheduler: SchedulerState, job: Running, now: float, events: list[Event]) -> None:
    """The shim died without an exit file. Stop the job if it still runs; it can no longer be supervised."""
    try:
        info = json.loads(read_bytes(scheduler.state.pid_file(job.record.id)))
    except (OSError, ValueError):
        if job.launch.cancel_by:  # it was being cancelled: it never started, and must not start again
            finish(scheduler, job.record, Outcome.cancelled(job.launch.cancel_by), now, events)
        else:
            requeue(scheduler, job, "its launch was interrupted before it started; queued again", events, now)
        return
    pid = info.get("pid") if isinstance(info, dict) else None
    # Its cgroup (or marker) as the shim recorded it: where this job's processes are, whichever daemon
    # or containment started it.
    box = containment.Box.from_json(info.get("box")) if isinstance(info, dict) else None
    if isinstance(pid, int) and processes.is_alive(pid, info.get("start")):
        if box is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, 9)
        reason = "its gpuq supervisor was killed; the job was stopped"
    else:
        reason = "its gpuq supervisor was killed; the job's exit status is unknown"
    if isinstance(pid, int) and box is not None:
        ended = containment.end(box, pid).get("outlived")  # its first process too, if it still ran
        if isinstance(ended, int) and ended:
            reason += f"; {ended} of its processes were still there and were ended"
    finish(scheduler, job.record, Outcome.lost(reason), now, events)


def _text(value: int | None) -> str:
    return "" if value is None else str(value)
