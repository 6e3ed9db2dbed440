"""The stored job declared once (#41, part 2): a spec's JSON and a record's row follow their dataclasses' fields
(``jobs.plain``, ``jobs.store.schema``), rows are read by column name, and each schema version is an explicit
migration that brings an old table to the shape of a new one."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpuq_scheduler.jobs import plain
from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Mode
from gpuq_scheduler.jobs.outcome import JobState, Step
from gpuq_scheduler.jobs.store import rows as job_rows
from gpuq_scheduler.jobs.store import schema
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.jobs.submission import capture_spec
from tests.conftest import FIXTURES

# A spec with every field away from its default: a field added to JobSpec fails
# test_every_field_of_a_spec_is_written_and_read_back_by_its_type until it is given a value here.
FULL_SPEC = JobSpec(
    command=("python", "train.py", "--lr", "{lr}"),
    cwd="/work dir",
    env={"TOKEN": "s3cret"},
    gpus=2,
    mem_per_gpu=20 << 30,
    name="sweep {lr}",
    priority=5,
    time_limit=3600.0,
    mode=Mode.DATAPARALLEL,
    python="/usr/bin/python3",
    after=(3, 4),
    after_any=True,
    retries=2,
    oom_retry=True,
    notify="echo done",
    mem_auto=True,
    like=7,
    kind="cmd:abc",
    mem_from="job 7",
    client=4242,
    sweep=(("lr", ("1e-3", "1e-4")),),
    values=(("lr", "1e-3"),),
    cpus=2.5,
    ram=8 << 30,
    preemptible=True,
    preempt_signal="USR2",
    from_script=("--gpus", "2"),
    options={"gpu_ids": [0, 1], "output": "out/%j.log"},
)


def _defaults(cls: type) -> dict[str, Any]:
    return {
        field.name: field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        for field in dataclasses.fields(cls)
    }


def test_every_field_of_a_spec_is_written_and_read_back_by_its_type() -> None:
    """to_json and from_json named each of the spec's fields by hand (with capture_spec's dict and the table's
    columns, six places for a new field); now they follow the dataclass's fields and their types."""
    defaults = _defaults(JobSpec)
    assert [name for name, default in defaults.items() if getattr(FULL_SPEC, name) == default] == []
    data = json.loads(json.dumps(FULL_SPEC.to_json()))
    assert JobSpec.from_json(data) == FULL_SPEC
    assert data["mode"] == "dataparallel" and data["sweep"] == [["lr", ["1e-3", "1e-4"]]]
    assert data["gpu_ids"] == [0, 1] and "options" not in data  # kept options by their own keys


def test_a_field_left_out_of_a_spec_holds_its_default_and_a_wrong_type_is_named() -> None:
    assert JobSpec.from_json({"command": ["true"], "cwd": "/"}) == JobSpec(command=("true",), cwd="/")
    with pytest.raises(BadInput, match="job spec lacks 'cwd'"):
        JobSpec.from_json({"command": ["true"]})
    for key, wrong, words in [
        ("values", [["lr"]], "values must be a list of \\[name, value\\] pairs"),
        ("sweep", [["lr", "1e-3"]], "sweep must be a list of strings"),
        ("client", "4242", "client must be int, not str"),
        ("mem_auto", None, "mem_auto must be true or false, not NoneType"),
        ("cpus", True, "cpus must be float, not bool"),
        ("gpu_ids", "0,1", "gpu_ids must be list, not str"),
    ]:
        with pytest.raises(BadInput, match=words):
            JobSpec.from_json({"command": ["true"], "cwd": "/", key: wrong})


def test_the_submit_request_holds_the_keys_of_the_spec_json_in_its_order(tmp_path: Path) -> None:
    """capture_spec (the quick path, which may not load jobs.model) still writes the request's dict itself:
    this pins it to the declaration, so a field it does not write fails here, not in a daemon."""
    captured = capture_spec(["true"], environ={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path))
    assert list(captured) == list(JobSpec.from_json(captured).to_json())


def _full_record() -> JobRecord:
    """A record with every field of the jobs row away from its default."""
    record = JobRecord(
        id=9,
        spec=FULL_SPEC,
        uid=1000,
        user="alice",
        state=JobState.SUSPENDED,
        submitted_at=1.5,
        started_at=2.5,
        ended_at=3.5,
        gpus=(0, 2),
        gpu_uuids=("GPU-a", "GPU-b"),
        exit_code=3,
        signal=9,
        reason="why",
        cause=Cause.OOM_VICTIM,
        culprit=8,
        peak_mem=1 << 30,
        log="/logs/9.log",
        array_id=5,
        array_index=1,
        attempt=2,
        held=True,
        step=Step.RESUMING,
        host_bytes=4 << 30,
        suspended_at=4.5,
        suspended_for=6.5,
    )
    defaults = _defaults(JobRecord)
    assert [name for name in job_rows.RECORD_COLUMNS if getattr(record, name) == defaults[name]] == []
    return record


def test_a_record_is_read_by_column_name_whatever_the_order_of_the_columns() -> None:
    """73 reads by position (row[n]) in schema.py and slurm/table.py, each to be kept in step with a column
    list by hand: a row is now read by its columns' names, here from a table whose columns are in reverse."""
    record = _full_record()
    names = list(reversed(job_rows.RECORD_COLUMNS))
    db = sqlite3.connect(":memory:")
    db.execute(f"CREATE TABLE jobs (spec TEXT, {', '.join(names)})")
    spec_json = json.dumps({**record.spec.to_json(), "env": None})
    values = [job_rows.to_column(getattr(record, name)) for name in names]
    db.execute(f"INSERT INTO jobs VALUES (?, {', '.join('?' * len(names))})", [spec_json, *values])
    cursor = db.cursor()
    cursor.row_factory = sqlite3.Row
    rows = cursor.execute("SELECT * FROM jobs").fetchall()
    assert job_rows.records_from(rows) == [record.replace(spec=dataclasses.replace(record.spec, env={}))]


def test_every_field_of_the_jobs_row_has_its_column_in_a_new_table(tmp_path: Path) -> None:
    """A field added to JobRecord is read from the column of its name: one must exist (a migration adds it
    to older tables), or the field is named among those kept elsewhere."""
    table = JobTable(tmp_path / "jobs.db", create=True)
    table.close()
    db = sqlite3.connect(tmp_path / "jobs.db")
    assert set(job_rows.RECORD_COLUMNS) - job_rows.columns_of(db, "jobs") == set()


def test_every_table_version_has_its_migration() -> None:
    assert sorted(schema.MIGRATIONS) == list(range(2, schema.TABLE_VERSION + 1))


def _shape(path: Path) -> dict[str, Any]:
    """What a table's schema is, whatever order ALTER TABLE left its columns in."""
    db = sqlite3.connect(path)
    try:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {
            "tables": {
                table: sorted(tuple(row[1:]) for row in db.execute(f"PRAGMA table_info({table})")) for table in tables
            },
            "indexes": sorted(db.execute("SELECT name, sql FROM sqlite_master WHERE type='index'")),
            "version": db.execute("PRAGMA user_version").fetchone()[0],
        }
    finally:
        db.close()


def _as_version(path: Path, version: int) -> None:
    """A new table taken back to ``version``: without the columns and index later versions added."""
    db = sqlite3.connect(path, isolation_level=None)
    later = {
        2: [column for column, _, _ in schema.LISTED],
        3: [column for column, _ in schema.CAUSED],
        4: [column for column, _ in schema.SUSPENSION],
    }
    if version < 4:
        db.execute("DROP INDEX jobs_live")
    for since, columns in later.items():
        if version < since:
            for column in columns:
                db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
    db.execute(f"PRAGMA user_version={version}")
    db.close()


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_a_table_of_an_older_version_is_brought_to_the_shape_of_a_new_one(tmp_path: Path, version: int) -> None:
    new = tmp_path / "new" / "jobs.db"
    new.parent.mkdir()
    JobTable(new, create=True).close(rollback_mode=True)
    old = tmp_path / "old" / "jobs.db"
    old.parent.mkdir()
    shutil.copy(new, old)
    _as_version(old, version)
    assert _shape(old) != _shape(new)
    JobTable(old, create=True).close(rollback_mode=True)
    assert _shape(old) == _shape(new)


def test_the_34565a6_table_is_brought_to_the_shape_of_a_new_one(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "state-34565a6" / "jobs.db", tmp_path / "jobs.db")
    JobTable(tmp_path / "jobs.db", create=True).close(rollback_mode=True)
    (tmp_path / "new").mkdir()
    JobTable(tmp_path / "new" / "jobs.db", create=True).close(rollback_mode=True)
    assert _shape(tmp_path / "jobs.db") == _shape(tmp_path / "new" / "jobs.db")


def test_a_field_of_a_type_the_json_cannot_hold_is_refused_when_declared() -> None:
    """An unknown type is an error where the field is declared, not a value written as it happens to be."""

    @dataclasses.dataclass(frozen=True)
    class Stored:
        seen: set[int]

    hint = plain.hints(Stored)["seen"]
    with pytest.raises(TypeError, match="cannot store"):
        plain.writer(hint)
    with pytest.raises(TypeError, match="cannot store seen"):
        plain.reader(hint, "seen")
