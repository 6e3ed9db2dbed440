"""Suspending a job to host memory (#28): the state and its records, the commands, the mechanism on the fake
inventory, and a daemon killed in the middle of it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome, Step
from gpuq_scheduler.jobs.store import schema
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from tests.conftest import Gpuq, counted, fake_cuda_queue, make_env, wait_for

GiB = 2**30
COUNTER = Path(__file__).parent / "fixtures" / "fake_counter.py"


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
        (JobState.SUCCEEDED, None, None, 0.0),
        (JobState.PENDING, None, None, 0.0),
    ]
    reader.close()
    daemon = JobTable(path, create=True)
    daemon.mark_running(2, [0], [], 30.0, Launch(1, 1.0, "boot"))
    assert daemon.mark_step(2, Step.SUSPENDING)
    daemon.mark_suspended(2, 4 * GiB, 40.0)
    assert [r.state for r in daemon.records(active_only=True)] == [JobState.SUSPENDED]
    daemon.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.TABLE_VERSION == 5
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


def _counting_queue(tmp_path: Path, **extra: str) -> Gpuq:
    queue = fake_cuda_queue(tmp_path, "1x80GiB", **{"GPUQ_FAKE_HOST_MEMORY": "256GiB", **extra})
    shutil.copy(COUNTER, queue.cwd / "fake_counter.py")
    return queue


def _suspended_counter(queue: Gpuq, last: int = 100_000, *more: str) -> tuple[int, Path]:
    """A counting job holding 60 GiB of the one GPU, suspended once it counted and its memory was seen."""
    counts = queue.cwd / "counts"
    job = queue.submit(*more, "fake_counter.py", "60", str(counts), str(last))
    wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count and be seen")
    assert queue.run("suspend", str(job)).stdout == f"suspending job {job}\n"
    queue.wait_state(job, "suspended", timeout=60)
    return job, counts


@pytest.mark.parametrize("containment", ["auto", "fallback"])
def test_suspend_frees_the_gpu_for_another_job_and_resume_goes_on_from_where_it_stopped(
    tmp_path: Path, containment: str
) -> None:
    """Its cgroup frozen where it has one (gpus.json says which), else each of its processes stopped."""
    queue = _counting_queue(tmp_path, GPUQ_CONTAINMENT=containment)
    try:
        job, counts = _suspended_counter(queue)
        shown = queue.job(job)
        assert shown["host_bytes"] == int(60.5 * GiB) and shown["gpus"] == [0] and shown["step"] is None
        assert "60.5 GiB in host memory" in queue.run("status").stdout
        stopped = counted(counts)
        # The GPU is free: a job that needs 70 of its 80 GiB runs there now, and ends.
        other = queue.submit("--gpus", "1", "fake_cuda.py", "70", "0.2")
        assert queue.wait_state(other, "succeeded", "failed")["state"] == "succeeded"
        assert counted(counts) == stopped  # no progress while suspended
        assert queue.run("resume", str(job)).stdout == f"resuming job {job}\n"
        queue.wait_state(job, "running")
        wait_for(lambda: len(counted(counts)) > len(stopped) + 5, 30, "the job to count on")
        assert counted(counts)[: len(stopped) + 5] == list(range(1, len(stopped) + 6))  # on from where it was
        resumed = queue.job(job)
        assert resumed["host_bytes"] is None and resumed["suspended_for"] > 0 and resumed["reason"] == ""
        queue.run("cancel", str(job))
        queue.wait_state(job, "cancelled")
    finally:
        queue.cleanup()


def test_the_time_limit_does_not_run_while_suspended(tmp_path: Path) -> None:
    """A job of about 3 s of counting under a 6 s limit, suspended for longer than its whole limit: it ends
    as it would have without the suspension, having counted to the end, not as a timeout."""
    queue = _counting_queue(tmp_path)
    try:
        job, counts = _suspended_counter(queue, 150, "--time", "6s")
        until = time.monotonic() + 7
        wait_for(lambda: time.monotonic() > until and queue.job(job)["state"] == "suspended", 30, "7 s suspended")
        queue.run("resume", str(job))
        assert queue.wait_state(job, "succeeded", "timeout", "failed")["state"] == "succeeded"
        assert counted(counts) == list(range(1, 151))
    finally:
        queue.cleanup()


def test_a_job_the_driver_cannot_checkpoint_is_left_running_and_says_why(tmp_path: Path) -> None:
    """A client of an MPS server: the driver's lock answers 801 (not supported), as the fake's does. The
    suspend is undone, the job runs on, and its reason says why."""
    queue = _counting_queue(tmp_path, CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "mps"))
    try:
        counts = queue.cwd / "counts"
        job = queue.submit("fake_counter.py", "10", str(counts), "100000")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count and be seen")
        queue.run("suspend", str(job))
        refused = wait_for(lambda: "not suspended" in (shown := queue.job(job))["reason"] and shown, 30, "a refusal")
        assert refused["state"] == "running" and refused["step"] is None
        why = "it runs as a client of an MPS server, which the driver cannot checkpoint"
        assert refused["reason"] == f"not suspended: {why}"
        before = len(counted(counts))
        wait_for(lambda: len(counted(counts)) > before + 5, 30, "the job to count on")
        queue.run("cancel", str(job))
    finally:
        queue.cleanup()


def test_too_little_host_memory_refuses_the_suspend(tmp_path: Path) -> None:
    queue = _counting_queue(tmp_path, GPUQ_FAKE_HOST_MEMORY="32GiB")
    try:
        counts = queue.cwd / "counts"
        job = queue.submit("fake_counter.py", "60", str(counts), "100000")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count and be seen")
        queue.run("suspend", str(job))
        refused = wait_for(lambda: "not suspended" in (shown := queue.job(job))["reason"] and shown, 30, "a refusal")
        assert refused["state"] == "running" and refused["step"] is None
        assert "60.5 GiB of GPU state would not fit in the host's 32.0 GiB" in refused["reason"]
        queue.run("cancel", str(job))
    finally:
        queue.cleanup()


def _restart(queue: Gpuq) -> None:
    queue.kill_daemon()
    queue.run("daemon", "start")


def test_a_daemon_killed_while_a_job_is_suspended_finds_it_suspended_and_can_resume_it(tmp_path: Path) -> None:
    queue = _counting_queue(tmp_path)
    try:
        job, counts = _suspended_counter(queue)
        stopped = counted(counts)
        _restart(queue)
        other = queue.submit("--gpus", "1", "fake_cuda.py", "70", "0.2")  # its GPU is still free
        assert queue.wait_state(other, "succeeded", "failed")["state"] == "succeeded"
        assert queue.job(job)["state"] == "suspended" and counted(counts) == stopped
        queue.run("resume", str(job))
        wait_for(lambda: len(counted(counts)) > len(stopped) + 5, 30, "the job to count on")
        assert counted(counts)[: len(stopped) + 5] == list(range(1, len(stopped) + 6))
        queue.run("cancel", str(job))
    finally:
        queue.cleanup()


def test_a_daemon_killed_in_the_middle_of_a_suspend_undoes_it_and_places_nothing_on_its_gpu(tmp_path: Path) -> None:
    """The checkpoint takes 3 s here; the daemon is killed while it runs. Its helper finishes on its own;
    the next daemon waits for it, then undoes the suspend: the job counts on, on its GPU, and a job that
    wants that GPU waits for it (nothing is placed twice)."""
    queue = _counting_queue(tmp_path, GPUQ_FAKE_CHECKPOINT_SECONDS="3")
    try:
        counts = queue.cwd / "counts"
        job = queue.submit("fake_counter.py", "60", str(counts), "100000")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count and be seen")
        queue.run("suspend", str(job))
        wait_for(lambda: queue.job(job)["step"] == "suspending", 30, "the suspend to begin")
        _restart(queue)
        other = queue.submit("--gpus", "1", "fake_cuda.py", "70", "0.2")
        wait_for(lambda: (shown := queue.job(job))["state"] == "running" and shown["step"] is None, 60, "the undo")
        before = len(counted(counts))
        wait_for(lambda: len(counted(counts)) > before + 5, 30, "the job to count on")
        assert queue.job(other)["state"] == "pending"
        queue.run("cancel", str(job))
        assert queue.wait_state(other, "succeeded", "failed")["state"] == "succeeded"
        assert counted(counts) == list(range(1, len(counted(counts)) + 1))
    finally:
        queue.cleanup()


def test_a_daemon_killed_in_the_middle_of_a_resume_finishes_it(tmp_path: Path) -> None:
    queue = _counting_queue(tmp_path, GPUQ_FAKE_CHECKPOINT_SECONDS="2")
    try:
        job, counts = _suspended_counter(queue)
        stopped = counted(counts)
        queue.run("resume", str(job))
        wait_for(lambda: queue.job(job)["step"] == "resuming", 30, "the resume to begin")
        _restart(queue)
        other = queue.submit("--gpus", "1", "fake_cuda.py", "70", "0.2")  # the resuming job holds the GPU
        wait_for(lambda: (shown := queue.job(job))["state"] == "running" and shown["step"] is None, 60, "the resume")
        wait_for(lambda: len(counted(counts)) > len(stopped) + 5, 30, "the job to count on")
        assert counted(counts)[: len(stopped) + 5] == list(range(1, len(stopped) + 6))
        assert queue.job(other)["state"] == "pending"
        queue.run("cancel", str(job))
        assert queue.wait_state(other, "succeeded", "failed")["state"] == "succeeded"
    finally:
        queue.cleanup()


def test_a_suspended_job_whose_process_dies_is_recorded_so(tmp_path: Path) -> None:
    queue = _counting_queue(tmp_path)
    try:
        job, _ = _suspended_counter(queue)
        pid = json.loads((queue.home / "run" / f"{job}.pid").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        ended = queue.wait_state(job, "failed", "cancelled", "lost")
        assert ended["cause"] == "died-suspended" and ended["signal"] == signal.SIGKILL
        assert ended["reason"] == "died while suspended (killed by SIGKILL)"
    finally:
        queue.cleanup()


HAND_WRITTEN = """
import sys
from pathlib import Path
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.store.statedir import StateDir
state = StateDir(Path(sys.argv[1]))
outbox.write_control(state, Action.SUSPEND, [int(sys.argv[2])])
outbox.poke(state)
"""


def test_an_mps_fenced_job_is_refused_in_one_line_and_by_the_daemon(tmp_path: Path) -> None:
    queue = _counting_queue(tmp_path, GPUQ_FAKE_MPS="1")
    try:
        counts = queue.cwd / "counts"
        job = queue.submit("--mem", "12G", "fake_counter.py", "5", str(counts), "100000")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count and be seen")
        refused = queue.run("suspend", str(job), check=False)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1
        assert f"job {job} runs as a client of an MPS server" in refused.stderr
        assert not list((queue.home / "spool").glob("control-*"))  # nothing was asked
        # Asked all the same (the client's checks bypassed): the daemon refuses it too, and it runs on.
        subprocess.run([sys.executable, "-c", HAND_WRITTEN, str(queue.home), str(job)], env=queue.env, check=True)
        refusal = wait_for(lambda: "not suspended" in (shown := queue.job(job))["reason"] and shown, 30, "a refusal")
        assert refusal["state"] == "running" and "client of an MPS server" in refusal["reason"]
        before = len(counted(counts))
        wait_for(lambda: len(counted(counts)) > before + 5, 30, "the job to count on")
        queue.run("cancel", str(job))
    finally:
        queue.cleanup()
