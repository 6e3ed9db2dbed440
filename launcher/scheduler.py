"""The daemon's loop as named steps. ``tick(now)`` reads like a table of contents:

    reap -> ingest -> reconcile -> follow up arrays -> place and launch -> sample

Requests (cancel, hold, drain...) are applied in ``launcher.requests``; the rules for dependencies,
retries and fail-fast holds are pure functions in ``launcher.lifecycle``.

The job table on disk is the truth; the scheduler keeps the active jobs in memory because it is the
table's only writer, so a pass over 10,000 pending jobs reads nothing from disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import operator
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobs import accounts, journal, outbox
from jobs.config import Shared
from jobs.model import ArrayInfo, JobRecord, JobSpec, JobState, Launch, Outcome
from jobs.private import PrivateSpecs, is_public
from jobs.statedir import StateDir, write_atomic
from jobs.submission import Inventory
from jobs.table import JobTable
from launcher import endings, fairshare, intake, lifecycle, outcomes, processes, shim, watching
from launcher.fairshare import Usage
from launcher.gpus import GpuSnapshot, GpuSource
from launcher.placement import Holding, Plan, Policy, Request, place

log = logging.getLogger("gpuq.scheduler")

SPARES = 8  # at most this many idle shims
LIVENESS_EVERY = 2.0  # seconds between checks that shims are still alive (a shim killed -9 writes no exit file)


@dataclass
class Running:
    record: JobRecord
    launch: Launch
    pids: set[int] = field(default_factory=set)


class Scheduler:
    def __init__(
        self, state: StateDir, source: GpuSource, policy: Policy | None = None, grace: float = 10.0,
        retry_backoff: float = 10.0, shared: Shared | None = None,
    ) -> None:  # fmt: skip
        """``shared``: this daemon serves a whole machine (as root): jobs run as their submitters, specs
        are kept private, and the per-user limits, priorities and fair share of the config apply."""
        self.state = state
        self.shared = shared
        self.admins = shared.admins if shared else None
        self.max_queued = shared.max_queued_per_user if shared else None
        self.private = PrivateSpecs(state, accounts.group_id(self.admins)) if shared else None
        self.usage: Usage | None = None  # each user's recent GPU use (a shared queue's fair share)
        self.source = source
        self.policy = policy or Policy()
        self.grace = grace
        self.retry_backoff = retry_backoff
        self.boot_id = processes.boot_id()
        self.table = JobTable(state.db, create=True, private=self.private)
        if shared is not None:
            now, half_life = time.time(), shared.fair_share_half_life
            self.usage = Usage.from_history(self.table.runs_since(now - 10 * half_life), now, half_life)
        self.pending: dict[int, JobRecord] = {r.id: r for r in self.table.pending()}
        self.running: dict[int, Running] = {r.id: Running(r, launch) for r, launch in self.table.running()}
        # Arrays with a member pending or running (ingest adds new ones; endings forget those whose members
        # have all ended): every array ever submitted, kept for the daemon's lifetime, grew without bound.
        self.arrays: dict[int, ArrayInfo] = self.table.arrays(active_only=True)
        self.not_before: dict[int, float] = self.table.not_before()
        settings = self.table.settings()
        self.drained: set[int] = set(settings.get("drained", []))
        self.paused_by: str | None = settings.get("paused_by")
        self.waiting: dict[int, str] = {}
        self.after_commit: list[Callable[[], None]] = []  # run once this tick's transaction is on disk
        self.on_rollback: list[Callable[[], None]] = []  # run if it is not
        self._reasons_due = 0.0
        self._unsaved_reasons: dict[int, str] | None = None
        self.changes = 0  # bumped by every ending and every request, so placement knows when to look again
        self._last_plan_key: object = None
        self._requests: dict[int, tuple[JobSpec, Request]] = {}
        self._touched_arrays: dict[int, bool] = {}  # arrays a member of which ended this tick -> one failed
        outbox.raise_counter(state, max(self.table.max_id(), *(a.id + a.size for a in self.arrays.values()), 0) + 1)
        self.last_snapshot: list[GpuSnapshot] = []
        self._inventory_key: object = None
        self._next_liveness = 0.0
        self._next_sample = 0.0
        self.lost_since: dict[int, float] = {}  # GPU index -> when it was first seen lost
        self.gpu_lost: dict[int, str] = {}  # running job id -> the lost GPU it is being stopped for
        self.shims = shim.Shims()

    def close(self) -> None:
        self.shims.close()
        self.table.close()
        self.source.close()

    @property
    def idle(self) -> bool:
        return not self.pending and not self.running

    def tick(self, now: float) -> None:
        """One pass: everything the daemon does happens here, in this order.

        Ingest commits on its own (its spool files go only once their jobs are on disk). The rest of the
        tick is one transaction; what must follow the commit (a shim's go, removing an exit file, a
        notification) waits in ``after_commit``, so a crash before the commit repeats nothing and loses
        nothing, and a job ending and the next one starting cost one fsync between them.
        """
        self.reap()
        self.ingest(now)
        try:
            with self.table.batch():
                self.reconcile(now)
                endings.follow_up_arrays(self, now)  # before placement: a failing array must start no more
                snapshot = self.snapshot()
                watching.stop_on_lost_gpus(self, now, snapshot)
                self.place_and_launch(now, snapshot)
                watching.sample(self, now, snapshot)
        except BaseException:
            for undo in self.on_rollback:
                undo()
            self.on_rollback, self.after_commit = [], []
            self.reload()
            raise
        then, self.after_commit, self.on_rollback = self.after_commit, [], []
        for action in then:
            action()

    def reload(self) -> None:
        """Forget what this tick did in memory and read the active jobs back from the table."""
        self.pending = {r.id: r for r in self.table.pending()}
        self.running = {r.id: Running(r, launch) for r, launch in self.table.running()}
        self.not_before = self.table.not_before()
        self.arrays = self.table.arrays(active_only=True)

    def wants_spares(self) -> bool:
        return self.shims.idle != self._spares_wanted()

    def fork_spares(self) -> None:
        """Fork idle shims so that the next launches need no fork: one per GPU while work waits, none once
        nothing waits."""
        self.shims.keep(self._spares_wanted())

    def _spares_wanted(self) -> int:
        return min(len(self.pending), max(len(self.last_snapshot), 1), SPARES)

    def next_wakeup(self, now: float) -> float:
        """Seconds to sleep when nothing wakes us: soon while jobs wait on memory that may free up."""
        if self.pending:
            return 0.5
        if self.running:
            return max(0.05, min(self._next_liveness, self._next_sample) - now)
        return 5.0

    # -- steps ----------------------------------------------------------------------------------------

    def reap(self) -> None:
        """Collect exited shims (our children) so they do not linger as zombies."""
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass

    def ingest(self, now: float) -> None:
        """Turn spool requests into table rows in one transaction, then delete them (``launcher.intake``)."""
        intake.ingest(self, now)

    def reconcile(self, now: float) -> None:
        """Collect outcomes from exit files; deal with shims that died without writing one."""
        if not self.running:
            return
        events: list[dict[str, Any]] = []
        check_liveness = now >= self._next_liveness
        if check_liveness:
            self._next_liveness = now + LIVENESS_EVERY
        for job_id, job in list(self.running.items()):
            exit_data = outcomes.read_exit(self.state.exit_file(job_id))
            if exit_data is None and job.launch.boot_id != self.boot_id:
                endings.finish(self, job.record, Outcome.lost("the machine restarted while it ran"), now, events)
            elif (
                exit_data is None
                and check_liveness
                and not processes.is_alive(job.launch.shim_pid, job.launch.shim_start)
            ):
                exit_data = outcomes.read_exit(self.state.exit_file(job_id))  # it may have just finished
                if exit_data is None:
                    endings.orphaned(self, job, now, events)
            if exit_data is not None:
                self.shims.ended(job_id)  # its shim wrote the exit file last: it waits for the next job
                outcome = outcomes.classify(exit_data, job.record, job.launch)
                lost_gpu = self.gpu_lost.get(job_id)
                if lost_gpu is not None and outcome is not None and outcome.state is not JobState.SUCCEEDED:
                    outcome = Outcome.lost(lost_gpu)  # we stopped it: say why, not "cancelled"
                ended = float(exit_data.get("ended_at") or now)
                if outcome is None:
                    endings.requeue(self, job, "its launch was interrupted; queued again", events, now)
                else:
                    endings.finish(self, job.record, outcome, ended, events)
        journal.append(self.state.events, events)

    def snapshot(self) -> list[GpuSnapshot]:
        snapshot = self.source.snapshot()
        self.last_snapshot = snapshot
        key = [(g.index, g.uuid, g.name, g.total, g.lost) for g in snapshot]
        if key != self._inventory_key:
            self._inventory_key = key
            body = {"gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name, "total": g.total, "lost": g.lost}
                             for g in snapshot]}  # fmt: skip
            # Readable by all: clients check --gpus against it (the directory decides who "all" is).
            write_atomic(self.state.inventory, json.dumps(body).encode(), durable=False, mode=0o644)
        return snapshot

    def place_and_launch(self, now: float, snapshot: list[GpuSnapshot]) -> None:
        if not self.pending:
            self._record_reasons({}, now)
            return
        # Nothing that placement looks at has changed since the last pass (a periodic wake-up with a
        # blocked queue): skip it, so 10,000 waiting jobs cost no CPU between events.
        key = (
            tuple((g.index, g.used, g.lost) for g in snapshot), len(self.pending), len(self.running),
            self.changes, frozenset(self.drained), self.paused_by,
            min(self.not_before.values(), default=0.0) <= now,
        )  # fmt: skip
        if key == self._last_plan_key and not any(now >= t for t in self.not_before.values()):
            if self._unsaved_reasons is not None and now >= self._reasons_due:
                self._record_reasons(self._unsaved_reasons, now)  # held back by the once-a-second limit
            return
        self._last_plan_key = key
        ready, waiting = self.eligible(now)
        plan = self.plan(now, snapshot, ready)
        uuids = {g.index: g.uuid for g in snapshot}
        for decision in plan.decisions:
            record = self.pending.pop(decision.job_id)
            self.not_before.pop(record.id, None)
            self._requests.pop(record.id, None)
            self._launch(record, decision.gpus, tuple(uuids[i] for i in decision.gpus), now)
        self._record_reasons({**waiting, **plan.waiting}, now)

    def eligible(self, now: float) -> tuple[list[JobRecord], dict[int, str]]:
        """Pending jobs free to be placed now, and why each of the others waits (paused, held, backoff,
        dependencies). A job whose dependency failed never will be: it is cancelled here, saying why."""
        ready: list[JobRecord] = []
        waiting: dict[int, str] = {}
        events: list[dict[str, Any]] = []
        deps: dict[int, list[JobRecord]] = {}
        never: list[tuple[JobRecord, Outcome]] = []
        for record in list(self.pending.values()):
            if record.held:
                waiting[record.id] = record.reason or "held"
            elif self.not_before.get(record.id, 0) > now:
                waiting[record.id] = f"{record.reason} (in {self.not_before[record.id] - now:.0f}s)"
            elif record.spec.after:
                for dep in record.spec.after:
                    if dep not in deps:
                        deps[dep] = self._job_list(dep)
                readiness = lifecycle.dependencies(record.spec, deps)
                if isinstance(readiness, lifecycle.Never):
                    never.append((record, Outcome(JobState.CANCELLED, reason=readiness.reason)))
                elif isinstance(readiness, lifecycle.Waiting):
                    waiting[record.id] = readiness.reason
                else:
                    ready.append(record)
            else:
                ready.append(record)
        if never:
            endings.finish_pending(self, never, now, events)
        journal.append(self.state.events, events)
        if self.paused_by is not None:
            waiting.update(
                {r.id: f"the queue is paused (by {self.paused_by}); `gpuq resume` resumes it" for r in ready}
            )
            return [], waiting
        return ready, waiting

    def _job_list(self, job_id: int) -> list[JobRecord]:
        """A dependency's records: the job, or an array's members (``self.arrays`` forgets ended arrays)."""
        if job_id in self.arrays:
            return self.table.members(job_id)
        record = self.pending.get(job_id) or self.table.get(job_id)
        return self.table.members(job_id) if record is None else [record]

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
        else:
            used, held = self._use(now)
            queue = fairshare.fair_order(jobs, _fair_key, used=used, held=held, user_priority=self.shared.priority)
            cap = self.shared.max_gpus_per_user
            caps = None if cap is None else {r.user: cap for r in jobs}
            requests = [self._request(r) for r in queue]
        holdings = [
            Holding(
                job.record.id, job.record.gpus, job.record.spec.mem_per_gpu,
                None if job.record.spec.time_limit is None or job.record.started_at is None
                else job.record.started_at + job.record.spec.time_limit,
            )
            for job in self.running.values()
        ]  # fmt: skip
        cpu_jobs = sum(1 for job in self.running.values() if not job.record.gpus)
        # Only the arrays in play (self.arrays also holds those whose pending members all wait: held, say).
        live = {q.group for q in requests} | {j.record.array_id for j in self.running.values()}
        limits = {a: info.throttle for a in live if a is not None and (info := self.arrays.get(a)) and info.throttle}
        in_group: dict[int, int] = {}
        for job in self.running.values():
            if job.record.array_id in limits:
                in_group[job.record.array_id] = in_group.get(job.record.array_id, 0) + 1
        plan = place(
            requests, watching.views(self, snapshot), holdings, now, self.policy, self.source.distance, cpu_jobs,
            limits, in_group, user_caps=caps, user_gpus=held,
        )  # fmt: skip
        if self.shared is not None:
            self._explain_fair_share(plan, queue, used)
        return plan

    def charge(self, record: JobRecord, ended: float) -> None:
        """Count a run that just ended toward its user's recent GPU use (fair share)."""
        if self.usage is not None and record.gpus and record.started_at is not None:
            self.usage = self.usage.charge(record.user, len(record.gpus), record.started_at, ended, ended)

    def _use(self, now: float) -> tuple[dict[str, float], dict[str, int]]:
        """Each user's recent GPU-seconds (running jobs' time so far included) and GPUs held now."""
        assert self.usage is not None
        runs = [(j.record.user, len(j.record.gpus), j.record.started_at or now) for j in self.running.values()]
        return fairshare.recent_use(self.usage, runs, now), fairshare.held_gpus(runs)

    def _explain_fair_share(self, plan: Plan, order: list[JobRecord], used: dict[str, float]) -> None:
        """Say so when a job waits for GPUs while other users' jobs go before it in the fair-share ``order``."""
        assert self.shared is not None
        if len({r.user for r in order}) < 2:
            return
        ahead: set[str] = set()
        said: dict[tuple[str, frozenset[str]], str | None] = {}
        for record in order:
            why = plan.waiting.get(record.id, "")
            if why.startswith(("waiting for", "held back")) and "could ever" not in why:
                key = (record.user, frozenset(ahead))
                if key not in said:
                    said[key] = fairshare.why_behind(record.user, ahead, used, self.shared.priority)
                if said[key]:
                    plan.waiting[record.id] = f"{why}; {said[key]}"
            if record.spec.gpus:
                ahead.add(record.user)

    def stop(self, job: Running) -> None:
        """Ask a running job's shim to stop it (SIGTERM to the job's group, SIGKILL after the grace period)."""
        if not self.shims.cancel(job.record.id):  # started by an earlier daemon: we have no pipe to its shim
            processes.signal_shim(job.launch.shim_pid, job.launch.shim_start)

    def forget(self, job_id: int) -> None:
        """Drop an ended job from the in-memory view of the queue."""
        self.pending.pop(job_id, None)
        self.running.pop(job_id, None)
        self.not_before.pop(job_id, None)
        self._requests.pop(job_id, None)
        self.shims.lost(job_id)  # still there only if it ended without an exit file: its shim died

    def _request(self, record: JobRecord) -> Request:
        """Placement's view of a pending job, built once per spec: building 10,000 of them on every pass
        was most of a pass's time (14 of 17 ms, measured)."""
        cached = self._requests.get(record.id)
        if cached is None or cached[0] is not record.spec:
            spec = record.spec
            request = Request(
                record.id, spec.gpus, spec.mem_per_gpu, spec.time_limit, record.array_id, record.user, spec.priority
            )
            cached = (spec, request)
            self._requests[record.id] = cached
        return cached[1]

    # -- helpers --------------------------------------------------------------------------------------

    def inventory(self) -> Inventory | None:
        if not self.last_snapshot:
            self.snapshot()
        return Inventory(tuple(g.total for g in self.last_snapshot))

    def _launch(self, record: JobRecord, gpus: tuple[int, ...], uuids: tuple[str, ...], now: float) -> None:
        spec = record.spec
        account = None
        if self.shared is not None:
            account = accounts.account(record.uid)
            problem = "" if account else f"its owner (uid {record.uid}) no longer has an account here"
            if is_public(spec):
                problem = f"its command and environment ({self.state.private_file(record.id)}) are missing"
            if problem:
                endings.finish(self, record, Outcome.failed_to_spawn(problem), now, [])
                return
        port = None
        if spec.mode.value == "torchrun":
            port = processes.free_port({j.launch.port for j in self.running.values() if j.launch.port})
        launch = shim.Launch(
            job_id=record.id, argv=processes.job_argv(spec, port),
            env=processes.job_env(spec, record.id, gpus, uuids, self.state.root, record), cwd=spec.cwd,
            log=self.state.log(record.id), exit_file=self.state.exit_file(record.id),
            pid_file=self.state.pid_file(record.id), wake=self.state.wake, time_limit=spec.time_limit,
            grace=self.grace, account=account, log_group=self.private.admin_gid if self.private else None,
        )  # fmt: skip
        for stale in (launch.exit_file, launch.pid_file):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
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
        self.running[record.id] = Running(running, info)
        journal.append(self.state.events, [{"t": now, "job": record.id, "event": "started", "gpus": list(gpus)}])

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
