"""The queue without a daemon: durable submits, concurrent id allocation, upgrade-safe reads."""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import pickle
import shutil
import sqlite3
from pathlib import Path

import pytest

from gpuq_scheduler.jobs.errors import NotPermitted, StateDirError, UnknownJob
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store import private
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.schema import TABLE_VERSION
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from tests.conftest import FIXTURES


def _spec() -> JobSpec:
    return JobSpec(command=("true",), cwd="/")


def _submit_many(home: str, count: int) -> list[int]:
    queue = Queue(StateDir(Path(home)))
    return [queue.submit(_spec()) for _ in range(count)]


def test_a_state_dir_is_an_immutable_value(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    assert state == StateDir(Path(str(tmp_path))) and state != StateDir(tmp_path / "other") and state != tmp_path
    assert len({state, StateDir(tmp_path)}) == 1 and repr(state) == f"StateDir({str(tmp_path)!r})"
    assert state == StateDir(str(tmp_path)) == StateDir(f"{tmp_path}/") and state.root == tmp_path
    with pytest.raises(AttributeError):
        state.root = tmp_path / "other"
    assert pickle.loads(pickle.dumps(state)) == copy.deepcopy(state) == state


def test_submit_without_a_daemon_is_visible_at_once(tmp_path: Path) -> None:
    queue = Queue(StateDir(tmp_path))
    job_id = queue.submit(_spec())
    record = queue.get(job_id)
    assert record.state is JobState.PENDING and record.uid == os.getuid()
    assert [r.id for r in queue.records()] == [job_id]


def test_concurrent_submitters_never_share_an_id(tmp_path: Path) -> None:
    with multiprocessing.get_context("fork").Pool(4) as pool:
        batches = pool.starmap(_submit_many, [(str(tmp_path), 50)] * 4)
    ids = [i for batch in batches for i in batch]
    assert sorted(ids) == list(range(1, 201))


def test_cancel_of_another_users_job_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    queue = Queue(StateDir(tmp_path))
    job_id = queue.submit(_spec())
    with pytest.raises(NotPermitted, match="only"):
        queue.cancel([job_id], uid=os.getuid() + 4242 if os.getuid() else 4242)
    assert not list((tmp_path / "spool").glob("cancel-*"))


def test_unknown_ids_are_refused(tmp_path: Path) -> None:
    queue = Queue(StateDir(tmp_path))
    queue.submit(_spec())
    with pytest.raises(UnknownJob):
        queue.get(77)
    with pytest.raises(UnknownJob):
        queue.cancel([1, 77])


def test_a_table_from_a_newer_gpuq_is_refused_with_advice(tmp_path: Path) -> None:
    JobTable(tmp_path / "jobs.db", create=True).close()
    db = sqlite3.connect(tmp_path / "jobs.db")
    db.execute(f"PRAGMA user_version={TABLE_VERSION + 1}")
    db.close()
    with pytest.raises(StateDirError, match="upgrade gpuq"):
        JobTable(tmp_path / "jobs.db")


def test_a_34565a6_shared_table_upgrades_without_keeping_its_submit_tokens(tmp_path: Path) -> None:
    """34565a6 kept each shared submit's token in plain in the public ``intake`` table (issue 38: anyone could
    read a pending job's token and replay it). The frozen table it wrote (tests/fixtures/state-34565a6) is read
    as before until the daemon opens it; the daemon's migration keeps each token's digest and its job's uid
    instead, so a re-send by the same user still finds its id, and no byte of any token is left in any file."""
    fixture = FIXTURES / "state-34565a6"
    tokens = {int(k): v for k, v in json.loads((fixture / "tokens.json").read_text()).items()}
    shutil.copy(fixture / "jobs.db", tmp_path / "jobs.db")
    assert all(t.encode() in (tmp_path / "jobs.db").read_bytes() for t in tokens.values())  # what 34565a6 kept
    reader = JobTable(tmp_path / "jobs.db")  # `gpuq status` before the upgraded daemon ran
    assert [(r.id, r.state) for r in reader.records()] == [
        (1, JobState.SUCCEEDED),
        (2, JobState.PENDING),
        (3, JobState.PENDING),
    ]
    reader.close()
    daemon = JobTable(tmp_path / "jobs.db", create=True)
    assert daemon.intake_ids([tokens[2], tokens[3], "0" * 32]) == {tokens[2]: (2, 4242), tokens[3]: (3, 0)}
    assert [r.id for r in daemon.records(active_only=True)] == [2, 3]
    for path in tmp_path.iterdir():  # the table, and its -wal and -shm while the daemon has it open
        assert not any(t.encode() in path.read_bytes() for t in tokens.values()), path
    daemon.close(rollback_mode=True)
    assert sqlite3.connect(tmp_path / "jobs.db").execute("PRAGMA user_version").fetchone()[0] == TABLE_VERSION == 5
    for path in tmp_path.iterdir():
        assert not any(t.encode() in path.read_bytes() for t in tokens.values()), path


def test_a_private_file_is_believed_only_as_a_plain_file_of_its_jobs_owner(tmp_path: Path) -> None:
    """What the daemon (root) reads back as a job's command: a link, another user's file (as 34565a6 let a
    replayed token make it) or one larger than a request could be is refused, saying which."""
    state = StateDir(tmp_path)
    state.private.mkdir()
    fields = {"command": ["true"], "cwd": "/", "env": {}, "python": None, "notify": None}
    Path(state.private_file(1)).write_text(json.dumps(fields))
    assert private.read(state, 1, os.getuid()) == fields
    with pytest.raises(private.Refused, match=f"belongs to uid {os.getuid()}, not to the job's owner"):
        private.read(state, 1, os.getuid() + 1)
    os.symlink(state.private_file(1), state.private_file(2))
    with pytest.raises(private.Refused, match="is a link"):
        private.read(state, 2, os.getuid())
    Path(state.private_file(3)).write_bytes(b" " * (private.MAX_BYTES + 1))
    with pytest.raises(private.Refused, match="more than a job's command and environment can be"):
        private.read(state, 3, os.getuid())


def test_a_corrupt_table_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "jobs.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateDirError, match="cannot read the job table"):
        JobTable(tmp_path / "jobs.db").records()


def test_the_tables_state_conditions_are_made_from_the_state_enum_and_still_use_the_live_index(
    tmp_path: Path,
) -> None:
    """jobs/store/table.py once spelled 'pending' and 'running' by hand in its SQL; they come from JobState
    now, as literals, so the partial index of live jobs still serves the queries that name its condition."""
    from gpuq_scheduler.jobs.store import schema

    assert schema.states(JobState.PENDING) == "state = 'pending'"
    assert schema.LIVE_STATES == "state IN ('pending', 'running', 'suspended')"
    table = JobTable(tmp_path / "jobs.db", create=True)
    table.close()
    db = sqlite3.connect(tmp_path / "jobs.db")
    query = f"EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE {schema.LIVE_STATES}"
    plan = " ".join(str(row) for row in db.execute(query))
    assert "jobs_live" in plan
    db.close()
