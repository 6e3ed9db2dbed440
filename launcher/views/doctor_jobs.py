"""``gpuq doctor``'s checks of the jobs the table holds: each record against its state, each running job
against its supervisor, the GPUs they hold against the inventory, a shared queue's private files, processes
left in an ended job's cgroup and batch jobs idle on their GPUs.

A running job whose supervisor is gone is looked up again after its exit file was looked for, so a daemon
recording its end meanwhile causes no false alarm.
"""

from __future__ import annotations

import os
import sqlite3
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from gpuq_scheduler.jobs import causes
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.shown import shown
from gpuq_scheduler.jobs.store import private
from gpuq_scheduler.jobs.store.notices import read_idle_batch
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.schema import LIVE_STATES, states
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.units import format_size
from gpuq_scheduler.launcher.views.doctor_findings import ERROR, WARNING, Problem, quote
from gpuq_scheduler.launcher.views.doctor_table import StoredRow


def running(state: StateDir, db: sqlite3.Connection, rows: list[StoredRow]) -> Iterator[Problem]:
    """Each running job must be supervised (its shim alive) or have left its outcome in an exit file."""
    from gpuq_scheduler.launcher.supervisor import processes

    boot = processes.boot_id()
    for row in rows:
        if row.state != JobState.RUNNING.value or row.started_at is None:
            continue
        if row.boot_id is not None and row.boot_id != boot:
            yield Problem(
                ERROR,
                f"job {row.id} was running when the machine restarted; start the daemon "
                "(`gpuq daemon start`): it records the job as lost and frees its GPUs",
            )
            continue
        if row.shim_pid is not None and processes.is_alive(row.shim_pid, row.shim_start):
            continue
        if os.path.exists(state.exit_file(row.id)):
            continue  # it ended; the daemon collects the outcome when it next runs
        still = db.execute("SELECT state FROM jobs WHERE id=?", (row.id,)).fetchone()
        if still is None or still[0] != JobState.RUNNING.value:
            continue  # a daemon recorded its end while we looked
        yield Problem(
            ERROR,
            f"job {row.id} is recorded as running, but its gpuq supervisor (pid {row.shim_pid}) is gone "
            "and left no exit file; start the daemon (`gpuq daemon start`): it records the job as lost "
            "or queues it again",
        )


def records(rows: list[StoredRow]) -> Iterator[Problem]:
    """Each record's fields must match its state."""
    known = {s.value for s in JobState}
    for row in rows:
        if row.state not in known:
            yield Problem(ERROR, f"job {row.id} has an unknown state {row.state!r}; a newer gpuq may have written it")
            continue
        job_state = JobState(row.state)
        if job_state.finished:
            if row.ended_at is None:
                yield Problem(ERROR, f"job {row.id} is {row.state} but has no end time; its record was cut short")
            if row.started_at is not None and row.log and not os.path.exists(row.log):
                yield Problem(WARNING, f"the log of job {row.id} ({row.log}) is missing; it was deleted or moved")
        elif job_state is JobState.RUNNING:
            if row.started_at is None:
                yield Problem(
                    ERROR, f"job {row.id} is running but has no start time; cancel it (`gpuq cancel {row.id}`)"
                )
            wanted = None if row.spec is None else row.spec.gpus
            if wanted and not row.gpus:
                yield Problem(
                    ERROR,
                    f"job {row.id} is running without GPUs although it asked for {wanted}; "
                    f"cancel it (`gpuq cancel {row.id}`) and submit it again",
                )
            elif wanted is not None and row.gpus and len(row.gpus) != wanted:
                yield Problem(ERROR, f"job {row.id} asked for {wanted} GPU(s) but runs on {len(row.gpus)}; cancel it")
        elif row.started_at is not None or row.gpus or row.ended_at is not None:
            yield Problem(
                ERROR,
                f"job {row.id} is pending but has a start or end time or GPUs; cancel it "
                f"(`gpuq cancel {row.id}`) and submit it again",
            )


def gpus(state: StateDir, rows: list[StoredRow]) -> Iterator[Problem]:
    """No GPU shared by a whole-GPU job, no GPU promised more memory than it has."""
    from gpuq_scheduler.launcher.policy.placement import Policy

    inventory = Queue(state).inventory()
    if inventory is None and state.inventory.exists():
        yield Problem(
            WARNING,
            f"{state.inventory} cannot be read; the daemon rewrites it at its next look at the GPUs "
            "(`gpuq daemon start`)",
        )
    overhead = Policy().overhead
    holders: dict[int, list[StoredRow]] = defaultdict(list)
    for row in rows:
        if row.state == JobState.RUNNING.value and row.spec is not None:
            for gpu in row.gpus:
                holders[gpu].append(row)
    for gpu, jobs in sorted(holders.items()):
        ids = ", ".join(str(j.id) for j in jobs)
        whole = [j for j in jobs if j.spec is not None and j.spec.mem_per_gpu is None]
        if whole and len(jobs) > 1:
            yield Problem(
                ERROR,
                f"GPU {gpu} is shared by jobs {ids}, although job {whole[0].id} should have it to itself; "
                f"cancel one of them (`gpuq cancel {jobs[-1].id}`)",
            )
            continue
        if inventory is None:
            continue
        if gpu >= len(inventory.totals):
            yield Problem(
                WARNING,
                f"jobs {ids} run on GPU {gpu}, which the GPU inventory ({len(inventory.totals)} GPUs) "
                "does not list; check `gpuq gpus`",
            )
            continue
        total = inventory.totals[gpu]
        promised = sum(j.spec.mem_per_gpu + overhead for j in jobs if j.spec is not None and j.spec.mem_per_gpu)
        if not whole and promised > total:
            yield Problem(
                ERROR,
                f"GPU {gpu} has {format_size(promised)} promised to jobs {ids} (with "
                f"{format_size(overhead)} overhead each), more than its {format_size(total)}; "
                f"cancel one of them (`gpuq cancel {jobs[-1].id}`)",
            )


def private_files(state: StateDir, db: sqlite3.Connection) -> Iterator[Problem]:
    """A shared queue's live job whose private file (its command) is missing or not its owner's: the daemon
    refuses such a file (``jobs.store.private``), so the job fails at its start rather than run what another
    user wrote. Only names and owners are looked at: anyone may run this, as anyone may run doctor."""
    live = db.execute(
        f"SELECT COALESCE(array_id, id), uid, MIN(id) FROM jobs WHERE {LIVE_STATES}"
        " AND json_extract(spec, '$.command') = json_array(?) GROUP BY COALESCE(array_id, id), uid",
        (private.HIDDEN,),
    ).fetchall()
    for owner_id, uid, job_id in live:
        path = state.private_file(int(owner_id))
        try:
            problem = private.not_owned(os.lstat(path), int(uid))
        except FileNotFoundError:
            problem = "is missing"
        except OSError as err:
            problem = f"cannot be looked at ({err.strerror})"
        if problem:
            yield Problem(
                ERROR,
                f"the private part of job {job_id} ({quote(Path(path))}) {problem}: the daemon refuses it "
                f"and the job fails when it would start; `gpuq cancel {job_id}` as an admin and ask its "
                "owner to submit it again",
            )


def stray_processes(state: StateDir, db: sqlite3.Connection) -> Iterator[Problem]:
    """A job that is not running has no process left in its cgroup: containment ends them all with it. The
    job's state is read after its cgroup was, so a job starting meanwhile is not taken for one that ended."""
    from gpuq_scheduler.launcher.supervisor.containment import occupied, read_record

    recorded = read_record(str(state.inventory))
    if recorded is None or not recorded.group:
        return
    for job_id, count in occupied(recorded.group).items():
        found = db.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
        if found is None or found[0] != "running":
            where = f"{recorded.group}/job-{job_id}"
            yield Problem(
                WARNING,
                f"job {job_id} is not running, but {count} process(es) are still in its cgroup {where}; "
                f"`echo 1 > {where}/cgroup.kill` ends them",
            )


def idle_batch(state: StateDir, db: sqlite3.Connection) -> Iterator[Problem]:
    """Batch jobs holding GPUs that have done no work for hours: the daemon's typed notice of them, for the
    jobs still running (a job that ended since is no one's problem)."""
    idle = read_idle_batch(state)
    if not idle:
        return
    marks = ",".join("?" * len(idle))
    query = f"SELECT id, user FROM jobs WHERE {states(JobState.RUNNING)} AND id IN ({marks}) ORDER BY id"
    for job_id, user in db.execute(query, list(idle)).fetchall():
        yield Problem(
            WARNING,
            f"job {job_id} of {shown(str(user))} holds GPUs that did no work: "
            f"{causes.idle_batch(idle[job_id])}; ask them, or `gpuq cancel {job_id}` as an admin",
        )
