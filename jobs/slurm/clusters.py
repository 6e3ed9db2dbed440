"""Jobs on clusters, from the client's side: send them (sbatch), follow them (squeue, sacct, exit files),
cancel them (scancel). There is no gpuq daemon for them: whoever looks at them brings their record up
to date first (``refresh``), with one squeue call per cluster that has active jobs.

``Everywhere`` is the local ``Queue`` plus these jobs, for the commands that read or cancel jobs:
``gpuq status``, ``show``, ``logs``, ``wait``, ``cancel`` and ``report`` see both through it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuq_scheduler.jobs import accounts, config
from gpuq_scheduler.jobs.accounts import user_name
from gpuq_scheduler.jobs.errors import BadInput, GpuqError, NotPermitted, StateDirError, UnknownJob
from gpuq_scheduler.jobs.listing import Line
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.slurm import commands as slurm
from gpuq_scheduler.jobs.slurm import sbatch
from gpuq_scheduler.jobs.slurm.records import ClusterArray, ClusterTable
from gpuq_scheduler.jobs.store import outbox, spool
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.statedir import StateDir, read_bytes

REFRESH_EVERY = 0.5  # seconds: how stale a poller (`gpuq wait`, `logs -f`) lets the records get


def submit(
    state: StateDir, cluster_name: str, spec: JobSpec, array: spool.ArrayPlan | None = None, *, now: float | None = None
) -> int:
    """Send a job (or an array) to a cluster with sbatch and record it; returns its gpuq id.

    Every refusal (unknown cluster, an option Slurm cannot honour, sbatch missing or refusing) comes
    before anything is recorded. Ids come from the local counter, so they never collide with local jobs'.
    """
    cluster = config.load().cluster(cluster_name)
    sbatch.check(spec, cluster)
    if spec.time_limit is None and cluster.time is not None:
        spec = dataclasses.replace(spec, time_limit=cluster.time)  # the record shows the limit the job runs under
    slurm.command("sbatch")
    state.ensure()
    if not os.access(state.root, os.W_OK):
        raise StateDirError(
            f"cluster jobs are recorded in {state.clusters_db}, which you cannot write (a shared queue?); "
            "set GPUQ_HOME to a state directory of your own for `gpuq submit --on`"
        )
    table = ClusterTable(state.clusters_db)
    try:
        after = _dependencies(state, table, cluster.name, spec)
        count = 1 + (len(array.indices) if array else 0)
        job_id = outbox.allocate_ids(state, count)
        if job_id <= table.max_id():  # next_id was lost and rebuilt from jobs.db alone: skip past ours
            outbox.raise_counter(state, table.max_id() + 1)
            job_id = outbox.allocate_ids(state, count)
        batch = sbatch.translate(spec, cluster, job_id=job_id, state=state, array=array, after=after)
        external = slurm.sbatch(batch.argv, batch.script, batch.env, cluster.name)
        records, info = _records(
            state, cluster.name, spec, job_id, external, array, time.time() if now is None else now
        )
        try:
            table.insert(records, info)
        except GpuqError:
            with contextlib.suppress(GpuqError):
                slurm.scancel([external], cluster.name)  # not recorded, so not left running either
            raise
    finally:
        table.close()
    return job_id


def _records(
    state: StateDir,
    cluster: str,
    spec: JobSpec,
    job_id: int,
    external: str,
    array: spool.ArrayPlan | None,
    now: float,
) -> tuple[list[JobRecord], ClusterArray | None]:
    uid = os.getuid()
    user = user_name(uid)
    common: dict[str, Any] = {
        "uid": uid,
        "user": user,
        "state": JobState.PENDING,
        "submitted_at": now,
        "cluster": cluster,
        "reason": "submitted to Slurm",
    }
    if array is None:
        return [JobRecord(id=job_id, spec=spec, log=str(state.log(job_id)), external_id=external, **common)], None
    members = [
        JobRecord(
            id=member,
            spec=spec.member(index),
            log=str(state.log(member)),
            external_id=f"{external}_{index}",
            array_id=job_id,
            array_index=index,
            **common,
        )
        for member, index in zip(array.member_ids(job_id), array.indices, strict=True)
    ]
    info = ClusterArray(job_id, cluster, external, uid, user, spec.display_name, len(members), array.throttle, now)
    return members, info


def _dependencies(state: StateDir, table: ClusterTable, cluster: str, spec: JobSpec) -> list[str]:
    """The Slurm ids to wait for. Dependencies already ended are settled here: Slurm treats a job it has
    forgotten as a satisfied dependency, whatever its outcome."""
    if not spec.after:
        return []
    refresh(state)
    targets = []
    for dep in spec.after:
        record, arrays = table.get(dep), table.arrays([dep])
        if record is None and dep not in arrays:
            try:
                Queue(state).resolve([dep])  # an array's id too
            except GpuqError:
                raise UnknownJob(dep) from None
            raise BadInput(
                f"job {dep} runs on this machine, and a job on cluster {cluster} can only wait for jobs there; "
                f"wait for it first (`gpuq wait {dep}`), then submit this one"
            )
        where = record.cluster if record is not None else arrays[dep].cluster
        if where != cluster:
            raise BadInput(
                f"job {dep} runs on cluster {where}; a job on cluster {cluster} can only wait for jobs there"
            )
        members = [record] if record is not None else table.members(dep)
        if any(not m.state.finished for m in members):
            targets.append(record.external_id if record is not None and record.external_id else arrays[dep].external_id)
            continue
        bad = [m for m in members if m.state is not JobState.SUCCEEDED]
        if bad and not spec.after_any:
            raise BadInput(
                f"job {bad[0].id} already {bad[0].state.value} ({bad[0].reason or bad[0].state.value}), so this job "
                "could never start; drop it from --after, or use --after-any"
            )
    return targets


def refresh(state: StateDir, *, now: float | None = None) -> list[str]:
    """Bring the active cluster jobs' records up to date; returns notes for the user (a cluster that
    did not answer). Runs no Slurm command when no cluster job is active."""
    table = ClusterTable(state.clusters_db)
    try:
        active = table.records(active_only=True)
        if not active:
            return []
        notes = []
        by_cluster: dict[str, list[JobRecord]] = {}
        for record in active:
            by_cluster.setdefault(record.cluster or "", []).append(record)
        for cluster, records in by_cluster.items():
            try:
                _refresh_cluster(state, table, records, time.time() if now is None else now)
            except (slurm.Unreachable, BadInput) as err:
                notes.append(f"cluster {cluster}: {err}; its jobs are shown as last seen")
        return notes
    finally:
        table.close()


def _refresh_cluster(state: StateDir, table: ClusterTable, records: list[JobRecord], now: float) -> None:
    seen = slurm.squeue(sorted({_slurm_job(r) for r in records}, key=int))
    exits = {r.id: read_exit(state, r.id) for r in records}  # after squeue: an exit file beats a COMPLETED
    unknown = sorted({r.external_id or "" for r in records if r.external_id not in seen and exits[r.id] is None})
    accounted = (slurm.sacct(unknown) if unknown else None) or {}
    cancel_by = table.cancel_by(r.id for r in records)
    updated: dict[int, JobRecord] = {}
    for record in sorted(records, key=lambda r: r.id):  # dependencies (lower ids) first
        info = seen.get(record.external_id or "") or accounted.get(record.external_id or "")
        failed = (
            _failed_dependency(table, record, updated) if info and info.reason == "DependencyNeverSatisfied" else None
        )
        new = slurm.follow(record, info, exits[record.id], cancel_by=cancel_by.get(record.id), failed_dependency=failed)
        if new is None:
            new = record.replace(state=JobState.LOST, ended_at=now, reason=_vanished(state, record))
        if new != record:
            updated[record.id] = new
    table.update(list(updated.values()))
    for job_id, record in updated.items():
        if record.state.finished and exits[job_id] is not None:
            with contextlib.suppress(OSError):
                os.unlink(state.exit_file(job_id))  # its outcome is recorded now


def _vanished(state: StateDir, record: JobRecord) -> str:
    return (
        f"Slurm no longer knows job {record.external_id} (it forgets ended jobs after MinJobAge, and sacct has "
        f"nothing) and it left no exit file in {state.run}: check that its node can write there, and its log "
        f"(`gpuq logs {record.id}`)"
    )


def _failed_dependency(table: ClusterTable, record: JobRecord, updated: Mapping[int, JobRecord]) -> str | None:
    for dep in record.spec.after:
        found = table.get(dep)
        members = [found] if found is not None else table.members(dep)
        for member in members:
            member = updated.get(member.id, member)
            if member.state.finished and member.state is not JobState.SUCCEEDED:
                return f"dependency {member.id} {member.state.value} ({member.reason or member.state.value})"
    return None


def _slurm_job(record: JobRecord) -> str:
    return (record.external_id or "0").split("_")[0]


def read_exit(state: StateDir, job_id: int) -> dict[str, Any] | None:
    try:
        data = json.loads(read_bytes(state.exit_file(job_id)))
    except (OSError, ValueError):
        return None  # none yet, or torn (the rename makes that unlikely): Slurm's word will do
    return data if isinstance(data, dict) else None


def cancel(state: StateDir, job_ids: Iterable[int], *, uid: int | None = None) -> list[int]:
    """scancel cluster jobs (an array id cancels the whole Slurm array); returns those that were active.
    Owner or root only, checked before anything is cancelled."""
    uid = os.getuid() if uid is None else uid
    targets, active = _cancellable(state, job_ids, uid)
    who = user_name(uid)
    with ClusterTable(state.clusters_db) as table:
        table.set_cancel_by([r.id for r in active], who)  # so the ending Slurm reports is recorded as theirs
        for cluster, keys in targets.items():
            try:
                slurm.scancel(keys, cluster)
            except GpuqError:
                table.set_cancel_by([r.id for r in active], None)
                raise
    refresh(state)
    _record_cancelled(state, active, who)
    return [r.id for r in active]


def _cancellable(state: StateDir, job_ids: Iterable[int], uid: int) -> tuple[dict[str, list[str]], list[JobRecord]]:
    """What to scancel, by cluster, and the active jobs that stops; refuses unknown ids and others' jobs."""
    targets: dict[str, list[str]] = {}
    active: list[JobRecord] = []
    with ClusterTable(state.clusters_db) as table:
        for job_id in dict.fromkeys(job_ids):
            record = table.get(job_id)
            arrays = table.arrays([job_id]) if record is None else {}
            if record is None and job_id not in arrays:
                raise UnknownJob(job_id)
            members = [record] if record is not None else table.members(job_id)
            for member in members:
                if uid != member.uid and not accounts.may_act(uid, member.uid, config.load().shared.admins):
                    raise NotPermitted(
                        f"job {member.id} belongs to {member.user}; only {member.user} or an admin can cancel it"
                    )
            running = [m for m in members if not m.state.finished]
            if running:
                key = arrays[job_id].external_id if job_id in arrays else running[0].external_id
                targets.setdefault(running[0].cluster or "", []).append(key or "")
                active.extend(running)
    return targets, active


def _record_cancelled(state: StateDir, records: Sequence[JobRecord], who: str) -> None:
    """scancel went through: a job Slurm still shows ending (COMPLETING) is recorded as cancelled now."""
    with ClusterTable(state.clusters_db) as table:
        still = [r for r in (table.get(m.id) for m in records) if r is not None and not r.state.finished]
        outcome = Outcome.cancelled(who)
        table.update([r.replace(state=outcome.state, reason=outcome.reason, ended_at=time.time()) for r in still])


def refuse_cluster_dependencies(state: StateDir, after: Iterable[int]) -> None:
    """A job on this machine cannot wait for a cluster job: gpuq's daemon does not follow those."""
    with ClusterTable(state.clusters_db) as table:
        for dep in after:
            record = table.get(dep)
            array = table.arrays([dep]).get(dep)
            if record is not None or array is not None:
                where = record.cluster if record is not None else array.cluster if array is not None else "?"
                raise BadInput(
                    f"job {dep} runs on cluster {where}, and a job on this machine cannot wait for it; send this "
                    f"one there too (--on {where}), or wait for it first (`gpuq wait {dep}`)"
                )


class Everywhere(Queue):
    """The local queue plus the jobs sent to clusters from the same state directory.

    Reads bring the cluster jobs up to date first, at most every ``REFRESH_EVERY`` seconds; ``notes``
    collects what the user should hear about (a cluster that did not answer).
    """

    def __init__(self, state: StateDir) -> None:
        super().__init__(state)
        self.notes: list[str] = []
        self._refreshed = -float("inf")

    def _clusters(self) -> ClusterTable:
        if time.monotonic() - self._refreshed >= REFRESH_EVERY:
            self.notes = refresh(self.state)
            self._refreshed = time.monotonic()
        return ClusterTable(self.state.clusters_db)

    def get(self, job_id: int) -> JobRecord:
        with self._clusters() as table:
            record = table.get(job_id)
        return record if record is not None else super().get(job_id)

    def details(self, job_id: int) -> JobRecord:
        with self._clusters() as table:
            record = table.get(job_id)
        if record is not None:
            return record
        return super().details(job_id)

    def resolve(self, ids: Iterable[int]) -> list[JobRecord]:
        wanted = list(dict.fromkeys(ids))
        found: list[JobRecord] = []
        local = []
        with self._clusters() as table:
            arrays = table.arrays(wanted)
            for job_id in wanted:
                record = table.get(job_id) if job_id not in arrays else None
                if job_id in arrays:
                    found.extend(table.members(job_id))
                elif record is not None:
                    found.append(record)
                else:
                    local.append(job_id)
        return found + (super().resolve(local) if local else [])

    def records(self, *, active_only: bool = False, limit: int | None = None) -> list[JobRecord]:
        with self._clusters() as table:
            remote = table.records(active_only=active_only, limit=limit)
        merged = sorted([*super().records(active_only=active_only, limit=limit), *remote], key=lambda r: r.id)
        return merged if limit is None else merged[-limit:]

    def lines(self) -> list[Line]:
        with self._clusters() as table:
            remote = [Line.of(r) for r in table.records()]
        return sorted([*super().lines(), *remote], key=lambda line: line.id) if remote else super().lines()

    def array_names(self) -> dict[int, str]:
        with ClusterTable(self.state.clusters_db) as table:
            return {**super().array_names(), **{a.id: a.name for a in table.arrays().values()}}

    def cancel(self, job_ids: Iterable[int], *, uid: int | None = None) -> list[int]:
        ids = list(dict.fromkeys(job_ids))
        remote = remote_ids(self.state, ids)
        local = [i for i in ids if i not in remote]
        uid = os.getuid() if uid is None else uid
        if remote:
            self._clusters().close()
            _cancellable(self.state, remote, uid)  # refuse before cancelling anything, here or there
        cancelled = super().cancel(local, uid=uid) if local else []
        return cancelled + (cancel(self.state, remote, uid=uid) if remote else [])


def remote_ids(state: StateDir, job_ids: Iterable[int]) -> set[int]:
    """Which of these ids are cluster jobs or arrays (their actions need no local daemon)."""
    with ClusterTable(state.clusters_db) as table:
        return {i for i in job_ids if table.get(i) is not None or i in table.arrays([i])}
