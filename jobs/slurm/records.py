"""The record of jobs sent to clusters (``clusters.db``): written by clients, read by anyone.

``jobs.db`` has one writer, the local daemon; cluster jobs have none of their own (no gpuq daemon on a
login node), so each client that submits, cancels or looks at them writes here, one short transaction
at a time under SQLite's own locking. The file uses SQLite's rollback journal, not WAL: on a cluster the
state directory may live on a network filesystem, where WAL's shared memory does not work.

The records are the local queue's ``JobRecord``, with where they run (cluster, Slurm id, node) filled in.
Environments are not kept: they went to sbatch, and they may hold secrets.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput, StateDirError
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.store import rows as job_rows

TABLE_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    cluster TEXT NOT NULL,
    external_id TEXT NOT NULL,
    state TEXT NOT NULL,
    uid INTEGER NOT NULL,
    user TEXT NOT NULL,
    spec TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    gpus TEXT NOT NULL DEFAULT '[]',
    exit_code INTEGER,
    signal INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    log TEXT NOT NULL DEFAULT '',
    node TEXT,
    array_id INTEGER,
    array_index INTEGER,
    attempt INTEGER NOT NULL DEFAULT 1,
    held INTEGER NOT NULL DEFAULT 0,
    cancel_by TEXT
);
CREATE INDEX IF NOT EXISTS jobs_active ON jobs(state) WHERE state IN ('pending', 'running');
CREATE INDEX IF NOT EXISTS jobs_array ON jobs(array_id) WHERE array_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS arrays (
    id INTEGER PRIMARY KEY,
    cluster TEXT NOT NULL,
    external_id TEXT NOT NULL,
    uid INTEGER NOT NULL,
    user TEXT NOT NULL,
    name TEXT NOT NULL,
    size INTEGER NOT NULL,
    throttle INTEGER,
    submitted_at REAL NOT NULL
);
"""

# A record is read from the columns named as JobRecord's fields that this table has (``_SCHEMA``), by name,
# with the job table's readers (``jobs.store.rows``); a field it lacks holds its default.
_FIELDS = (
    "id",
    "cluster",
    "external_id",
    "state",
    "uid",
    "user",
    "submitted_at",
    "started_at",
    "ended_at",
    "gpus",
    "exit_code",
    "signal",
    "reason",
    "log",
    "node",
    "array_id",
    "array_index",
    "attempt",
    "held",
)
_READERS = job_rows.record_readers(_FIELDS)
_COLUMNS = ", ".join([*_FIELDS, "spec"])
# What a submit records of each job (the rest is learnt from Slurm: ``update``), and what a refresh updates.
_INSERTED = ("id", "cluster", "external_id", "state", "uid", "user", "submitted_at", "log", "array_id", "array_index")
_UPDATED = ("state", "started_at", "ended_at", "gpus", "exit_code", "signal", "reason", "node", "attempt", "held")
_ACTIVE = "state IN ('pending', 'running')"


@dataclass(frozen=True)
class ClusterArray:
    """An array sent to a cluster: its gpuq id, and the Slurm array job that holds its members."""

    id: int
    cluster: str
    external_id: str
    uid: int
    user: str
    name: str
    size: int
    throttle: int | None
    submitted_at: float


class ClusterTable:
    """``clusters.db``; an absent file reads as empty and is created by the first ``insert``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> ClusterTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ----------------------------------------------------------------------------------

    def insert(self, records: Sequence[JobRecord], array: ClusterArray | None = None) -> None:
        """Record newly submitted jobs (and their array) in one transaction."""
        rows = [(*(job_rows.to_column(getattr(r, name)) for name in _INSERTED), _spec_json(r.spec)) for r in records]
        with self._write(create=True) as db:
            if array is not None:
                db.execute(
                    "INSERT INTO arrays (id, cluster, external_id, uid, user, name, size, throttle, submitted_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        array.id,
                        array.cluster,
                        array.external_id,
                        array.uid,
                        array.user,
                        array.name,
                        array.size,
                        array.throttle,
                        array.submitted_at,
                    ),
                )
            db.executemany(
                f"INSERT INTO jobs ({', '.join(_INSERTED)}, spec) VALUES ({', '.join('?' * (len(_INSERTED) + 1))})",
                rows,
            )

    def update(self, records: Sequence[JobRecord]) -> None:
        """Write what a refresh learnt about active jobs; a job that has ended meanwhile is left alone
        (another client recorded its end first: the first word on an ending is the one kept)."""
        if not records:
            return
        with self._write() as db:
            db.executemany(
                f"UPDATE jobs SET {', '.join(f'{name}=?' for name in _UPDATED)} WHERE id=? AND {_ACTIVE}",
                [(*(job_rows.to_column(getattr(r, name)) for name in _UPDATED), r.id) for r in records],
            )

    def set_cancel_by(self, job_ids: Iterable[int], who: str | None) -> None:
        """Who asked for a cancel, so that the ending Slurm reports is recorded as theirs."""
        with self._write() as db:
            db.executemany(f"UPDATE jobs SET cancel_by=? WHERE id=? AND {_ACTIVE}", [(who, i) for i in job_ids])

    # -- reads -----------------------------------------------------------------------------------

    def get(self, job_id: int) -> JobRecord | None:
        rows = self._read(f"SELECT {_COLUMNS} FROM jobs WHERE id=?", (job_id,))
        return _records(rows)[0] if rows else None

    def records(self, *, active_only: bool = False, limit: int | None = None) -> list[JobRecord]:
        """Jobs in id order; ``limit`` keeps the most recent ones."""
        where = f"WHERE {_ACTIVE}" if active_only else ""
        if limit is None:
            rows = self._read(f"SELECT {_COLUMNS} FROM jobs {where} ORDER BY id")
        else:
            rows = self._read(
                f"SELECT * FROM (SELECT {_COLUMNS} FROM jobs {where} ORDER BY id DESC LIMIT ?) ORDER BY id", (limit,)
            )
        return _records(rows)

    def members(self, array_id: int) -> list[JobRecord]:
        return _records(self._read(f"SELECT {_COLUMNS} FROM jobs WHERE array_id=? ORDER BY id", (array_id,)))

    def arrays(self, ids: Iterable[int] | None = None) -> dict[int, ClusterArray]:
        query = f"SELECT {', '.join(field.name for field in dataclasses.fields(ClusterArray))} FROM arrays"
        if ids is None:
            rows = self._read(query)
        else:
            wanted = list(ids)
            rows = self._read(f"{query} WHERE id IN ({','.join('?' * len(wanted))})", wanted) if wanted else []
        return {row["id"]: ClusterArray(**dict(zip(row.keys(), row, strict=True))) for row in rows}

    def cancel_by(self, job_ids: Iterable[int]) -> dict[int, str]:
        wanted = list(job_ids)
        if not wanted:
            return {}
        rows = self._read(
            f"SELECT id, cancel_by FROM jobs WHERE cancel_by IS NOT NULL AND id IN ({','.join('?' * len(wanted))})",
            wanted,
        )
        return {row["id"]: row["cancel_by"] for row in rows}

    def max_id(self) -> int:
        """The highest id recorded here: an array's members come after its own id."""
        rows = self._read("SELECT MAX(id) FROM (SELECT MAX(id) AS id FROM jobs UNION ALL SELECT MAX(id) FROM arrays)")
        return int(rows[0][0] or 0) if rows else 0

    # -- the connection ----------------------------------------------------------------------------

    def _connect(self, *, create: bool) -> sqlite3.Connection | None:
        if self._db is not None:
            return self._db
        if not create and not self.path.exists():
            return None
        try:
            if not self.path.exists():
                _create(self.path)
            db = sqlite3.connect(self.path, isolation_level=None, timeout=30)  # clients queue on the lock
            version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as err:
            raise StateDirError(f"cannot open {self.path}: {err}; move it aside to start a new record") from None
        if version > TABLE_VERSION:
            db.close()
            raise StateDirError(f"{self.path} was written by a newer gpuq (version {version}); upgrade gpuq to read it")
        self._db = db
        return db

    def _read(self, query: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        db = self._connect(create=False)
        if db is None:
            return []
        try:
            cursor = db.cursor()
            cursor.row_factory = sqlite3.Row  # read by column name
            return cursor.execute(query, args).fetchall()
        except sqlite3.DatabaseError as err:
            raise StateDirError(f"cannot read {self.path}: {err}; move it aside to start a new record") from None

    def _write(self, *, create: bool = False) -> _Transaction:
        db = self._connect(create=create)
        if db is None:
            raise StateDirError(f"{self.path} does not exist: no job was ever sent to a cluster from here")
        return _Transaction(db, self.path)


class _Transaction:
    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db = db
        self._path = path

    def __enter__(self) -> sqlite3.Connection:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as err:
            raise StateDirError(f"cannot write {self._path}: {err}") from None
        return self._db

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        if kind is None:
            try:
                self._db.execute("COMMIT")
                return
            except sqlite3.DatabaseError as err:
                self._db.execute("ROLLBACK")
                raise StateDirError(f"cannot write {self._path}: {err}; free some disk space and try again") from None
        self._db.execute("ROLLBACK")
        if isinstance(value, sqlite3.DatabaseError):
            raise StateDirError(f"cannot write {self._path}: {value}") from None


def _create(path: Path) -> None:
    """Build the file under a temp name and link it in: a reader never sees a file without the schema, and
    of two clients creating it at once, one wins and the other uses the winner's (a rename would replace it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    db = sqlite3.connect(tmp, isolation_level=None)
    try:
        db.executescript(_SCHEMA)
        db.execute(f"PRAGMA user_version={TABLE_VERSION}")
    finally:
        db.close()
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def _spec_json(spec: JobSpec) -> str:
    data = spec.to_json()
    del data["env"]  # handed to sbatch, never stored: it may hold secrets
    return json.dumps(data)


def _records(rows: Sequence[sqlite3.Row]) -> list[JobRecord]:
    records: list[JobRecord] = []
    try:
        for row, fields in zip(rows, job_rows.read_fields(rows, _READERS), strict=True):
            records.append(JobRecord(spec=JobSpec.from_json({**json.loads(row["spec"]), "env": {}}), **fields))
    except (BadInput, ValueError, TypeError, KeyError, RecursionError) as err:
        damaged = rows[len(records)]["id"]  # the first one not read
        raise StateDirError(f"a cluster job record (id {damaged}) cannot be read ({err}); it was damaged") from None
    return records
