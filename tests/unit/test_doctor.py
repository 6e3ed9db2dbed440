"""`gpuq doctor`: each inconsistency it knows is planted in a copy of a real state directory, and found.

The state directory comes from a real daemon that ran a few jobs; each test copies it, breaks one thing
the way a crash, a bug or a person could, and checks that the doctor names it (and what to do), says
nothing else, and writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.supervisor import processes
from gpuq_scheduler.launcher.views import doctor
from tests.conftest import Gpuq, make_env


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A state directory where a daemon ran four jobs (one failed) and then stopped."""
    root = tmp_path_factory.mktemp("ran")
    work = root / "work dir"
    work.mkdir()
    home = root / "state dir 'quoted'"
    client = Gpuq(home, make_env(home), work)
    try:
        ids = [
            client.submit("--gpus", "0", "true"),
            client.submit("--gpus", "1", "false"),
            client.submit("--gpus", "1", "--mem", "4G", "true"),
            client.submit("--gpus", "2", "true"),
        ]
        client.run("wait", *map(str, ids), check=False)
        client.run("daemon", "stop")
    finally:
        client.cleanup()
    yield home


@pytest.fixture
def state(ran: Path, tmp_path: Path) -> StateDir:
    """A private copy of ``ran``: the logs recorded in its table point into the copy."""
    home = tmp_path / "copy of state"
    shutil.copytree(ran, home, ignore=shutil.ignore_patterns("wake.fifo", "daemon.lock", "daemon.pid"))
    sql(StateDir(home), "UPDATE jobs SET log = replace(log, ?, ?)", str(ran), str(home))
    return StateDir(home)


def sql(state: StateDir, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(state.db)
    try:
        with db:
            return db.execute(statement, params).fetchall()
    finally:
        db.close()


def messages(state: StateDir, severity: str | None = None) -> list[str]:
    return [p.message for p in doctor.check(state) if severity is None or p.severity == severity]


def make_running(state: StateDir, job_id: int, gpus: list[int], *, alive: bool = True, mem: int | None = None) -> None:
    """Turn a finished job back into a running one, supervised by a live process (this one) if ``alive``."""
    start = processes.start_time(os.getpid()) if alive else 1.0
    sql(
        state,
        "UPDATE jobs SET state='running', ended_at=NULL, exit_code=NULL, gpus=?, shim_pid=?, shim_start=?, boot_id=?,"
        " spec=json_set(spec, '$.gpus', ?, '$.mem_per_gpu', ?) WHERE id=?",
        json.dumps(gpus),
        os.getpid(),
        start,
        processes.boot_id(),
        len(gpus),
        mem,
        job_id,
    )


# -- all is well ------------------------------------------------------------------------------------------


def test_a_state_directory_where_jobs_ran_has_no_problems(state: StateDir) -> None:
    problems = doctor.check(state)
    assert problems == []
    assert doctor.exit_code(problems) == 0
    assert doctor.render(problems, state) == f"no problems found in {state.root}"


def test_an_empty_or_missing_state_directory_is_not_an_error(tmp_path: Path) -> None:
    missing = doctor.check(StateDir(tmp_path / "nowhere"))
    assert [p.severity for p in missing] == ["warning"] and "check GPUQ_HOME" in missing[0].message
    StateDir(tmp_path / "fresh").ensure()
    assert doctor.check(StateDir(tmp_path / "fresh")) == []
    (tmp_path / "not gpuq").mkdir()
    assert "is not a gpuq state directory" in messages(StateDir(tmp_path / "not gpuq"), "error")[0]


def test_the_doctor_writes_nothing(state: StateDir) -> None:
    make_running(state, 1, [], alive=False)  # something to find, so that every check has work to do
    state.next_id.write_text("junk")

    def files() -> dict[str, tuple[bytes, int]]:
        return {
            str(p.relative_to(state.root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in state.root.rglob("*")
            if p.is_file() and not p.name.endswith(("-shm", "-wal"))  # SQLite's own side files, as for any reader
        }

    before = files()
    assert doctor.exit_code(doctor.check(state)) == 1
    assert files() == before


# -- the job table ----------------------------------------------------------------------------------------


def test_a_table_from_a_newer_gpuq_is_an_error(state: StateDir) -> None:
    sql(state, "PRAGMA user_version=99")
    (message,) = messages(state)
    assert "newer than this gpuq reads" in message and "upgrade gpuq" in message


def test_a_database_that_is_not_a_job_table_is_an_error(state: StateDir) -> None:
    state.db.unlink()
    sql(state, "CREATE TABLE notes (text TEXT)")
    assert "is not a gpuq job table" in messages(state, "error")[0]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "zeroed page"])
def test_a_damaged_job_table_is_reported_not_raised(state: StateDir, damage: str) -> None:
    padding = "x" * 5000  # records over several pages, so that damage can hit one in the middle
    sql(
        state,
        "INSERT INTO jobs (id, state, uid, user, priority, spec, env, submitted_at, reason)"
        " SELECT id + 4, state, uid, user, priority, spec, env, submitted_at, ? FROM jobs",
        padding,
    )
    data = state.db.read_bytes()
    if damage == "garbage":
        data = os.urandom(len(data))
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = b""
    else:
        data = data[:4096] + b"\0" * 4096 + data[8192:]
    state.db.write_bytes(data)
    problems = doctor.check(state)
    assert doctor.exit_code(problems) == 1
    assert [p.severity for p in problems] == ["error"] and "job table" in problems[0].message, problems
    assert "\n" not in problems[0].message


def test_an_unreadable_record_is_named_and_the_other_checks_still_run(state: StateDir) -> None:
    sql(state, "UPDATE jobs SET gpus='not json' WHERE id=2")
    state.next_id.write_text("1\n")
    found = messages(state, "error")
    assert any("the record of job 2 cannot be read" in m for m in found)
    assert any("next_id says the next job id is 1" in m for m in found)


# -- running jobs -----------------------------------------------------------------------------------------


def test_a_running_job_whose_supervisor_is_gone_without_an_exit_file_is_an_error(state: StateDir) -> None:
    make_running(state, 2, [0], alive=False)
    (message,) = messages(state)
    assert f"job 2 is recorded as running, but its gpuq supervisor (pid {os.getpid()}) is gone" in message
    assert "gpuq daemon start" in message

    Path(state.exit_file(2)).write_text(json.dumps({"started": True, "exit_code": 0}))
    assert messages(state) == []  # it ended: the outcome waits for the next daemon


def test_a_running_job_with_a_live_supervisor_is_fine(state: StateDir) -> None:
    make_running(state, 2, [0])
    assert messages(state) == []


def test_a_job_running_before_the_machine_restarted_is_an_error(state: StateDir) -> None:
    make_running(state, 2, [0])
    sql(state, "UPDATE jobs SET boot_id='an older boot' WHERE id=2")
    (message,) = messages(state)
    assert "job 2 was running when the machine restarted" in message


def test_records_whose_fields_contradict_their_state_are_errors(state: StateDir) -> None:
    sql(state, "UPDATE jobs SET ended_at=NULL WHERE id=1")
    sql(state, "UPDATE jobs SET state='paused' WHERE id=2")
    make_running(state, 3, [])
    sql(state, "UPDATE jobs SET spec=json_set(spec, '$.gpus', 1) WHERE id=3")
    sql(state, "UPDATE jobs SET state='pending', ended_at=NULL WHERE id=4")
    found = messages(state, "error")
    assert len(found) == 4, found
    assert "job 1 is succeeded but has no end time" in found[0]
    assert "job 2 has an unknown state 'paused'" in found[1]
    assert "job 3 is running without GPUs although it asked for 1" in found[2]
    assert "job 4 is pending but has a start or end time or GPUs" in found[3]


# -- GPUs -------------------------------------------------------------------------------------------------


def test_two_jobs_on_a_gpu_that_one_of_them_should_have_to_itself_is_an_error(state: StateDir) -> None:
    make_running(state, 2, [1])
    make_running(state, 3, [1], mem=4 << 30)
    (message,) = messages(state)
    assert message.startswith("GPU 1 is shared by jobs 2, 3, although job 2 should have it to itself")


def test_memory_promised_beyond_a_gpus_total_is_an_error(state: StateDir) -> None:
    make_running(state, 2, [3], mem=39 << 30)
    make_running(state, 3, [3], mem=39 << 30)
    assert messages(state) == []  # 2 x (39 + 1) GiB fit in 80 GiB
    make_running(state, 4, [3], mem=1 << 30)
    (message,) = messages(state)
    assert message.startswith("GPU 3 has 82.0G promised to jobs 2, 3, 4") and "more than its 80.0G" in message


def test_an_unreadable_gpu_inventory_is_a_warning(state: StateDir) -> None:
    state.inventory.write_text("{not json")
    assert [p.severity for p in doctor.check(state)] == ["warning"]


# -- the spool and the id counter -------------------------------------------------------------------------


def _spec(state: StateDir) -> JobSpec:
    return JobSpec(command=("true",), cwd=str(state.root), gpus=0)


def test_a_request_left_in_the_spool_after_it_was_recorded_is_a_warning(state: StateDir) -> None:
    submitted_at = sql(state, "SELECT submitted_at FROM jobs WHERE id=2")[0][0]
    outbox.write_submit(state, 2, _spec(state).to_json(), submitted_at)
    (problem,) = doctor.check(state)
    assert problem.severity == "warning" and "the daemon deletes the request" in problem.message


def test_an_id_handed_out_twice_is_an_error(state: StateDir) -> None:
    outbox.write_submit(state, 2, _spec(state).to_json(), time.time())
    (problem,) = doctor.check(state)
    assert problem.severity == "error" and "the id was handed out twice" in problem.message


@pytest.mark.parametrize(("content", "phrase"), [(b"3\n", "says the next job id is 3"), (b"x7", "holds b'x7'")])
def test_a_counter_that_would_hand_out_a_used_id_again_is_an_error(
    state: StateDir, content: bytes, phrase: str
) -> None:
    state.next_id.write_bytes(content)
    (message,) = messages(state, "error")
    assert phrase in message and "echo 5 >" in message


def test_a_missing_counter_is_an_error_once_jobs_exist(state: StateDir) -> None:
    state.next_id.unlink()
    (message,) = messages(state, "error")
    assert "is missing, so the next submit would reuse id 1" in message


# -- leftovers --------------------------------------------------------------------------------------------


def test_temp_files_older_than_an_hour_are_a_warning_and_fresh_ones_are_not(state: StateDir) -> None:
    old = state.spool / ".submit-000000000009.json.123.tmp"
    fresh = state.spool / ".submit-000000000010.json.124.tmp"
    old.write_bytes(b"{")
    fresh.write_bytes(b"{")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    (problem,) = doctor.check(state)
    assert problem.severity == "warning" and "1 temp file(s) older than an hour" in problem.message
    assert old.name in problem.message and fresh.name not in problem.message


def test_set_aside_requests_are_counted_in_a_warning(state: StateDir) -> None:
    for name in ("submit-000000000100.json.ab", "cancel-x.json.cd"):
        (state.rejected / name).write_text("junk")
        (state.rejected / f"{name}.why").write_text("is not JSON\n")
    (problem,) = doctor.check(state)
    assert problem.severity == "warning" and problem.message.startswith("2 request file(s) were set aside")


def test_a_missing_log_of_a_job_that_ran_is_a_warning(state: StateDir) -> None:
    os.unlink(state.log(3))
    (problem,) = doctor.check(state)
    assert problem.severity == "warning" and f"the log of job 3 ({state.log(3)}) is missing" in problem.message


# -- the command ------------------------------------------------------------------------------------------


def test_render_lists_errors_first_then_a_count(state: StateDir) -> None:
    os.unlink(state.log(3))
    state.next_id.write_text("2\n")
    lines = doctor.render(doctor.check(state), state).splitlines()
    assert lines[0].startswith("error: ") and lines[1].startswith("warning: ")
    assert lines[2] == f"1 error(s), 1 warning(s) in {state.root}"


def test_gpuq_doctor_exits_0_when_clean_and_1_with_errors(gpuq: Gpuq) -> None:
    gpuq.run("wait", str(gpuq.submit("--gpus", "0", "true")))
    clean = gpuq.run("doctor", check=False)
    assert clean.returncode == 0 and clean.stdout.startswith("no problems found"), clean.stderr
    (gpuq.home / "next_id").write_text("1\n")
    broken = gpuq.run("doctor", "--json", check=False)
    assert broken.returncode == 1
    assert [p["severity"] for p in json.loads(broken.stdout)] == ["error"]


def test_an_idle_batch_job_is_found_by_the_daemons_typed_notice_not_by_its_reasons_words(state: StateDir) -> None:
    """The doctor once matched "no GPU work for" in the reasons and imported that sentence from the daemon:
    it reads the daemon's notice now (notices/idle.json, job ids and seconds), for jobs still running."""
    from gpuq_scheduler.jobs.store import notices

    make_running(state, 1, [0])
    make_running(state, 3, [1])
    sql(state, "UPDATE jobs SET reason='no GPU work for 9h' WHERE id=3")  # words alone say nothing now
    notices.idle_batch(state, {1: 7500.0, 2: 9000.0})  # job 2 ended since: no one's problem
    found = [m for m in messages(state, "warning") if "did no work" in m]
    assert len(found) == 1 and found[0].startswith("job 1 of ") and "no GPU work for 2h05m" in found[0]
    notices.idle_batch(state, {})  # none idle now: the notice goes
    assert not [m for m in messages(state, "warning") if "did no work" in m]
