"""The job table: SQLite in WAL mode, written by the daemon only, read by anyone.

WAL lets ``gpuq status`` read while the daemon writes, and every write is a transaction, so a reader
never sees half a record. ``synchronous=FULL``: the daemon deletes a spool file only after the
transaction that recorded it, so that transaction must be on disk first (fsync costs ~0.3 ms here).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from jobs.errors import StateDirError
from jobs.model import JobRecord, JobSpec, JobState, Launch, Outcome

TABLE_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    state TEXT NOT NULL,
    uid INTEGER NOT NULL,
    user TEXT NOT NULL,
    priority INTEGER NOT NULL,
    spec TEXT NOT NULL,
    env TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    gpus TEXT NOT NULL DEFAULT '[]',
    gpu_uuids TEXT NOT NULL DEFAULT '[]',
    exit_code INTEGER,
    signal INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    peak_mem INTEGER,
    log TEXT NOT NULL DEFAULT '',
    shim_pid INTEGER,
    shim_start REAL,
    boot_id TEXT,
    port INTEGER,
    cancel_by TEXT,
    array_id INTEGER,
    array_index INTEGER,
    attempt INTEGER NOT NULL DEFAULT 1,
    held INTEGER NOT NULL DEFAULT 0,
    not_before REAL
);
CREATE INDEX IF NOT EXISTS jobs_array ON jobs(array_id) WHERE array_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_active ON jobs(state) WHERE state IN ('pending', 'running');
"""

_COLUMNS = (
    "id, state, uid, user, priority, spec, submitted_at, started_at, ended_at, gpus, gpu_uuids, "
    "exit_code, signal, reason, peak_mem, log, array_id, array_index, attempt, held"
)


class JobTable:
    def __init__(self, path: Path, *, create: bool = False) -> None:
        self.path = path
        if create and not path.exists():
            _create(path)
        if not path.exists():
            self._db = sqlite3.connect(":memory:", isolation_level=None)
            self._db.executescript(_SCHEMA)  # an empty queue: nothing was ever submitted here
            return
        try:
            self._db = sqlite3.connect(path, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA synchronous=FULL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > TABLE_VERSION:
                raise StateDirError(
                    f"{path} was written by a newer gpuq (table version {version}); upgrade gpuq to read it"
                )
        except sqlite3.DatabaseError as err:
            raise StateDirError(f"cannot read the job table {path}: {err}; run `gpuq doctor`") from None

    def close(self) -> None:
        self._db.close()

    # -- writes (daemon only) ------------------------------------------------------------------

    def insert_pending(self, records: Sequence[JobRecord]) -> list[int]:
        """Record new jobs as pending in one transaction; ids already present are skipped (idempotent)."""
        with self._transaction():
            known = self._existing({r.id for r in records})
            fresh = [r for r in records if r.id not in known]
            self._db.executemany(
                "INSERT INTO jobs (id, state, uid, user, priority, spec, env, submitted_at, log, array_id,"
                " array_index, held) VALUES (?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (r.id, r.uid, r.user, r.spec.priority, _spec_json(r.spec), json.dumps(dict(r.spec.env)),
                     r.submitted_at, r.log, r.array_id, r.array_index, int(r.held))
                    for r in fresh
                ],
            )  # fmt: skip
        return [r.id for r in fresh]

    def mark_running(
        self, job_id: int, gpus: Sequence[int], uuids: Sequence[str], started_at: float, launch: Launch
    ) -> None:
        with self._transaction():
            self._db.execute(
                "UPDATE jobs SET state='running', gpus=?, gpu_uuids=?, started_at=?, shim_pid=?,"
                " shim_start=?, boot_id=?, port=? WHERE id=? AND state='pending'",
                (json.dumps(list(gpus)), json.dumps(list(uuids)), started_at, launch.shim_pid,
                 launch.shim_start, launch.boot_id, launch.port, job_id),
            )  # fmt: skip

    def finish(self, job_id: int, outcome: Outcome, ended_at: float) -> bool:
        """Record how an active job ended. False if it had already ended (a second report is ignored)."""
        with self._transaction():
            cursor = self._db.execute(
                "UPDATE jobs SET state=?, exit_code=?, signal=?, reason=?, ended_at=?"
                " WHERE id=? AND state IN ('pending', 'running')",
                (outcome.state.value, outcome.exit_code, outcome.signal, outcome.reason, ended_at, job_id),
            )
        return cursor.rowcount == 1

    def requeue(self, job_id: int, reason: str) -> None:
        """Put a job that never started back in the queue (its launch was interrupted before the go)."""
        with self._transaction():
            self._db.execute(
                "UPDATE jobs SET state='pending', gpus='[]', gpu_uuids='[]', started_at=NULL, shim_pid=NULL,"
                " shim_start=NULL, boot_id=NULL, port=NULL, cancel_by=NULL, reason=? WHERE id=? AND state='running'",
                (reason, job_id),
            )

    def set_reasons(self, reasons: dict[int, str]) -> None:
        """Record why pending jobs wait, for `gpuq status`."""
        with self._transaction():
            self._db.executemany(
                "UPDATE jobs SET reason=? WHERE id=? AND state='pending'", [(r, i) for i, r in reasons.items()]
            )

    def set_cancel_by(self, job_id: int, who: str) -> None:
        with self._transaction():
            self._db.execute("UPDATE jobs SET cancel_by=? WHERE id=? AND state='running'", (who, job_id))

    def set_peak_mem(self, peaks: dict[int, int]) -> None:
        with self._transaction():
            self._db.executemany(
                "UPDATE jobs SET peak_mem=MAX(COALESCE(peak_mem, 0), ?) WHERE id=?",
                [(peak, job_id) for job_id, peak in peaks.items()],
            )

    # -- reads ----------------------------------------------------------------------------------

    def get(self, job_id: int, *, with_env: bool = False) -> JobRecord | None:
        row = self._db.execute(f"SELECT {_COLUMNS}, env FROM jobs WHERE id=?", (job_id,)).fetchone()
        return None if row is None else _record(row, env=row[-1] if with_env else None)

    def records(self, *, active_only: bool = False, limit: int | None = None) -> list[JobRecord]:
        """Jobs in id order; ``limit`` keeps the most recent ones."""
        where = "WHERE state IN ('pending', 'running')" if active_only else ""
        if limit is None:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM jobs {where} ORDER BY id").fetchall()
        else:
            rows = self._db.execute(
                f"SELECT * FROM (SELECT {_COLUMNS} FROM jobs {where} ORDER BY id DESC LIMIT ?) ORDER BY id",
                (limit,),
            ).fetchall()
        return [_record(row) for row in rows]

    def pending(self) -> list[JobRecord]:
        """Pending jobs in queue order: priority first, then submission order."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS}, env FROM jobs WHERE state='pending' ORDER BY priority DESC, id"
        ).fetchall()
        return [_record(row, env=row[-1]) for row in rows]

    def running(self) -> list[tuple[JobRecord, Launch]]:
        rows = self._db.execute(
            f"SELECT {_COLUMNS}, shim_pid, shim_start, boot_id, port, cancel_by FROM jobs"
            " WHERE state='running' ORDER BY id"
        ).fetchall()
        return [(_record(row[:-5]), Launch(*row[-5:])) for row in rows]

    def owners(self, job_ids: Iterable[int]) -> dict[int, tuple[int, str, JobState]]:
        ids = list(job_ids)
        marks = ",".join("?" * len(ids))
        rows = self._db.execute(f"SELECT id, uid, user, state FROM jobs WHERE id IN ({marks})", ids)
        return {row[0]: (row[1], row[2], JobState(row[3])) for row in rows}

    def max_id(self) -> int:
        return int(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0])

    def _existing(self, ids: set[int]) -> set[int]:
        return set(self.owners(ids)) if ids else set()

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


def _create(path: Path) -> None:
    """Build the table under a temp name and rename it in: a reader never sees a file without the schema."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    db = sqlite3.connect(tmp, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")  # recorded in the file: every later connection uses WAL
        db.executescript(_SCHEMA)
        db.execute(f"PRAGMA user_version={TABLE_VERSION}")
    finally:
        db.close()
    os.replace(tmp, path)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")


def _spec_json(spec: JobSpec) -> str:
    data = spec.to_json()
    del data["env"]  # kept in its own column: listings never parse environments
    return json.dumps(data)


def _record(row: Sequence[Any], env: str | None = None) -> JobRecord:
    spec_data = json.loads(row[5])
    spec_data["env"] = json.loads(env) if env else {}
    return JobRecord(
        id=row[0],
        state=JobState(row[1]),
        uid=row[2],
        user=row[3],
        spec=JobSpec.from_json(spec_data),
        submitted_at=row[6],
        started_at=row[7],
        ended_at=row[8],
        gpus=tuple(json.loads(row[9])),
        gpu_uuids=tuple(json.loads(row[10])),
        exit_code=row[11],
        signal=row[12],
        reason=row[13],
        peak_mem=row[14],
        log=row[15],
        array_id=row[16],
        array_index=row[17],
        attempt=row[18],
        held=bool(row[19]),
    )
