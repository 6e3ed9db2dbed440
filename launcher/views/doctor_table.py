"""``gpuq doctor``'s look at the job table: opened read-only (no checkpoint, no repair; SQLite may create its
empty -wal and -shm side files, as for any reader), checked whole before its records are trusted, and its raw
columns parsed here, so that a record the normal readers would choke on becomes a problem to report instead of
a traceback."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs.errors import GpuqError
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.store.schema import TABLE_VERSION
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.views.doctor_findings import ERROR, Problem, quote

_COLUMNS = "id, state, spec, submitted_at, started_at, ended_at, gpus, log, shim_pid, shim_start, boot_id"


@dataclass(frozen=True)
class StoredRow:
    """A job as stored, parsed just enough to check it. ``spec`` is None when it cannot be read."""

    id: int
    state: str
    spec: JobSpec | None
    submitted_at: float | None
    started_at: float | None
    ended_at: float | None
    gpus: tuple[int, ...]
    log: str
    shim_pid: int | None
    shim_start: float | None
    boot_id: str | None


def open_table(state: StateDir, problems: list[Problem]) -> sqlite3.Connection | None:
    path = state.db
    if not path.exists():
        return None  # nothing was ever ingested here: an empty queue
    damaged = (
        f"stop the daemon (`gpuq daemon stop`), save what can be saved (`sqlite3 {quote(path)} .recover | "
        "sqlite3 recovered.db`) and put recovered.db in its place, or move it aside to start an empty table"
    )
    try:
        db = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True, timeout=10, isolation_level=None)
    except sqlite3.Error as err:
        problems.append(Problem(ERROR, f"cannot open the job table {path}: {err}; check its permissions"))
        return None
    try:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        verdict = [" ".join(str(line).split()) for (line,) in db.execute("PRAGMA quick_check(3)")]
    except (sqlite3.Error, UnicodeDecodeError) as err:  # a damaged schema's text need not even be UTF-8
        db.close()
        said = " ".join(str(err).split())  # SQLite quotes the damaged schema, newlines and all: one line
        problems.append(Problem(ERROR, f"the job table {path} cannot be read ({said}): {damaged}"))
        return None
    if version > TABLE_VERSION:
        problems.append(
            Problem(
                ERROR,
                f"the job table {path} has version {version}, newer than this gpuq reads "
                f"({TABLE_VERSION}); upgrade gpuq",
            )
        )
    elif version < 1 or "jobs" not in tables:
        problems.append(
            Problem(
                ERROR,
                f"{path} is not a gpuq job table (version {version}, tables {sorted(tables)}); "
                "move it aside: the daemon creates a new one",
            )
        )
    if verdict != ["ok"]:
        problems.append(Problem(ERROR, f"the job table {path} is damaged ({'; '.join(verdict)}): {damaged}"))
    if version > TABLE_VERSION or "jobs" not in tables or verdict != ["ok"]:  # its records cannot be trusted
        db.close()
        return None
    return db


def read_rows(db: sqlite3.Connection, path: Path, problems: list[Problem]) -> list[StoredRow]:
    rows = []
    for raw in db.execute(f"SELECT {_COLUMNS} FROM jobs ORDER BY id"):
        row = _parse_row(raw)
        if row is None:
            look = f"sqlite3 {quote(path)} 'SELECT * FROM jobs WHERE id={raw[0]}'"
            problems.append(
                Problem(
                    ERROR,
                    f"the record of job {raw[0]} cannot be read, so `gpuq status` fails on it; "
                    f"stop the daemon and look at it: {look}",
                )
            )
            continue
        if row.spec is None:
            problems.append(Problem(ERROR, f"job {row.id} has an unreadable job spec; it can neither run nor be shown"))
        rows.append(row)
    return rows


def _parse_row(raw: tuple[Any, ...]) -> StoredRow | None:
    try:
        job_id, job_state, spec_text, submitted, started, ended, gpus_text, log, shim_pid, shim_start, boot = raw
        gpus = json.loads(gpus_text)
        if not isinstance(job_id, int) or not isinstance(gpus, list) or not all(isinstance(g, int) for g in gpus):
            return None
        try:
            spec_data = json.loads(spec_text)
            spec: JobSpec | None = JobSpec.from_json({**spec_data, "env": {}})
        except (GpuqError, ValueError, TypeError, RecursionError):
            spec = None
        return StoredRow(
            job_id,
            str(job_state),
            spec,
            _number(submitted),
            _number(started),
            _number(ended),
            tuple(gpus),
            str(log or ""),
            shim_pid if isinstance(shim_pid, int) else None,
            _number(shim_start),
            None if boot is None else str(boot),
        )
    except (ValueError, TypeError, RecursionError):
        return None


def highest_array_id(db: sqlite3.Connection) -> int:
    """The last id an array took: its own id, then one per member."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='arrays'").fetchone() is None:
        return 0
    return int(db.execute("SELECT COALESCE(MAX(id + size), 0) FROM arrays").fetchone()[0])


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
