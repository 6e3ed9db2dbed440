# One module past 400 lines on purpose: the tick and its steps read as one table of contents.
"""The daemon's loop as named steps. ``tick(now)`` reads like a table of contents:

    reap -> ingest -> reconcile -> follow up arrays -> place and launch -> sample -> (the go) -> watch

Requests (cancel, hold, drain...) are applied in ``launcher.daemon.requests``; the rules for dependencies,
retries and fail-fast holds are pure functions in ``launcher.policy.lifecycle``.

The job table on disk is the truth; the scheduler keeps the active jobs in memory because it is the
table's only writer, so a pass over 10,000 pending jobs reads nothing from disk.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.model import JobRecord, Launch
from gpuq_scheduler.jobs.options import GPU_IDS
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store import journal, spool
from gpuq_scheduler.jobs.store.events import Started
from gpuq_scheduler.jobs.store.private import is_public
from gpuq_scheduler.launcher.daemon import (
    endings,
    fences,
    handoff,
    intake,
    isolation,
    learning,
    outcomes,
    outsiders,
    preempting,
    readiness,
    reserving,
)
from gpuq_scheduler.launcher.daemon.clients import withdraw_gone, withdrawn
from gpuq_scheduler.launcher.daemon.lives import Running
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.daemon.suspension import fastpath, pools, suspending
from gpuq_scheduler.launcher.daemon.watching import sight
from gpuq_scheduler.launcher.daemon.watching.watchdog import Watch
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot
from gpuq_scheduler.launcher.policy import fairshare
from gpuq_scheduler.launcher.policy.placement import Holding, Plan, Request, place
from gpuq_scheduler.launcher.supervisor import processes
from gpuq_scheduler.launcher.supervisor.exits import BadExitFile, ExitFile

log = logging.getLogger("gpuq.scheduler")
T = TypeVar("T")

SPARES = 8  # at most this many idle shims
LIVENESS_EVERY = 2.0  # seconds between checks that shims are still alive (a shim killed -9 writes no exit file)


class Scheduler(SchedulerState):
    """The daemon's loop over a :class:`SchedulerState`: ``tick`` runs the steps in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        endings.judge_arrays(self, list(self.arrays), time.time())
        handoff.load(self)  # jobs an earlier daemon staged behind running ones: not placed until those end
        fences.adopt(self)  # before anything starts: MPS control daemons an earlier daemon left behind
        suspending.recover(self)  # a suspend an earlier daemon began is undone, a resume finished
        preempting.recover(self)  # a job an earlier daemon preempted resumes once its preemptor is not running
        reserving.recover(self)  # a job suspended for a reservation resumes once it is over
        # The fast directories of jobs that ended while no daemon ran (or before one removed them); a
        # suspended job's stays, since its resume asks its processes through it.
        fastpath.sweep(os.path.dirname(self.state.fast_dir(0)), set(self.running) | set(self.suspended))
        # The GPU watchdog (daemon/watching/watchdog.py), with its defaults until serve() gives it the settings.
        self.watch = Watch.of(self.state.root, self.policy.overhead)
        self.fenced_off: set[int] = set()  # pending jobs a reservation keeps off some GPUs (plan)
        self.outsiders: outsiders.Outsiders | None = None  # memory held outside gpuq (serve() sets it up)

    def close(self) -> None:
        fences.close(self)
        super().close()

    def tick(self, now: float) -> None:
        """One pass: everything the daemon does happens here, in this order.

        Ingest commits on its own (its spool files go only once their jobs are on disk). Placement and the
        launches are one transaction; what must follow the commit (a shim's go, removing an exit file, a
        notification) waits in ``after_commit``, so a crash before the commit repeats nothing and loses
        nothing, and a job ending and the next one starting cost one fsync between them. What only watches
        the running jobs (the watchdog, their GPU energy, idle GPUs) comes once those placed were told to go,
        in a transaction of its own: it may read what NVML is slow to answer (``sight.Readings``).
        """
        self.reap()
        self.ingest(now)
        self.write_journal()  # ingest committed on its own
        snapshot = self._transaction(lambda: self._place(now))
        self.forget_ingested()
        if self._watch_due(now):
            readings = sight.Readings(self.source, snapshot)
            self._transaction(lambda: self._watch(now, readings))

    def _place(self, now: float) -> list[GpuSnapshot]:
        self.reconcile(now)
        reserving.step(self, now)  # before suspends advance: a reservation over lets its victims resume first
        suspending.advance(self, now, self.journal, self.holdings)
        reserving.label(self, now)  # a job just suspended for a reservation says so
        endings.follow_up_arrays(self, now)  # before placement: a failing array must start no more
        snapshot = self.snapshot()
        sight.stop_on_lost_gpus(self, now, snapshot)
        withdraw_gone(self, now)
        self.launch_fenced(now)
        preempting.launch_ready(self, now, self._launch)  # before placement: the victims' GPUs are theirs
        self.place_and_launch(now, snapshot)
        preempting.decide(self, now, snapshot)
        sight.sample(self, now, snapshot)
        pools.tend(self, now, self.journal)  # pools the host can no longer afford are given back
        outsiders.look(self.outsiders, self.lives, self.state, now, snapshot)  # memory held outside gpuq, named
        return snapshot

    def _watch_due(self, now: float) -> bool:
        """Whether a step of ``_watch`` may act in this pass (each still keeps its own time): no transaction is
        opened for none."""
        checks = [self.watch.next_at, self.monitor.next_idle_check]
        if self.monitor.idle_report is not None:
            checks.append(self.monitor.next_batch_check)
        return now >= min(checks)

    def _watch(self, now: float, readings: sight.Readings) -> None:
        self.watch.check(self, now, readings)
        sight.release_idle(self, now, readings)
        sight.report_idle_batch(self, now, readings)

    def _transaction(self, steps: Callable[[], T]) -> T:
        """``steps`` in one transaction of the table; then what waits for its commit (``after_commit``)."""
        try:
            with self.table.batch():
                done = steps()
        except BaseException:
            for undo in self.on_rollback:
                undo()
            self.on_rollback, self.after_commit, self.journal = [], [], []  # none of it happened
            self.reload()
            raise
        then, self.after_commit, self.on_rollback = self.after_commit, [], []
        for action in then:
            action()
        self.write_journal()
        return done

    def write_journal(self) -> None:
        journal.append(self.state.events, self.journal)
        self.journal = []

    def forget_ingested(self) -> None:
        """Once the jobs ingested are on disk, their requests go. A crash before: the next daemon reads them
        again and finds their ids taken by the same requests (a no-op); a power cut: they are ingested anew."""
        if self.ingested:
            self.table.sync()
            intake.answer(self, self.ingested)  # a shared queue's clients learn their ids once they are on disk
            for request in self.ingested:
                spool.remove(request)
            self.ingested = []

    def reload(self) -> None:
        """Forget what this tick did in memory and read the active jobs back from the table."""
        acting = dict(self.acting)  # the helpers under way: the table knows only their steps
        self.load_lives()
        for job_id, helper in acting.items():
            if job_id in self.suspended:  # resuming: it holds its GPUs
                self.lives.resume(job_id)
            if job_id in self.running:
                self.lives.act(job_id, helper)
        self.not_before = self.table.not_before()
        self.arrays = self.table.arrays(active_only=True)
        self.guard_waits, self.guard_open = {}, set()
        endings.judge_arrays(self, list(self.arrays), time.time())
        handoff.load(self)

    def wants_spares(self) -> bool:
        return not self._spares_wanted() <= self.shims.idle <= self._spares_kept()

    def fork_spares(self) -> None:
        """Fork idle shims so that the next launches need no fork: one per GPU while work waits, one once
        nothing waits (the next submit to an idle queue then starts without a fork of the daemon). Shims
        whose jobs ended stay, up to one per GPU besides that one: a reused shim starts its next job sooner
        than a fresh one, and jobs that come one at a time then fork none. Each holds about 5 MB of memory of
        its own (the rest it shares with the daemon; 2-core VM, 2026-11-27)."""
        self.shims.keep(self._spares_wanted(), self._spares_kept())

    def _spares_wanted(self) -> int:
        return min(max(len(self.pending), 1), max(len(self.last_snapshot), 1), SPARES)

    def _spares_kept(self) -> int:
        return min(max(len(self.last_snapshot), 1) + 1, SPARES)

    def next_wakeup(self, now: float) -> float:
        """Seconds to sleep when nothing wakes us: soon while jobs wait on memory that may free up."""
        if self.spool_left:
            return 0.0  # a flood of one user's requests, read a part a pass: the next part at once
        if self.controls is not None and self.controls.busy:
            return 0.1  # a control daemon starts or quits beside the pass: collect it soon
        if self.acting or self.suspensions.resume_wanted:
            return 0.1  # a suspend or resume runs beside the pass, or waits for its GPUs
        soonest = max(0.0, reserving.next_change(self, now) - now)  # a reservation starts or ends then
        if self.pending:
            return min(0.5, soonest)
        if self.running:
            return max(0.05, min(self._next_liveness, self.monitor.next_sample, self.monitor.next_idle_check) - now)
        return min(5.0, soonest)

    # -- steps ----------------------------------------------------------------------------------------

    def reap(self) -> None:
        """Collect exited shims (our children) so they do not linger as zombies; an MPS control command
        reaped here has its status handed to its control daemon's record (the command's own poll would
        find nothing left to wait for, and take it for a success)."""
        with contextlib.suppress(ChildProcessError):
            while True:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid <= 0:
                    break
                if self.controls is not None:
                    self.controls.reaped(pid, status)

    def ingest(self, now: float) -> None:
        """Turn spool requests into table rows in one transaction, then delete them (``launcher.daemon.intake``);
        a request that makes it fail is set aside and the others go on (``launcher.daemon.isolation``)."""
        isolation.ingest(self, now, self.reload)

    def reconcile(self, now: float) -> None:
        """Collect outcomes from exit files; deal with shims that died without writing one."""
        if not self.running and not self.suspended:
            return
        events: list[dict[str, Any]] = []
        check_liveness = now >= self._next_liveness
        if check_liveness:
            self._next_liveness = now + LIVENESS_EVERY
        written = outcomes.exit_files(self.state.run)
        ended: dict[int, tuple[ExitFile | None, Launch]] = {}  # for what was staged behind them
        for job_id, job in [*self.running.items(), *self.suspended.items()]:
            try:
                exit_data = (
                    outcomes.read_exit(self.state.exit_file(job_id))
                    if written is None or f"{job_id}.exit" in written
                    else None
                )  # fmt: skip
            except BadExitFile as err:
                log.error("job %d's exit file is not one gpuq reads: %s", job_id, err)
                ended[job_id] = None, job.launch
                self.shims.ended(job_id)  # its shim wrote the file: it waits for the next job
                endings.finish(self, job.record, outcomes.unreadable(err), now, events)
                continue
            if exit_data is None and job.launch.boot_id != self.boot_id:
                ended[job_id] = None, job.launch
                endings.finish(self, job.record, Outcome.lost("the machine restarted while it ran"), now, events)
            elif (
                exit_data is None
                and check_liveness
                and not processes.is_alive(job.launch.shim_pid, job.launch.shim_start)
            ):
                with contextlib.suppress(BadExitFile):  # read just above, and not there then
                    exit_data = outcomes.read_exit(self.state.exit_file(job_id))  # it may have just finished
                if exit_data is None:
                    ended[job_id] = None, job.launch
                    endings.orphaned(self, job, now, events)
            if exit_data is not None:
                ended[job_id] = exit_data, job.launch
                if exit_data.next is not None and exit_data.next in self.staged:
                    self.shims.handed(job_id, exit_data.next)  # its shim went on to the job staged behind it
                else:
                    self.shims.ended(job_id)  # its shim wrote the exit file last: it waits for the next job
                outcome = outcomes.classify(
                    exit_data, job.record, job.launch, functools.partial(sight.out_of_memory, self, job)
                )  # fmt: skip
                outcome = outcome and outcomes.contained(outcome, exit_data)
                if job_id in self.suspended and outcome is not None and job.launch.cancel_by is None:
                    outcome = Outcome.died_suspended(outcome)  # it could not have ended on its own
                outcomes.record_host_usage(self.table, job_id, exit_data)
                stopped = self.stopped_for.get(job_id)
                if stopped is not None and outcome is not None and (
                    outcome.state is not JobState.SUCCEEDED or stopped.cause is Cause.PREEMPTED
                ):  # a preempted job that saved its work and exited 0 is not done: it is requeued
                    outcome = stopped  # we stopped it: say why, not "cancelled"
                ended_at = exit_data.ended_at
                if outcome is None:
                    endings.requeue(self, job, "its launch was interrupted; queued again", events, now)
                else:
                    endings.finish(self, job.record, outcome, ended_at, events)
        if self.staged:
            handoff.settle(self, ended, written, now, events)  # after the ends: a successor follows its first
        self.journal.extend(events)

    def launch_fenced(self, now: float) -> None:
        """Launch jobs that waited for their MPS control daemon, on the GPUs they were given (``daemon.fences``)."""
        for record, gpus, uuids in fences.step(self):
            self._launch(record, gpus, uuids, now)

    def place_and_launch(self, now: float, snapshot: list[GpuSnapshot]) -> None:
        if not self.pending:
            self._record_reasons({}, now)
            return
        # Nothing that placement looks at has changed since the last pass (a periodic wake-up with a
        # blocked queue): skip it, so 10,000 waiting jobs cost no CPU between events. What it reads marks
        # ``changes`` itself (``launcher.daemon.tracked``); a running job's record is replaced, never changed.
        key = (
            tuple((g.index, g.used, g.lost) for g in snapshot), self.changes.count, self.paused_by,
            tuple(job.record for job in self.running.values()), min(self.not_before.values(), default=0.0) <= now,
            reserving.phase(self, now),
        )  # fmt: skip
        if key == self._last_plan_key and not any(now >= t for t in self.not_before.values()):
            if self._unsaved_reasons is not None and now >= self._reasons_due:
                self._record_reasons(self._unsaved_reasons, now)  # held back by the once-a-second limit
            return
        self._last_plan_key = key
        try:
            ready, waiting = readiness.eligible(self, now)
            plan = self.plan(now, snapshot, ready)
        except isolation.INPUT_ERRORS:  # a job that breaks planning fails alone, not every pass for everyone
            bad = isolation.unplaceable(self, lambda: self.plan(now, snapshot, readiness.eligible(self, now)[0]))
            if not bad:
                raise
            isolation.fail(self, bad, now)
            ready, waiting = readiness.eligible(self, now)
            plan = self.plan(now, snapshot, ready)
        uuids = {g.index: g.uuid for g in snapshot}
        for decision in plan.decisions:
            record = self.pending[decision.job_id]  # pending until it starts (``_launch``)
            self.not_before.pop(record.id, None)
            self._requests.pop(record.id, None)
            if withdrawn(self, record, now):  # its client went since the last look: its GPUs wait for the next pass
                continue
            self._launch(record, decision.gpus, tuple(uuids[i] for i in decision.gpus), now)
        placed = {decision.job_id for decision in plan.decisions}
        skip = placed | self.fenced_off
        # What comes next, lazily: staging looks at a few jobs, and 10,000 may wait.
        upcoming = (self.pending[q.job_id] for q in self.queue_order if q.job_id not in skip)
        handoff.stage(self, upcoming, snapshot, now)
        # A job staged in this pass was in the plan, which gave it a reason to wait: being staged is the reason.
        behind = {job_id: handoff.reason(staged) for job_id, staged in self.staged.items()}
        fenced = {job_id: fences.waiting_reason(self, job_id) for job_id in self.fence_waits}
        taking = {job_id: preempting.reason(self, job_id) for job_id in self.preemption.taking}
        self._record_reasons({**waiting, **plan.waiting, **behind, **fenced, **taking}, now)

    def plan(self, now: float, snapshot: list[GpuSnapshot], ready: list[JobRecord] | None = None) -> Plan:
        jobs = list(self.pending.values()) if ready is None else ready
        caps: dict[str, int] | None = None
        held: dict[str, int] | None = None
        used: dict[str, float] = {}
        queue = jobs
        if self.shared is None:  # one user: priority, then submission. Two stable sorts on C-level keys, not a
            requests = [self._request(r) for r in jobs]
            requests.sort(key=_BY_ID)  # Python key per job: with 10,000 pending that was a third of a pass
            requests.sort(key=_BY_PRIORITY, reverse=True)  # (reverse keeps equal priorities in id order)
            self.queue_order = self.plan_order = requests
        else:
            used, held = self._use(now)
            queue = fairshare.fair_order(jobs, _fair_key, used=used, held=held, user_priority=self.shared.priority)
            cap = self.shared.max_gpus_per_user
            caps = None if cap is None else {r.user: cap for r in jobs}
            requests = [self._request(r) for r in queue]
        self.plan_order = requests
        holdings = self.holdings()
        cpu_jobs = sum(1 for job in self.running.values() if not job.record.gpus)
        # Only the arrays in play (self.arrays also holds those whose pending members all wait: held, say).
        live = {q.group for q in requests} | {j.record.array_id for j in self.running.values()}
        limits = {a: info.throttle for a in live if a is not None and (info := self.arrays.get(a)) and info.throttle}
        in_group: dict[int, int] = {}
        for job in self.running.values():
            if job.record.array_id in limits:
                in_group[job.record.array_id] = in_group.get(job.record.array_id, 0) + 1
        requests, reserved, notes = reserving.fence(self, requests, now, [g.index for g in snapshot])
        plan = place(
            requests, sight.views(self, snapshot), holdings, now, self.policy, self.source.distance, cpu_jobs,
            limits, in_group, user_caps=caps, user_gpus=held,
        )  # fmt: skip
        plan.waiting.update(reserved)  # waiting on a reservation whatever the GPUs hold
        # While a reservation is on or to come, no job is staged behind a running one: it would start whenever that
        # one ends, which may be past a start its own time limit was checked against (daemon/reserving.py).
        self.fenced_off = set(reserved) | ({r.job_id for r in requests} if reserving.live(self, now) else set())
        if self.shared is not None:
            plan.waiting.update(fairshare.explain(plan.waiting, queue, _fair_key, used, self.shared.priority))
        for job_id, words in notes.items():  # narrowed by a reservation, and waiting: say that first
            if job_id in plan.waiting:
                plan.waiting[job_id] = f"{words}; {plan.waiting[job_id]}"
        return plan

    def holdings(self) -> list[Holding]:
        """Placement's claims on the GPUs: the running jobs' reservations, and the places kept for others."""
        return [
            Holding(
                job.record.id, job.record.gpus, job.record.spec.mem_per_gpu,
                None if job.record.spec.time_limit is None or job.record.started_at is None
                else job.record.started_at + job.record.spec.time_limit,
            )
            for job in self.running.values()
        ] + fences.holdings(self) + preempting.holdings(self) + reserving.holdings(self)  # fmt: skip

    def _use(self, now: float) -> tuple[dict[str, float], dict[str, int]]:
        """Each user's recent GPU-seconds (running jobs' time so far included) and GPUs held now."""
        assert self.usage is not None
        runs = [(j.record.user, len(j.record.gpus), j.record.started_at or now) for j in self.running.values()]
        return fairshare.recent_use(self.usage, runs, now), fairshare.held_gpus(runs)

    def _request(self, record: JobRecord) -> Request:
        """Placement's view of a pending job, built once per spec: building 10,000 of them on every pass
        was most of a pass's time (14 of 17 ms, measured)."""
        cached = self._requests.get(record.id)
        if cached is None or cached[0] is not record.spec:
            spec = record.spec
            request = Request(
                record.id, spec.gpus, spec.mem_per_gpu, spec.time_limit, record.array_id, record.user, spec.priority,
                tuple(spec.value(GPU_IDS)),
            )  # fmt: skip
            cached = (spec, request)
            self._requests[record.id] = cached
        return cached[1]

    # -- helpers --------------------------------------------------------------------------------------

    def _launch(self, record: JobRecord, gpus: tuple[int, ...], uuids: tuple[str, ...], now: float) -> None:
        spec = record.spec
        account = None
        if self.shared is not None:
            account = accounts.account(record.uid)
            problem = "" if account else f"its owner (uid {record.uid}) no longer has an account here"
            if is_public(spec):
                where = self.state.private_file(record.id if record.array_id is None else record.array_id)
                problem = f"its command and environment ({where}) are missing or not its owner's (see `gpuq doctor`)"
            if problem:
                endings.finish(self, record, Outcome.failed_to_spawn(problem), now, [])
                return
        problem = self.unenforceable(spec)
        if problem:
            endings.finish(self, record, Outcome.failed_to_spawn(problem), now, [])
            return
        port = None
        if spec.mode.value == "torchrun":
            port = processes.free_port({j.launch.port for j in self.running.values() if j.launch.port})
        fence = fences.environment(self, record, gpus, uuids)  # MPS's limit, or PyTorch's, at its share
        if fence is None:  # its user's control daemon on that GPU is starting: it waits for it there
            fences.wait(self, record, gpus, uuids)
            return
        env = processes.job_env(spec, record.id, gpus, uuids, self.state.root, record)
        env.update(fence)
        env.update(processes.preemption_env(spec, self.state.restarts_file(record.id)))
        if spec.preemptible and spec.mode.value != "torchrun":  # the fast suspend's handler (suspension/fastpath.py)
            try:
                env.update(fastpath.prepare(self.state.fast_dir(record.id), env, account))
            except OSError as err:  # the driver's path stays: a suspend says why the fast one was not asked
                log.warning("job %d: no fast suspend: %s", record.id, err)
        self.on_rollback.append(lambda: fences.forget(self, record.id))
        if spec.mem_auto:
            learning.launched(self.table, record)
        launch = self.shim_launch(record, gpus, env, port, account)
        endings.unlink(launch.exit_file, launch.pid_file)  # an earlier attempt's, which would say it ended
        try:
            supervisor = self.shims.take(record.id)
        except OSError as err:
            endings.finish(self, record, Outcome.failed_to_spawn(f"fork failed: {err.strerror}"), now, [])
            return
        info = Launch(supervisor.pid, supervisor.started, self.boot_id, port)
        self.on_rollback.append(lambda: self.shims.ended(record.id))  # it was sent nothing: idle again
        self.table.mark_running(record.id, gpus, uuids, now, info)
        self.after_commit.append(lambda: supervisor.start(launch))  # the job starts only once recorded running
        running = record.replace(state=JobState.RUNNING, gpus=gpus, gpu_uuids=uuids, started_at=now)
        self.lives.start(Running(running, info))
        self.journal.append(Started(now, record.id, tuple(gpus)).to_json())

    def _record_reasons(self, waiting: dict[int, str], now: float) -> None:
        """Store why jobs wait, for `gpuq status`: at most once a second, since they are for people to
        read and writing them on every tick would cost the dispatch path a write per tick."""
        if now < self._reasons_due and set(waiting) <= set(self.waiting):
            self._unsaved_reasons = waiting
            return
        self._unsaved_reasons = None
        self._reasons_due = now + 1.0
        changed = {job_id: why for job_id, why in waiting.items() if self.waiting.get(job_id) != why}
        self.waiting = waiting
        if changed:
            self.table.set_reasons(changed)


_BY_ID = operator.attrgetter("job_id")
_BY_PRIORITY = operator.attrgetter("priority")


def _fair_key(record: JobRecord) -> tuple[str, int, int, int]:
    return record.user, record.spec.gpus, record.spec.priority, record.id
