"""The daemon's loop as named steps. ``tick(now)`` reads like a table of contents:

    reap -> ingest -> reconcile -> place and launch -> sample

The job table on disk is the truth; the scheduler keeps the active jobs in memory because it is the
table's only writer, so a pass over 10,000 pending jobs reads nothing from disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from jobs import journal, spool
from jobs.model import JobRecord, JobState, Launch, Outcome
from jobs.statedir import StateDir, write_atomic
from jobs.store import user_name
from jobs.submission import Inventory
from jobs.table import JobTable
from launcher import outcomes, processes
from launcher.gpus import GpuSnapshot, GpuSource
from launcher.placement import GpuView, Holding, Plan, Policy, Request, place

log = logging.getLogger("gpuq.scheduler")

LIVENESS_EVERY = 2.0  # seconds between checks that shims are still alive (a shim killed -9 writes no exit file)
SAMPLE_EVERY = 2.0  # seconds between samples of per-process GPU memory (peak memory of each job)


@dataclass
class Running:
    record: JobRecord
    launch: Launch
    pids: set[int] = field(default_factory=set)


class Scheduler:
    def __init__(self, state: StateDir, source: GpuSource, policy: Policy | None = None, grace: float = 10.0) -> None:
        self.state = state
        self.source = source
        self.policy = policy or Policy()
        self.grace = grace
        self.boot_id = processes.boot_id()
        self.table = JobTable(state.db, create=True)
        self.pending: dict[int, JobRecord] = {r.id: r for r in self.table.pending()}
        self.running: dict[int, Running] = {r.id: Running(r, launch) for r, launch in self.table.running()}
        self.waiting: dict[int, str] = {}
        self.last_snapshot: list[GpuSnapshot] = []
        self._inventory_key: object = None
        self._next_liveness = 0.0
        self._next_sample = 0.0

    def close(self) -> None:
        self.table.close()
        self.source.close()

    @property
    def idle(self) -> bool:
        return not self.pending and not self.running

    def tick(self, now: float) -> None:
        """One pass: everything the daemon does happens here, in this order."""
        self.reap()
        self.ingest(now)
        self.reconcile(now)
        snapshot = self.snapshot()
        self.place_and_launch(now, snapshot)
        self.sample(now, snapshot)

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
        """Turn spool requests into table rows in one transaction, then delete them."""
        requests = spool.scan(self.state)
        if not requests:
            return
        submits = [r for r in requests if isinstance(r, spool.SubmitRequest)]
        fresh = [self._record(r) for r in submits]
        inserted = set(self.table.insert_pending(fresh))
        events: list[dict[str, Any]] = []
        inventory = self._inventory()
        for record in fresh:
            if record.id not in inserted:
                continue  # ingested before a crash that left its request behind
            events.append({"t": now, "job": record.id, "event": "submitted", "user": record.user})
            problem = _impossible(record, inventory)
            if problem:
                self._finish(record, Outcome(JobState.FAILED, reason=problem), now, events)
            else:
                self.pending[record.id] = record
        for submit in submits:
            spool.remove(submit)
        for other in requests:
            if isinstance(other, spool.CancelRequest):
                self._cancel(other, now, events)
                spool.remove(other)
            elif isinstance(other, spool.BadRequest):
                where = spool.set_aside(self.state, other)
                log.warning("set aside %s: it %s (moved to %s)", other.path.name, other.reason, where)
                events.append({"t": now, "event": "rejected", "file": other.path.name, "reason": other.reason})
        journal.append(self.state.events, events)

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
                self._finish(job.record, Outcome.lost("the machine restarted while it ran"), now, events)
            elif (
                exit_data is None
                and check_liveness
                and not processes.is_alive(job.launch.shim_pid, job.launch.shim_start)
            ):
                exit_data = outcomes.read_exit(self.state.exit_file(job_id))  # it may have just finished
                if exit_data is None:
                    self._orphaned(job, now, events)
            if exit_data is not None:
                outcome = outcomes.classify(exit_data, job.record, job.launch)
                ended = float(exit_data.get("ended_at") or now)
                if outcome is None:
                    self._requeue(job, "its launch was interrupted; queued again", events, now)
                else:
                    self._finish(job.record, outcome, ended, events)
        journal.append(self.state.events, events)

    def snapshot(self) -> list[GpuSnapshot]:
        snapshot = self.source.snapshot()
        self.last_snapshot = snapshot
        key = [(g.index, g.uuid, g.name, g.total, g.lost) for g in snapshot]
        if key != self._inventory_key:
            self._inventory_key = key
            body = {"gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name, "total": g.total, "lost": g.lost}
                             for g in snapshot]}  # fmt: skip
            write_atomic(self.state.inventory, json.dumps(body).encode(), durable=False)
        return snapshot

    def place_and_launch(self, now: float, snapshot: list[GpuSnapshot]) -> None:
        if not self.pending:
            self._record_reasons({})
            return
        plan = self.plan(now, snapshot)
        uuids = {g.index: g.uuid for g in snapshot}
        for decision in plan.decisions:
            record = self.pending.pop(decision.job_id)
            self._launch(record, decision.gpus, tuple(uuids[i] for i in decision.gpus), now)
        self._record_reasons(plan.waiting)

    def plan(self, now: float, snapshot: list[GpuSnapshot]) -> Plan:
        queue = sorted(self.pending.values(), key=lambda r: (-r.spec.priority, r.id))
        requests = [Request(r.id, r.spec.gpus, r.spec.mem_per_gpu, r.spec.time_limit) for r in queue]
        holdings = [
            Holding(
                job.record.id, job.record.gpus, job.record.spec.mem_per_gpu,
                None if job.record.spec.time_limit is None or job.record.started_at is None
                else job.record.started_at + job.record.spec.time_limit,
            )
            for job in self.running.values()
        ]  # fmt: skip
        cpu_jobs = sum(1 for job in self.running.values() if not job.record.gpus)
        return place(requests, self.views(snapshot), holdings, now, self.policy, self.source.distance, cpu_jobs)

    def views(self, snapshot: list[GpuSnapshot]) -> list[GpuView]:
        """What placement sees: memory used by processes outside gpuq is told apart from our jobs' own."""
        ours = {pid for job in self.running.values() for pid in job.pids}
        views = []
        for gpu in snapshot:
            if gpu.processes is None:
                external = gpu.used  # the driver hides who uses what: count it all as foreign, to be safe
            else:
                self._attribute(gpu.processes)
                external = sum(used for pid, used in gpu.processes.items() if pid not in ours)
            views.append(GpuView(gpu.index, gpu.total, gpu.used, external, available=not gpu.lost))
        return views

    def sample(self, now: float, snapshot: list[GpuSnapshot]) -> None:
        """Record each running job's peak GPU memory (the most it held on any one of its GPUs)."""
        if not self.running or now < self._next_sample:
            return
        self._next_sample = now + SAMPLE_EVERY
        peaks: dict[int, int] = {}
        for gpu in snapshot:
            if not gpu.processes:
                continue
            self._attribute(gpu.processes)
            for job_id, job in self.running.items():
                held = sum(used for pid, used in gpu.processes.items() if pid in job.pids)
                if held:
                    peaks[job_id] = max(peaks.get(job_id, 0), held)
        if peaks:
            self.table.set_peak_mem(peaks)

    # -- helpers --------------------------------------------------------------------------------------

    def _record(self, request: spool.SubmitRequest) -> JobRecord:
        return JobRecord(
            id=request.job_id, spec=request.spec, uid=request.uid, user=user_name(request.uid),
            state=JobState.PENDING, submitted_at=request.submitted_at, log=str(self.state.log(request.job_id)),
        )  # fmt: skip

    def _inventory(self) -> Inventory | None:
        if not self.last_snapshot:
            self.snapshot()
        return Inventory(tuple(g.total for g in self.last_snapshot))

    def _launch(self, record: JobRecord, gpus: tuple[int, ...], uuids: tuple[str, ...], now: float) -> None:
        spec = record.spec
        port = None
        if spec.mode.value == "torchrun":
            port = processes.free_port({j.launch.port for j in self.running.values() if j.launch.port})
        launch = processes.Launch(
            job_id=record.id, argv=processes.job_argv(spec, port),
            env=processes.job_env(spec, record.id, gpus, uuids, self.state.root), cwd=spec.cwd,
            log=self.state.log(record.id), exit_file=self.state.exit_file(record.id),
            pid_file=self.state.pid_file(record.id), wake=self.state.wake, time_limit=spec.time_limit,
            grace=self.grace,
        )  # fmt: skip
        for stale in (launch.exit_file, launch.pid_file):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        try:
            shim = processes.Shim(launch)
        except OSError as err:
            self._finish(record, Outcome.failed_to_spawn(f"fork failed: {err.strerror}"), now, [])
            return
        info = Launch(shim.pid, processes.start_time(shim.pid) or 0.0, self.boot_id, port)
        try:
            self.table.mark_running(record.id, gpus, uuids, now, info)
        except Exception:
            shim.abandon()
            raise
        shim.go()
        running = record.replace(state=JobState.RUNNING, gpus=gpus, gpu_uuids=uuids, started_at=now)
        self.running[record.id] = Running(running, info)
        journal.append(self.state.events, [{"t": now, "job": record.id, "event": "started", "gpus": list(gpus)}])

    def _finish(self, record: JobRecord, outcome: Outcome, ended: float, events: list[dict[str, Any]]) -> None:
        self.table.finish(record.id, outcome, ended)
        self.pending.pop(record.id, None)
        self.running.pop(record.id, None)
        for path in (self.state.exit_file(record.id), self.state.pid_file(record.id)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        events.append({
            "t": ended, "job": record.id, "event": outcome.state.value, "exit_code": outcome.exit_code,
            "signal": outcome.signal, "reason": outcome.reason,
        })  # fmt: skip

    def _requeue(self, job: Running, reason: str, events: list[dict[str, Any]], now: float) -> None:
        self.table.requeue(job.record.id, reason)
        self.running.pop(job.record.id, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.state.exit_file(job.record.id))
        self.pending[job.record.id] = job.record.replace(state=JobState.PENDING, gpus=(), gpu_uuids=(), started_at=None)
        events.append({"t": now, "job": job.record.id, "event": "requeued", "reason": reason})

    def _orphaned(self, job: Running, now: float, events: list[dict[str, Any]]) -> None:
        """The shim died without an exit file. Stop the job if it still runs; it can no longer be supervised."""
        try:
            info = json.loads(self.state.pid_file(job.record.id).read_bytes())
        except (OSError, ValueError):
            self._requeue(job, "its launch was interrupted before it started; queued again", events, now)
            return
        pid = info.get("pid") if isinstance(info, dict) else None
        if isinstance(pid, int) and processes.is_alive(pid, info.get("start")):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, 9)
            reason = "its gpuq supervisor was killed; the job was stopped"
        else:
            reason = "its gpuq supervisor was killed; the job's exit status is unknown"
        self._finish(job.record, Outcome.lost(reason), now, events)

    def _cancel(self, request: spool.CancelRequest, now: float, events: list[dict[str, Any]]) -> None:
        who = user_name(request.uid)
        for job_id in request.job_ids:
            record = self.pending.get(job_id) or (self.running[job_id].record if job_id in self.running else None)
            if record is None:
                continue  # unknown or already finished: nothing to do
            if request.uid not in (0, record.uid, os.getuid()):
                log.warning("refused cancel of job %d (owner %s) from %s", job_id, record.user, who)
                events.append({"t": now, "job": job_id, "event": "cancel-refused", "by": who})
                continue
            if job_id in self.pending:
                self._finish(record, Outcome.cancelled(who), now, events)
                continue
            job = self.running[job_id]
            self.table.set_cancel_by(job_id, who)
            job.launch = Launch(job.launch.shim_pid, job.launch.shim_start, job.launch.boot_id, job.launch.port, who)
            processes.signal_shim(job.launch.shim_pid, job.launch.shim_start)
            events.append({"t": now, "job": job_id, "event": "cancel-requested", "by": who})

    def _record_reasons(self, waiting: dict[int, str]) -> None:
        changed = {job_id: why for job_id, why in waiting.items() if self.waiting.get(job_id) != why}
        self.waiting = waiting
        if changed:
            self.table.set_reasons(changed)

    def _attribute(self, usage: dict[int, int] | Any) -> None:
        """Learn which GPU-using pids belong to our jobs, by walking each pid's ancestors up to a shim."""
        shims = {job.launch.shim_pid: job for job in self.running.values()}
        known = {pid for job in self.running.values() for pid in job.pids}
        for pid in usage:
            if pid in known:
                continue
            for ancestor in processes.ancestors(pid):
                if ancestor in shims:
                    shims[ancestor].pids.add(pid)
                    break


def _impossible(record: JobRecord, inventory: Inventory | None) -> str:
    """Why a job can never run on this machine ("" if it can): it fails at once instead of waiting forever."""
    if inventory is None:
        return ""
    try:
        inventory.check(record.spec)
    except Exception as err:  # BadInput: the same words the submitting client would have printed
        return str(err)
    return ""
