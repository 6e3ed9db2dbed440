"""Suspending a job to host memory (#28): the state and its records, the commands, the mechanism on the fake
inventory, and a daemon killed in the middle of it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome, Step
from gpuq_scheduler.jobs.store import schema
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from tests.conftest import Gpuq, make_env

GiB = 2**30


def _suspended_table(path: Path) -> JobTable:
    """Job 1 running on GPU 0, job 2 suspended from GPU 1 holding 38.2 GiB, job 3 pending."""
    table = JobTable(path, create=True)
    specs = [JobSpec(command=(f"/bin/job{i}",), cwd="/", mem_per_gpu=40 * GiB) for i in range(3)]
    table.insert_pending([JobRecord(i + 1, s, 0, "root", JobState.PENDING, float(i)) for i, s in enumerate(specs)])
    for job_id, gpu in ((1, 0), (2, 1)):
        table.mark_running(job_id, [gpu], [], 10.0, Launch(1, 1.0, "boot"))
    assert table.mark_step(2, Step.SUSPENDING)
    assert not table.mark_step(2, Step.SUSPENDING)  # one step at a time
    assert not table.mark_step(1, Step.RESUMING)  # a running job has nothing to resume
    table.mark_suspended(2, int(38.2 * GiB), 100.0)
    return table


def test_a_suspended_job_is_live_keeps_its_gpus_recorded_and_is_not_running(tmp_path: Path) -> None:
    table = _suspended_table(tmp_path / "jobs.db")
    job = table.get(2)
    assert job is not None and job.state is JobState.SUSPENDED and not job.state.finished
    assert job.gpus == (1,) and job.host_bytes == int(38.2 * GiB) and job.step is None
    assert job.reason == "38.2 GiB in host memory"
    # Placement counts the running jobs' GPUs: a suspended job's are free.
    assert [r.id for r, _ in table.running()] == [1]
    assert [r.id for r in table.records(active_only=True)] == [1, 2, 3]
    assert table.mark_step(2, Step.RESUMING)
    table.mark_resumed(2, 160.0)
    job = table.get(2)
    assert job is not None and job.state is JobState.RUNNING and job.suspended_for == 60.0 and job.reason == ""
    assert job.host_bytes is None and job.step is None
    table.close()


def test_a_suspended_job_that_ends_is_recorded_and_its_step_cleared(tmp_path: Path) -> None:
    table = _suspended_table(tmp_path / "jobs.db")
    assert table.finish(2, Outcome.killed(9), 120.0)
    job = table.get(2)
    assert job is not None and job.state is JobState.FAILED and job.step is None
    table.close()


def _as_version_3(path: Path) -> None:
    """Make a version-4 table what version 3 was: nothing suspended, no columns for it."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("DROP INDEX jobs_live")
    for column, _ in schema.SUSPENSION:
        db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
    db.execute("PRAGMA user_version=3")
    db.close()


def test_a_version_3_table_is_read_then_upgraded_by_the_daemon(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    table = JobTable(path, create=True)
    spec = JobSpec(command=("/bin/job",), cwd="/")
    table.insert_pending([JobRecord(i, spec, 0, "root", JobState.PENDING, float(i)) for i in (1, 2)])
    table.mark_running(1, [0], [], 10.0, Launch(1, 1.0, "boot"))
    table.finish(1, Outcome.succeeded(), 20.0)
    table.close()
    _as_version_3(path)
    reader = JobTable(path)  # `gpuq status` before the upgraded daemon has run
    assert [(r.state, r.step, r.host_bytes, r.suspended_for) for r in reader.records()] == [
        (JobState.SUCCEEDED, None, None, 0.0), (JobState.PENDING, None, None, 0.0),
    ]  # fmt: skip
    reader.close()
    daemon = JobTable(path, create=True)
    daemon.mark_running(2, [0], [], 30.0, Launch(1, 1.0, "boot"))
    assert daemon.mark_step(2, Step.SUSPENDING)
    daemon.mark_suspended(2, 4 * GiB, 40.0)
    assert [r.state for r in daemon.records(active_only=True)] == [JobState.SUSPENDED]
    daemon.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.TABLE_VERSION == 4
    assert db.execute("SELECT name FROM sqlite_master WHERE name='jobs_live'").fetchone() == ("jobs_live",)


def test_status_and_show_say_what_a_suspended_job_holds_in_host_memory(tmp_path: Path) -> None:
    home = tmp_path / "state"
    StateDir(home).ensure()
    _suspended_table(home / "jobs.db").close()
    cli = Gpuq(home, make_env(home), tmp_path)
    listing = cli.run("status", "--all").stdout
    line = next(row for row in listing.splitlines() if row.split()[:1] == ["2"])
    assert "suspended" in line and "38.2 GiB in host memory" in line
    assert json.loads(cli.run("status", "--all", "--json").stdout)[1]["state"] == "suspended"
    shown = cli.run("show", "2").stdout
    assert "38.2 GiB in host memory" in shown and "gpuq resume 2" in shown


def test_the_old_resume_spelling_says_what_to_type_instead_and_changes_nothing(one_gpu: Gpuq) -> None:
    one_gpu.run("pause")
    waiting = one_gpu.submit("--gpus", "0", "true")
    old = one_gpu.run("resume", check=False)
    assert old.returncode == 2 and old.stderr.count("\n") == 1 and "type `gpuq unpause`" in old.stderr
    one_gpu.run("undrain", "0")  # a GPU that is not drained: nothing to undo, and no error
    one_gpu.run("drain", "0")
    old = one_gpu.run("resume", "0", check=False)
    assert old.returncode == 2 and old.stderr.count("\n") == 1 and "type `gpuq undrain 0`" in old.stderr
    assert one_gpu.job(waiting)["state"] == "pending"  # still paused
    assert not list((one_gpu.home / "spool").rglob("control-*"))  # nothing was asked of the daemon
    one_gpu.run("unpause")
    one_gpu.wait_state(waiting, "succeeded")


def test_only_a_running_job_is_suspended_and_only_a_suspended_one_resumed(one_gpu: Gpuq) -> None:
    one_gpu.run("pause")
    waiting = one_gpu.submit("true")
    for action, words in (("suspend", "can only suspend a running one"), ("resume", "can only resume a suspended one")):
        refused = one_gpu.run(action, str(waiting), check=False)
        assert refused.returncode == 2
        assert refused.stderr.strip() == f"gpuq: job {waiting} is pending; `gpuq {action}` {words}"
    unknown = one_gpu.run("suspend", "999", check=False)
    assert unknown.returncode == 2 and "999" in unknown.stderr and unknown.stderr.count("\n") == 1
