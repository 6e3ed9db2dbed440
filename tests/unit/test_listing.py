"""A listing's lines, read straight from the table, say what the full records say (``jobs.listing``)."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuq_scheduler.jobs.listing import Line
from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store import schema
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from tests.conftest import make_env

names = st.sampled_from(["", "seed 1", "a,b", "ünï", "x" * 40])
programs = st.sampled_from(["python", "/usr/bin/python3", "train.py", "dir/", "/", "a/b/c.sh"])
specs = st.builds(
    lambda name, program, gpus, mem, auto, chosen: JobSpec(
        command=(program, "--seed", "1"),
        cwd="/work",
        gpus=gpus,
        mem_per_gpu=mem if gpus else None,
        name=name,
        mem_auto=auto and gpus > 0,
        mem_from=chosen if auto and gpus > 0 else "",
    ),
    names,
    programs,
    st.integers(0, 8),
    st.one_of(st.none(), st.integers(1, 1 << 40)),
    st.booleans(),
    st.sampled_from(["", "learned from job 3 (4.0G)"]),
)
fates = st.sampled_from(["pending", "running", "succeeded", "failed", "cancelled"])


@pytest.mark.slow  # hundreds of generated cases against a real table: seconds, out of the everyday unit run
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(st.tuples(specs, fates, st.booleans()), min_size=1, max_size=12))
def test_lines_from_the_table_equal_lines_made_from_its_records(
    tmp_path: Path, jobs: list[tuple[JobSpec, str, bool]]
) -> None:
    path = tmp_path / "jobs.db"
    path.unlink(missing_ok=True)
    table = JobTable(path, create=True)
    try:
        table.insert_pending(
            [
                JobRecord(
                    id=i,
                    spec=spec,
                    uid=0,
                    user="root",
                    state=JobState.PENDING,
                    submitted_at=1000.0 + i,
                    log=f"/logs/{i}.log",
                    held=held,
                )
                for i, (spec, _, held) in enumerate(jobs, start=1)
            ]
        )
        for i, (spec, fate, _) in enumerate(jobs, start=1):
            if fate != "pending":
                table.mark_running(i, list(range(spec.gpus)), [], 2000.0 + i, Launch(1, 1.0, "boot"))
            if fate == "succeeded":
                table.finish(i, Outcome.succeeded(), 2100.0 + i)
            elif fate == "failed":
                table.finish(i, Outcome.failed(3), 2100.0 + i)
            elif fate == "cancelled":
                table.finish(i, Outcome.cancelled("alice"), 2100.0 + i)
            elif i % 2:  # a pending job's spec changed (a new priority, a retry's doubled memory)
                table.update_spec(i, dataclasses.replace(spec, name=f"renamed {i}", priority=5))
        assert table.lines() == [Line.of(record) for record in table.records()]
    finally:
        table.close()


def _as_version_1(path: Path) -> None:
    """Make a table of this version what version 1 was: no copies of the spec's listed fields, no causes."""
    db = sqlite3.connect(path, isolation_level=None)
    for column in [*(c for c, _, _ in schema.LISTED), *(c for c, _ in [*schema.CAUSED, *schema.SUSPENSION])]:
        db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
    db.execute("PRAGMA user_version=1")
    db.close()


def test_a_version_1_table_is_listed_from_its_specs_then_migrated_by_the_daemon(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    table = JobTable(path, create=True)
    table.insert_pending(
        [
            JobRecord(
                id=i,
                spec=JobSpec(
                    command=(f"/bin/job{i}",),
                    cwd="/",
                    gpus=1 + i % 3,
                    mem_per_gpu=i << 30,
                    name="" if i % 2 else f"n{i}",
                ),
                uid=0,
                user="root",
                state=JobState.PENDING,
                submitted_at=i,
                log="",
            )
            for i in range(1, 7)
        ]
    )
    expected = table.lines()
    table.close()
    _as_version_1(path)
    reader = JobTable(path)  # `gpuq status` before the new daemon has opened the table
    assert reader.lines() == expected
    reader.close()
    daemon = JobTable(path, create=True)
    assert daemon.lines() == expected
    daemon.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.TABLE_VERSION
    copied = db.execute("SELECT name, program, mem_per_gpu FROM jobs WHERE id=2").fetchone()
    assert copied == ("n2", "/bin/job2", 2 << 30)
    db.close()


def test_a_listing_shows_a_job_still_in_the_spool(tmp_path: Path) -> None:
    """No daemon has read the request yet: `gpuq status --all` shows the job all the same."""
    env = make_env(tmp_path / "home")
    state = StateDir(Path(env["GPUQ_HOME"]))
    queue = Queue(state)
    job_id = queue.submit(JobSpec(command=("true",), cwd=str(tmp_path), gpus=0, name="spooled"))
    (line,) = queue.lines()
    assert (line.id, line.name, line.state, line.want_gpus) == (job_id, "spooled", JobState.PENDING, 0)
