"""The queue without a daemon: durable submits, concurrent id allocation, upgrade-safe reads."""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
import sqlite3
from pathlib import Path

import pytest

from gpuq_scheduler.jobs.errors import NotPermitted, StateDirError, UnknownJob
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.schema import TABLE_VERSION
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable


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


def test_a_corrupt_table_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "jobs.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateDirError, match="cannot read the job table"):
        JobTable(tmp_path / "jobs.db").records()
