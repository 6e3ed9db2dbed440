"""The daemon's loop as named steps. ``tick(now)`` reads like a table of contents:

    reap -> ingest -> reconcile -> follow up arrays -> place and launch -> sample -> (the go) -> watch

Placement's pass is ``launcher.daemon.placing``, a launch ``launcher.daemon.launching``; requests (cancel, hold,
drain...) are applied in ``launcher.daemon.requests``; the rules for dependencies, retries and fail-fast holds are
pure functions in ``launcher.policy.lifecycle``.

The job table on disk is the truth; the scheduler keeps the active jobs in memory because it is the
table's only writer, so a pass over 10,000 pending jobs reads nothing from disk.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpuq_scheduler.jobs.causes import Cause, OutOfMemory
from gpuq_scheduler.jobs.model import JobRecord, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store import journal, spool
from gpuq_scheduler.jobs.store.events import Event
from gpuq_scheduler.launcher.daemon import (
    endings,
    fences,
    handoff,
    intake,
    isolation,
    launching,
    outcomes,
    outsiders,
    placing,
    preempting,
    reserving,
)
from gpuq_scheduler.launcher.daemon.clients import gone_waiting, withdraw
from gpuq_scheduler.launcher.daemon.lives import Running
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.daemon.suspension import fastpath, pools, suspending
from gpuq_scheduler.launcher.daemon.watching import sight
from gpuq_scheduler.launcher.daemon.watching.watchdog import Watch
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot
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
        # Before anything starts: MPS control daemons an earlier daemon left behind.
        fences.adopt(self, self.lives, shared=self.shared is not None)
        suspending.recover(self)  # a suspend an earlier daemon began is undone, a resume finished
        preempting.recover(self)  # a job an earlier daemon preempted resumes once its preemptor is not running
        reserving.recover(self)  # a job suspended for a reservation resumes once it is over
        # The fast directories of jobs that ended while no daemon ran (or before one removed them); a
        # suspended job's stays, since its resume asks its processes through it.
        fastpath.sweep(os.path.dirname(self.state.fast_dir(0)), set(self.running) | set(self.suspended))
        # The GPU watchdog (daemon/watching/watchdog.py), with its defaults until serve() gives it the settings.
        self.watch = Watch.of(self.state.root, self.policy.overhead)
        self.placement = placing.Placement()  # what placement keeps between passes, for itself
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
        suspending.advance(self, now, self.journal, lambda: placing.holdings(self))
        reserving.label(self, now)  # a job just suspended for a reservation says so
        endings.follow_up_arrays(self, now)  # before placement: a failing array must start no more
        snapshot = self.snapshot()
        self.journal.extend(sight.stop_on_lost_gpus(self.monitor, self.running, self, now, snapshot))
        withdraw(self, gone_waiting(self.monitor, self.lives, now), now)
        self.launch_fenced(now)
        preempting.launch_ready(self, now, self._launch)  # before placement: the victims' GPUs are theirs
        placing.place_and_launch(self, self.placement, now, snapshot, self._launch)
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
        probes = set(self.mem_auto.probes.values())
        self.journal.extend(self.watch.check(self.lives, self.table, self, now, readings, probes))
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
        acting = dict(self.acting)  # the helpers under way and the stops: the table knows neither
        stopping = dict(self.stopped_for)
        self.load_lives()  # the jobs still live keep their marks
        for job_id, helper in acting.items():
            if job_id in self.suspended:  # resuming: it holds its GPUs
                self.lives.resume(job_id)
            if job_id in self.running:
                self.lives.act(job_id, helper)
        for job_id, outcome in stopping.items():
            if job_id in self.running:
                self.lives.stop(job_id, outcome)
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
        if self.acting or suspending.wants_resumes(self):
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
        events: list[Event] = []
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
                )
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
                    exit_data, job.record, job.launch, functools.partial(self._out_of_memory, job)
                )
                outcome = outcome and outcomes.contained(outcome, exit_data)
                if job_id in self.suspended and outcome is not None and job.launch.cancel_by is None:
                    outcome = Outcome.died_suspended(outcome)  # it could not have ended on its own
                outcomes.record_host_usage(self.table, job_id, exit_data)
                stopped = self.stopped_for.get(job_id)
                if (
                    stopped is not None
                    and outcome is not None
                    and (outcome.state is not JobState.SUCCEEDED or stopped.cause is Cause.PREEMPTED)
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

    def _out_of_memory(self, job: Running) -> OutOfMemory:
        fenced = self.fence is not fences.NONE
        return sight.out_of_memory(self.running, self.last_snapshot, self.policy, fenced, job)

    def launch_fenced(self, now: float) -> None:
        """Launch jobs that waited for their MPS control daemon, on the GPUs they were given (``daemon.fences``)."""
        for record, gpus, uuids in fences.step(self, shared=self.shared is not None):
            self._launch(record, gpus, uuids, now)

    def _launch(self, record: JobRecord, gpus: tuple[int, ...], uuids: tuple[str, ...], now: float) -> None:
        refused = launching.launch(self, record, gpus, uuids, now)
        if refused is not None:  # it cannot start here: it ends failed to spawn, saying why (journalled)
            endings.finish(self, record, refused, now, self.journal)
