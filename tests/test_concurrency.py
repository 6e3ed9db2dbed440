"""Many clients at once against one real daemon on fake GPUs: 8 processes submit, cancel and read the
queue at random, while another runs the doctor over and over. Afterwards nothing is lost or duplicated,
every cancel either took effect or came after the job had ended, no reader ever saw a half-written or
self-contradicting record, and the doctor finds nothing. ``bench/soak.py --concurrency`` runs the same
workload at 16 x 500.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import sqlite3
import subprocess
import time
import traceback
from dataclasses import asdict, dataclass, field
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest

from gpuq_scheduler.jobs.errors import UnknownJob
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store import spool
from gpuq_scheduler.jobs.store.queue import Queue, expand
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from tests.conftest import CLICK, Gpuq

PROCESSES = 8
OPERATIONS = 60
STATES = {s.value for s in JobState}
SHAPES: list[dict[str, Any]] = [
    {"gpus": 0},
    {"gpus": 1},
    {"gpus": 1, "mem": "10G"},
    {"gpus": 1, "mem": "10G"},
    {"gpus": 2},
    {"gpus": 2, "mem": "30G"},
]
SECONDS = ["0", "0.05", "0.1", "0.3", "1"]


@dataclass
class ClientLog:
    """What one client did and saw. Plain data, so it crosses process boundaries as JSON."""

    worker: int
    submitted: list[int] = field(default_factory=list)
    cancels: list[tuple[int, bool]] = field(default_factory=list)  # (job id, still active so the cancel was sent)
    reads: int = 0
    bad_reads: list[str] = field(default_factory=list)  # records that were half-written or contradicted themselves
    unseen: list[str] = field(default_factory=list)  # a job of ours the queue did not show after submit returned
    errors: list[str] = field(default_factory=list)  # anything that raised


def client(home: str, env: dict[str, str], worker: int, operations: int, seed: int, go: Event, out: str) -> None:
    """One client process: ``operations`` random submits, cancels and reads, as fast as it can."""
    os.environ.clear()
    os.environ.update(env)  # so that any daemon this client starts sees the same fake GPUs
    from gpuq_scheduler.jobs import api
    from gpuq_scheduler.jobs.store.queue import Queue

    rng = random.Random(seed)
    queue = Queue(StateDir(Path(home)))
    log = ClientLog(worker)
    go.wait(60)
    for _ in range(operations):
        roll = rng.random()
        try:
            if roll < 0.45:
                shape = rng.choice(SHAPES)
                log.submitted.append(api.submit(["sleep", rng.choice(SECONDS)], home=home, **shape))
            elif roll < 0.6 and log.submitted:
                mine = rng.random() < 0.7
                target = rng.choice(log.submitted) if mine else rng.randint(1, max(log.submitted))
                try:
                    log.cancels.append((target, target in api.cancel([target], home=home)))
                except UnknownJob:
                    if mine:  # another client's id may be allocated but not yet written: only ours must be known
                        log.unseen.append(f"cancel: job {target} unknown after its submit returned")
            else:
                _read(queue, log, rng, env)
        except Exception:
            log.errors.append(traceback.format_exc())
    Path(out).write_text(json.dumps(asdict(log)))


def _read(queue: Any, log: ClientLog, rng: random.Random, env: dict[str, str]) -> None:
    log.reads += 1
    known = list(log.submitted)
    kind = rng.random()
    if kind < 0.08:  # the real command now and then: its JSON is what scripts read
        result = subprocess.run(
            [*CLICK, "status", "--all", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode != 0:
            log.errors.append(f"gpuq status exited {result.returncode}: {result.stderr}")
            return
        jobs = json.loads(result.stdout)
        log.bad_reads += [f"status --json: {job}" for job in jobs if _contradiction(job)]
        seen = {job["id"] for job in jobs}
    elif kind < 0.6 or not known:
        records = queue.records()
        log.bad_reads += [f"records: {r.to_json()}" for r in records if _contradiction(r.to_json())]
        seen = {r.id for r in records}
    else:
        job_id = rng.choice(known)
        try:
            record: JobRecord = queue.get(job_id)
        except UnknownJob:
            log.unseen.append(f"get: job {job_id} unknown after its submit returned")
            return
        if _contradiction(record.to_json()):
            log.bad_reads.append(f"get: {record.to_json()}")
        seen = {record.id}
        known = [job_id]
    log.unseen += [f"a read did not show job {i}, submitted before it" for i in known if i not in seen]


def _contradiction(job: dict[str, Any]) -> bool:
    """True when a record's fields cannot all be true at once: what a torn write would look like."""
    state = job.get("state")
    if state not in STATES:
        return True
    started, ended, gpus = job["started_at"], job["ended_at"], job["gpus"]
    if state == "pending":
        return started is not None or ended is not None or bool(gpus)
    if state == "running":
        return started is None or ended is not None or len(gpus) != job["gpus_requested"]
    return ended is None


def doctor_watch(home: str, env: dict[str, str], stop: Event, out: str) -> None:
    """Run the doctor in a loop while the clients work: a busy queue must not look broken to it."""
    os.environ.clear()
    os.environ.update(env)
    from gpuq_scheduler.launcher.views import doctor

    errors: list[str] = []
    runs = 0
    while not stop.is_set():
        errors += [p.message for p in doctor.check(StateDir(Path(home))) if p.severity == "error"]
        runs += 1
    Path(out).write_text(json.dumps({"runs": runs, "errors": errors}))


@dataclass
class Workload:
    clients: list[ClientLog]
    doctor_runs: int
    doctor_errors: list[str]
    seconds: float


def run_workload(home: Path, env: dict[str, str], processes: int, operations: int, seed: int) -> Workload:
    """Start ``processes`` clients at once (plus a doctor), wait for all of them, and collect their logs."""
    context = multiprocessing.get_context("spawn")
    go, stop = context.Event(), context.Event()
    outs = [home.parent / f"client-{i}.json" for i in range(processes)]
    watch_out = home.parent / "doctor.json"
    clients = [
        context.Process(target=client, args=(str(home), env, i, operations, seed * 1000 + i, go, str(out)))
        for i, out in enumerate(outs)
    ]
    watcher = context.Process(target=doctor_watch, args=(str(home), env, stop, str(watch_out)))
    for process in [*clients, watcher]:
        process.start()
    started = time.monotonic()
    go.set()
    try:
        for process in clients:
            process.join(timeout=max(1.0, 30 + operations * 3 - (time.monotonic() - started)))
            assert process.exitcode == 0, f"a client exited with {process.exitcode}"
    finally:
        stop.set()
        watcher.join(timeout=60)
        for process in [*clients, watcher]:
            if process.is_alive():
                process.kill()
    seconds = time.monotonic() - started
    watched = json.loads(watch_out.read_text())
    logs = [ClientLog(**json.loads(out.read_text())) for out in outs]
    for log in logs:
        log.cancels = [(int(job), bool(sent)) for job, sent in log.cancels]
    return Workload(logs, watched["runs"], watched["errors"], seconds)


def verify(home: Path, work: Workload, *, visibility: bool = True) -> list[str]:
    """Everything that went wrong, as sentences; empty when the queue kept every promise.

    ``visibility=False`` leaves out jobs a read missed while the daemon ingested them (a known race in
    jobs/store/queue.py, pinned by test_a_job_stays_visible_while_the_daemon_ingests_it).
    """
    failures: list[str] = []
    ids = [job for log in work.clients for job in log.submitted]
    if len(ids) != len(set(ids)):
        failures.append(f"submits returned the same id twice: {sorted(i for i in set(ids) if ids.count(i) > 1)}")
    db = sqlite3.connect(home / "jobs.db")
    try:
        rows = dict(db.execute("SELECT id, state FROM jobs").fetchall())
    finally:
        db.close()
    if set(rows) != set(ids):
        failures.append(f"lost: {sorted(set(ids) - set(rows))}; never submitted: {sorted(set(rows) - set(ids))}")
    leftovers = [p.name for p in (home / "spool").iterdir() if p.name != "rejected"]
    if leftovers:
        failures.append(f"requests left in the spool: {leftovers}")
    sent = {job for log in work.clients for job, active in log.cancels if active}
    for job_id, job_state in sorted(rows.items()):
        if job_state == "cancelled" and job_id not in sent:
            failures.append(f"job {job_id} was cancelled, but nobody cancelled it")
        elif job_state != "cancelled" and job_state != "succeeded":
            failures.append(f"job {job_id} ended {job_state}")
    for log in work.clients:
        failures += [f"client {log.worker} raised: {error}" for error in log.errors]
        failures += [f"client {log.worker} read a torn record: {bad}" for bad in log.bad_reads]
        failures += [f"client {log.worker}: {unseen}" for unseen in log.unseen if visibility]
    failures += [f"the doctor, while clients worked: {error}" for error in work.doctor_errors]
    for number, line in enumerate((home / "events.jsonl").read_text().splitlines()):
        try:
            json.loads(line)
        except ValueError:
            failures.append(f"events.jsonl line {number + 1} is torn: {line[:80]!r}")
    return failures


def settle(home: Path, env: dict[str, str], work: Workload, timeout: float) -> None:
    """Wait until every submitted job has ended."""
    from gpuq_scheduler.jobs import api

    ids = [job for log in work.clients for job in log.submitted]
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        api.wait(ids, home=home, timeout=timeout)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def ingest_between_reads(state: StateDir) -> list[str]:
    """Play the daemon ingesting the spool at the worst moment for a reader: right after the reader's
    first look at the table. Returns what the reader got wrong (nothing, when reads are ordered right)."""
    queue = Queue(state)
    spec = JobSpec(command=("true",), cwd=str(state.root), gpus=0)
    armed: list[bool] = []

    def ingest() -> None:
        table = JobTable(state.db, create=True)
        try:
            for request in spool.scan(state)[0]:
                if isinstance(request, spool.SubmitRequest):
                    table.insert_pending(expand(state, request))  # committed, then the request is deleted
                    spool.remove(request)
        finally:
            table.close()

    def after(read: Any) -> Any:
        def wrapped(self: JobTable, *args: Any, **kwargs: Any) -> Any:
            result = read(self, *args, **kwargs)
            if armed:
                armed.clear()
                ingest()
            return result

        return wrapped

    wrong = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(JobTable, "records", after(JobTable.records))
        patch.setattr(JobTable, "get", after(JobTable.get))
        listed = queue.submit(spec)
        armed.append(True)
        if listed not in {r.id for r in queue.records()}:
            wrong.append(f"records() did not list job {listed}, submitted before it")
        fetched = queue.submit(spec)
        armed.append(True)
        try:
            queue.get(fetched)
        except UnknownJob:
            wrong.append(f"get({fetched}) said there is no such job")
    return wrong


def test_a_job_stays_visible_while_the_daemon_ingests_it(tmp_path: Path) -> None:
    assert ingest_between_reads(StateDir(tmp_path / "state")) == []


def test_eight_clients_submitting_cancelling_and_reading_at_once_lose_and_duplicate_nothing(
    gpuq: Gpuq, tmp_path: Path
) -> None:
    from gpuq_scheduler.launcher.views import doctor

    visibility = not ingest_between_reads(StateDir(tmp_path / "probe"))  # checked here too, once store.py is fixed
    gpuq.run("daemon", "start")
    work = run_workload(gpuq.home, gpuq.env, PROCESSES, OPERATIONS, seed=1)
    settle(gpuq.home, gpuq.env, work, timeout=180)
    failures = verify(gpuq.home, work, visibility=visibility)
    assert not failures, "\n".join(failures[:30])
    assert sum(len(log.submitted) for log in work.clients) > PROCESSES * OPERATIONS // 3
    assert sum(sent for log in work.clients for _, sent in log.cancels) > 10
    assert work.doctor_runs > 3
    assert doctor.check(StateDir(gpuq.home)) == []
