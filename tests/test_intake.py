"""One user's input never stops the queue (issue 25): requests checked whole, what still breaks a pass set
aside, a daemon whose passes keep failing saying so, user text escaped on terminals, --mem auto per user.

Against a real daemon on a personal queue where one user suffices; tests/test_hostile_users.py acts as a
second Unix user against a shared queue.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuq_scheduler.jobs import api
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.shown import shown
from gpuq_scheduler.jobs.store import outbox, spool
from gpuq_scheduler.jobs.store.queue import expand
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.jobs.submission import capture_spec, kind_of
from gpuq_scheduler.launcher.daemon import learning
from tests.conftest import Gpuq, fake_cuda_queue, make_env, wait_for

GOOD_GPUS = {"gpus": [{"name": "H100", "total": "80GiB"}, {"name": "H100", "total": "80GiB"}]}


@pytest.mark.parametrize(
    ("command", "env"),
    [(["echo", "a\0b"], {}), (["echo", "ok"], {"TOKEN": "x\0y"}), (["echo", "ok"], {"K": "\udcff"})],
    ids=["nul-in-argument", "nul-in-environment", "not-utf8-in-environment"],
)
def test_a_nul_byte_through_the_api_is_refused_and_queues_nothing(
    tmp_path: Path, command: list[str], env: dict[str, str]
) -> None:
    """Once accepted, the launch of such a job failed and was retried about once a second for ever."""
    home = tmp_path / "state"
    with pytest.raises(BadInput) as refused:
        api.submit(command, gpus=0, env=env, home=home)
    assert "\n" not in str(refused.value) and ("NUL" in str(refused.value) or "UTF-8" in str(refused.value))
    assert not (home / "spool").exists() or not [p for p in (home / "spool").iterdir() if p.name != "rejected"]


def test_a_daemon_whose_passes_keep_failing_says_so_in_status_and_doctor(tmp_path: Path) -> None:
    """A pass that fails (here: the GPU inventory cannot be read) once only reached the daemon's log; users saw
    a queue that did not move and `gpuq doctor` found nothing."""
    inventory = tmp_path / "gpus.json"
    inventory.write_text(json.dumps(GOOD_GPUS))
    queue = Gpuq(tmp_path / "state", make_env(tmp_path / "state", str(inventory)), tmp_path)
    try:
        queue.run("daemon", "start")
        first = queue.submit("--gpus", "0", "true")
        queue.wait_state(first, "succeeded")
        assert "pass has failed" not in queue.run("status").stderr
        inventory.write_text("{ not json")
        queue.run("submit", "--gpus", "0", "true")  # wakes the daemon

        def failing() -> str | None:
            said = queue.run("status").stderr
            return said if "the daemon's pass has failed" in said else None

        said = wait_for(failing, 20, "status to say the passes fail")
        assert "times since" in said and str(inventory) in said, said
        doctor = queue.run("doctor", check=False)
        assert doctor.returncode == 1 and "the daemon's pass has failed" in doctor.stdout, doctor.stdout
        inventory.write_text(json.dumps(GOOD_GPUS))  # mended: the next pass succeeds and the note goes
        wait_for(lambda: "pass has failed" not in queue.run("status").stderr, 20, "the note to go")
        assert "pass has failed" not in queue.run("doctor", check=False).stdout
    finally:
        queue.cleanup()


def test_a_table_row_that_breaks_placement_fails_alone_and_the_queue_goes_on(gpuq: Gpuq) -> None:
    """A pending job whose stored spec makes placement raise (here a --like id beyond SQLite's integers, as an
    older gpuq let in) once failed every pass for everyone, for ever."""
    gpuq.run("pause")
    bad = gpuq.submit("--mem", "auto", "true")
    wait_for(lambda: not any((gpuq.home / "spool").glob("submit-*")), what="the daemon to ingest the submit")
    gpuq.run("daemon", "stop")
    spec = json.loads(_row(gpuq, bad))
    db = sqlite3.connect(gpuq.home / "jobs.db")
    spec["like"] = 2**64
    db.execute("UPDATE jobs SET spec = ? WHERE id = ?", (json.dumps(spec), bad))
    db.commit()
    db.close()
    gpuq.run("unpause")
    good = gpuq.submit("--gpus", "1", "true")
    assert gpuq.wait_state(good, "succeeded", "failed", timeout=30)["state"] == "succeeded"
    record = gpuq.wait_state(bad, "failed", timeout=30)
    assert "could not be placed" in record["reason"] and "OverflowError" in record["reason"], record


def _row(gpuq: Gpuq, job: int) -> str:
    """The job's stored spec, once the daemon has ingested it (started again until it has)."""

    def stored() -> str | None:
        # Read-only: a daemon stopped before it made its table (or its file) must not find one made here.
        try:
            with contextlib.closing(sqlite3.connect(f"file:{gpuq.home / 'jobs.db'}?mode=ro", uri=True)) as db:
                found = db.execute("SELECT spec FROM jobs WHERE id = ?", (job,)).fetchone()
        except sqlite3.OperationalError:  # no such table, or no file: not read yet
            found = None
        if found is None:
            gpuq.run("daemon", "start")  # it stopped before reading the request: the next one reads it
            gpuq.run("daemon", "stop")
        return None if found is None else str(found[0])

    return str(wait_for(stored, 30, f"job {job} in the table"))


def test_a_hand_written_kind_is_replaced_by_the_daemons(tmp_path: Path) -> None:
    """`kind` files a job's peak for --mem auto: a request naming another command's kind would set its size."""
    path = tmp_path / "submit-000000000007.json"
    spec = JobSpec(("python3", "train.py"), "/work", gpus=1, mem_auto=True).to_json()
    path.write_text(
        json.dumps(
            {
                "schema": 1,
                "kind": "submit",
                "id": 7,
                "submitted_at": 1.0,
                "spec": {**spec, "kind": "0123456789abcdef", "mem_from": "forged"},
            }
        )
    )
    request = spool.read_request(path)
    assert isinstance(request, spool.SubmitRequest)
    assert request.spec.kind == kind_of(("python3", "train.py"), "/work") and request.spec.mem_from == ""


def test_mem_auto_files_a_name_and_a_command_per_user() -> None:
    """Two users' jobs of the same --name and command: one's peaks must not size the other's reservation."""
    spec = JobSpec(("python3", "train.py"), "/work", gpus=1, mem_auto=True, name="train", kind="ab12")
    mine = JobRecord(1, spec, 1001, "alice", JobState.PENDING, 0.0)
    theirs = JobRecord(2, spec, 1002, "mallory", JobState.PENDING, 0.0)
    assert learning.keys(mine) and not set(learning.keys(mine)) & set(learning.keys(theirs))


def test_text_that_would_steer_a_terminal_is_shown_escaped(gpuq: Gpuq) -> None:
    name = "\x1b]0;owned\x07\x1b[2J\rfake\nrow\u202e"
    job = gpuq.submit("--gpus", "0", "--name", name, "sh", "-c", "exit 3", "\x1b[31m")
    gpuq.wait_state(job, "failed")
    for args in (("status",), ("status", "--all"), ("show", str(job))):
        out = gpuq.run(*args).stdout
        assert "\x1b" not in out and "\r" not in out and "\u202e" not in out, (args, out)
        assert shown(name)[:24] in out or shown(name) in out, (args, out)
    assert json.loads(gpuq.run("show", "--json", str(job)).stdout)["name"] == name  # JSON keeps the text as it is


def test_leftover_temp_files_in_the_spool_are_removed_after_an_hour(gpuq: Gpuq) -> None:
    """Temp files of interrupted writes (a client killed mid-submit, a full disk) were never cleaned."""
    gpuq.submit("--gpus", "0", "true")  # makes the queue (and starts its daemon, stopped at once)
    gpuq.run("daemon", "stop")
    spool_dir = gpuq.home / "spool"
    old, fresh = spool_dir / ".submit-x.json.123.tmp", spool_dir / ".submit-y.json.456.tmp"
    for path in (old, fresh):
        path.write_text("{")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    assert "temp file(s) older than an hour" in gpuq.run("doctor", check=False).stdout
    gpuq.run("daemon", "start")  # a daemon sweeps at its first pass, then every few minutes
    job = gpuq.submit("--gpus", "0", "true")
    gpuq.wait_state(job, "succeeded")
    wait_for(lambda: not old.exists(), 20, "the leftover to go")
    assert fresh.exists()  # a write may still be in progress
    assert "older than an hour" not in gpuq.run("doctor", check=False).stdout


def test_a_batch_job_whose_gpus_do_nothing_for_long_is_shown_in_status_and_doctor(tmp_path: Path) -> None:
    """A batch job that holds GPUs and does nothing on them (a hung NCCL call) was invisible: shown, not stopped."""
    queue = fake_cuda_queue(tmp_path, "2x80GiB", GPUQ_IDLE_REPORT="3s")
    try:
        # Both run far beyond the waits below: "still running" holds by construction.
        idle = queue.submit("--gpus", "1", sys.executable, "fake_cuda.py", "1", "600", "--busy", "0")
        busy = queue.submit("--gpus", "1", sys.executable, "fake_cuda.py", "1", "600", "--busy", "40")
        queue.wait_state(idle, "running")
        queue.wait_state(busy, "running")
        shown_idle = wait_for(lambda: (j := queue.job(idle))["reason"].startswith("no GPU work for") and j, 60, "it")
        assert shown_idle["state"] == "running"
        assert "no GPU work for" in queue.run("status").stdout
        assert not queue.job(busy)["reason"].startswith("no GPU work")
        doctor = queue.run("doctor", check=False).stdout
        assert f"job {idle} of" in doctor and "did no work" in doctor and f"job {busy} of" not in doctor, doctor
    finally:
        queue.cleanup()


def test_a_request_that_passes_the_checks_but_breaks_ingest_is_set_aside_alone(gpuq: Gpuq) -> None:
    """The net under the checks: an array whose members' ids run past SQLite's integers (its own id is a valid
    one, the client's counter is anyone's to write) once failed every pass. Now ingest is retried one request
    at a time and only that one is set aside, saying why; the job submitted beside it runs.
    (Tied to ids chosen by clients: once the daemon assigns ids at intake this request cannot be written.)"""
    gpuq.run("daemon", "start")
    gpuq.run("pause")
    good = gpuq.submit("--gpus", "0", "true")  # queued; it starts once the queue is resumed
    gpuq.wait_state(good, "pending")
    state = StateDir(gpuq.home)
    spec = JobSpec(("true",), str(gpuq.cwd), gpus=0).to_json()
    outbox.write_submit(state, 2**63 - 3, spec, time.time(), (tuple(range(5)), None))
    gpuq.run("unpause")  # read in the same pass as the bad request
    assert gpuq.wait_state(good, "succeeded", "failed", timeout=30)["state"] == "succeeded"
    said = wait_for(lambda: (s := gpuq.run("status").stderr) and "was set aside" in s and s, 20, "the note")
    assert "made the daemon's pass fail (OverflowError" in said, said
    assert "pass has failed" not in said


def test_a_queued_job_past_the_new_bounds_is_still_read(gpuq: Gpuq) -> None:
    """Upper bounds hold new submits; a row an older gpuq queued past them (here 500 retries) still loads,
    in status and in a restarted daemon, instead of making every reader fail."""
    gpuq.run("pause")
    job = gpuq.submit("--gpus", "0", "true")
    gpuq.run("daemon", "stop")
    row = _row(gpuq, job)
    db = sqlite3.connect(gpuq.home / "jobs.db")
    db.execute("UPDATE jobs SET spec = ? WHERE id = ?", (json.dumps({**json.loads(row), "retries": 500}), job))
    db.commit()
    db.close()
    assert gpuq.job(job)["retries"] == 500
    gpuq.run("unpause")
    assert gpuq.wait_state(job, "succeeded", "failed", timeout=30)["state"] == "succeeded"


# -- the client and the daemon agree ---------------------------------------------------------------------

api_text = st.text(max_size=6) | st.sampled_from(["\0", "a\0b", "\udcff", "\x1b[2J", "{index}", "٣"])
api_numbers = st.integers() | st.sampled_from([0, 1, -1, 100, 101, 1024, 1025, 2**63, 10**20])


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    command=st.lists(api_text, min_size=1, max_size=3),
    env=st.dictionaries(api_text, api_text, max_size=2),
    name=api_text,
    gpus=api_numbers,
    retries=api_numbers,
    priority=api_numbers,
    time_limit=st.none() | st.floats() | st.sampled_from(["2h", "999999999999999h", "٣h", "400d"]),
    mem=st.none() | st.sampled_from(["auto", "1G", "٣G", "0G"]),
    after=st.lists(api_numbers, max_size=2),
)
@example(
    command=["x", "é"],
    env={"K": "v"},
    name="n",
    gpus=1,
    retries=100,
    priority=0,
    time_limit="2h",
    mem="auto",
    after=[1],
)
def test_whatever_the_client_accepts_the_daemon_accepts_and_the_table_holds(
    tmp_path: Path,
    command: list[str],
    env: dict[str, str],
    name: str,
    gpus: int,
    retries: int,
    priority: int,
    time_limit: float | str | None,
    mem: str | None,
    after: list[int],
) -> None:
    """The client refuses up front, in one line, what the daemon would set aside: a request a client wrote
    is never set aside by the daemon, and fits in the job table."""
    try:
        spec = capture_spec(
            ["/bin/true", *command[1:]],
            environ={"PATH": "/usr/bin:/bin"},
            cwd=str(tmp_path),
            gpus=gpus,
            mem=mem,
            name=name,
            priority=priority,
            time_limit=time_limit,
            env=env,
            after=after,
            retries=retries,
            python="/usr/bin/python3",
        )
    except BadInput as err:
        assert "\n" not in str(err)
        return
    state = StateDir(tmp_path / "state")
    state.ensure()
    request = spool.read_request(outbox.write_submit(state, 1, spec, 1.0))
    assert isinstance(request, spool.SubmitRequest), request
    table = JobTable(tmp_path / "absent.db")
    try:
        table.insert_pending(expand(state, request))
    finally:
        table.close()
