# One module past 400 lines on purpose: every statement run on the job table, over the one connection a tick shares.
"""The job table: SQLite in WAL mode, written by the daemon only, read by anyone.

WAL lets ``gpuq status`` read while the daemon writes, and every write is a transaction, so a reader
never sees half a record.

Durability: with WAL every commit survives a crash of the daemon. Only ingesting new jobs is also
fsynced (``synchronous=FULL``), because their spool files are deleted right after: a submit that
returned an id survives a power cut. Other commits (a job started, a job ended) use
``synchronous=NORMAL``: a power cut may lose the last of them, and after the reboot those jobs are
seen as lost (the boot id changed) and retried as asked. An fsync per launch would cost the dispatch
path 0.3 ms on an idle disk and ~9 ms on a busy one (measured here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from gpuq_scheduler.jobs import listing
from gpuq_scheduler.jobs.errors import BadInput, StateDirError
from gpuq_scheduler.jobs.listing import Line
from gpuq_scheduler.jobs.model import ArrayInfo, JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome, Step, in_host_memory
from gpuq_scheduler.jobs.store import rows as job_rows
from gpuq_scheduler.jobs.store import schema
from gpuq_scheduler.jobs.store.private import PrivateSpecs, public

# A state as SQL writes it, from the enum (``schema.states`` makes the conditions).
_PENDING, _RUNNING, _SUSPENDED = (schema.literal(s) for s in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED))
_AGAIN = schema.states(JobState.RUNNING, JobState.FAILED, JobState.TIMEOUT, JobState.LOST)  # what a requeue takes

P = ParamSpec("P")
T = TypeVar("T")


def _reading(read: Callable[Concatenate[JobTable, P], T]) -> Callable[Concatenate[JobTable, P], T]:
    """A read that meets a damaged table (or a record that no longer parses) says so in one line that
    names the file and what to do, instead of raising sqlite3.DatabaseError through every reader."""

    def checked(self: JobTable, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return read(self, *args, **kwargs)
        except sqlite3.DatabaseError as err:
            raise StateDirError(f"cannot read the job table {self.path}: {err}; run `gpuq doctor`") from None
        except (ValueError, KeyError, TypeError, RecursionError) as err:
            raise StateDirError(
                f"the job table {self.path} holds a record gpuq cannot read ({type(err).__name__}: {err}); "
                "run `gpuq doctor`"
            ) from None

    checked.__name__, checked.__doc__ = read.__name__, read.__doc__
    return checked


class JobTable:
    """``private`` (a shared queue's daemon only): specs are written public and read back whole."""

    def __init__(self, path: Path, *, create: bool = False, private: PrivateSpecs | None = None) -> None:
        self.path = path
        self.private = private
        self._db, version = schema.connect(path, create=create)
        self._listed = version >= 2  # a table no daemon of this version opened yet: lines parse specs
        # A line's attempt and time suspended (``jobs.listing.Line``): none suspended before version 4.
        self._suspension = ", attempt, " + ("COALESCE(suspended_for, 0), suspended_at" if version >= 4 else "0, NULL")
        # A table no daemon of this version opened yet lacks the newer columns (no causes recorded before
        # version 3, nothing suspended before 4): its records hold those fields' defaults.
        self._columns = job_rows.record_select(job_rows.columns_of(self._db, "jobs"))

    def close(self, *, rollback_mode: bool = False) -> None:
        """``rollback_mode`` (the daemon's clean stop; the next one puts WAL back): readers who cannot write
        the directory need no ``-shm`` then, which the last WAL connection deletes and they cannot make."""
        if rollback_mode:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA journal_mode=DELETE")
        self._db.close()

    # -- writes (daemon only) ------------------------------------------------------------------

    def insert_pending(
        self, records: Sequence[JobRecord], arrays: Sequence[ArrayInfo] = (), *, durable: bool = True,
        intake: Sequence[tuple[str, int, int, float]] = (),
    ) -> list[int]:  # fmt: skip
        """Record new jobs (and arrays) as pending in one transaction; ids already present are skipped.

        Array members keep no environment of their own: they share their array's, stored once.
        ``durable=False``: the caller keeps the requests until ``sync`` (the daemon: after this tick's launches).
        ``intake``: (token, uid, id, now) of the shared queue's requests these jobs came from (``intake_ids``).
        """
        if not durable:
            return self._insert(records, arrays, intake)
        self._db.execute("PRAGMA synchronous=FULL")  # the spool files go next: this must be on disk
        try:
            return self._insert(records, arrays, intake)
        finally:
            self._db.execute("PRAGMA synchronous=NORMAL")

    def sync(self) -> None:
        """Make every commit so far survive a power cut, as synchronous=FULL does per commit: each one is in
        the write-ahead log once it returns, so an fsync of the log and of the directory naming it suffices."""
        for path in (f"{self.path}-wal", self.path.parent):
            with contextlib.suppress(FileNotFoundError):  # no log: checkpointed into the table, synced then
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def _insert(
        self, records: Sequence[JobRecord], arrays: Sequence[ArrayInfo],
        intake: Sequence[tuple[str, int, int, float]],
    ) -> list[int]:  # fmt: skip
        with self.batch():
            self._db.executemany(
                "INSERT OR IGNORE INTO intake (digest, uid, id, at) VALUES (?, ?, ?, ?)",
                [(schema.token_digest(token), uid, job_id, at) for token, uid, job_id, at in intake],
            )
            known = set(self.owners({r.id for r in records})) if records else set()
            fresh = [r for r in records if r.id not in known]
            known_arrays = {row[0] for row in self._db.execute("SELECT id FROM arrays")} if arrays else set()
            self._db.executemany(
                "INSERT INTO arrays (id, uid, user, name, size, throttle, env, notify, submitted_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(a.id, a.uid, a.user, a.name, a.size, a.throttle, "{}" if self.private else json.dumps(dict(a.env)),
                  None if self.private else a.notify, a.submitted_at)
                 for a in arrays if a.id not in known_arrays],
            )  # fmt: skip
            spec_columns, spec_values = job_rows.SPEC_COLUMNS, job_rows.SPEC_VALUES
            self._db.executemany(
                f"INSERT INTO jobs (id, state, uid, user, priority, env, submitted_at, log, array_id, array_index,"
                f" held, {spec_columns}) VALUES (?, {_PENDING}, ?, ?, ?, ?, ?, ?, ?, ?, ?, {spec_values})",
                [
                    (r.id, r.uid, r.user, r.spec.priority,
                     "" if r.array_id is not None or self.private else json.dumps(dict(r.spec.env)),
                     r.submitted_at, r.log, r.array_id, r.array_index, int(r.held), *self._spec_row(r.spec))
                    for r in fresh
                ],
            )  # fmt: skip
        return [r.id for r in fresh]

    def mark_running(
        self, job_id: int, gpus: Sequence[int], uuids: Sequence[str], started_at: float, launch: Launch
    ) -> None:
        with self.batch():
            self._db.execute(
                f"UPDATE jobs SET state={_RUNNING}, reason='', gpus=?, gpu_uuids=?, started_at=?, shim_pid=?,"
                f" shim_start=?, boot_id=?, port=? WHERE id=? AND {schema.states(JobState.PENDING)}",
                (json.dumps(list(gpus)), json.dumps(list(uuids)), started_at, launch.shim_pid,
                 launch.shim_start, launch.boot_id, launch.port, job_id),
            )  # fmt: skip

    def finish(self, job_id: int, outcome: Outcome, ended_at: float) -> bool:
        """Record how an active job ended. False if it had already ended (a second report is ignored)."""
        with self.batch():
            cursor = self._db.execute(
                "UPDATE jobs SET state=?, exit_code=?, signal=?, reason=?, ended_at=?, cause=?, culprit=?,"
                f" step=NULL WHERE id=? AND {schema.LIVE_STATES}",
                (outcome.state.value, outcome.exit_code, outcome.signal, outcome.recorded_reason(), ended_at,
                 outcome.cause.value, outcome.culprit, job_id),
            )
        return cursor.rowcount == 1

    def finish_many(self, endings: Sequence[tuple[int, Outcome, float]]) -> None:
        """Record many endings in one transaction (cancelling a 10,000-member array is one fsync)."""
        with self.batch():
            self._db.executemany(
                "UPDATE jobs SET state=?, exit_code=?, signal=?, reason=?, ended_at=?, cause=?, culprit=?,"
                f" step=NULL WHERE id=? AND {schema.LIVE_STATES}",
                [(o.state.value, o.exit_code, o.signal, o.reason, t, o.cause.value, o.culprit, job_id)
                 for job_id, o, t in endings],
            )

    def mark_step(self, job_id: int, step: Step) -> bool:
        """Record a suspend or resume as begun, before its first act (False: the job is not in the state the
        step starts from, or another step is in progress)."""
        source = (JobState.RUNNING if step is Step.SUSPENDING else JobState.SUSPENDED).value
        with self.batch():
            cursor = self._db.execute(
                "UPDATE jobs SET step=? WHERE id=? AND state=? AND step IS NULL", (step.value, job_id, source)
            )
        return cursor.rowcount == 1

    def undo_step(self, job_id: int) -> None:
        """The step in progress was undone: the job stands where it stood before it."""
        with self.batch():
            self._db.execute("UPDATE jobs SET step=NULL WHERE id=?", (job_id,))

    def mark_suspended(self, job_id: int, host_bytes: int, at: float) -> None:
        """The suspend finished: its GPUs are back in the pool, its state in ``host_bytes`` of host memory."""
        with self.batch():
            self._db.execute(
                f"UPDATE jobs SET state={_SUSPENDED}, step=NULL, host_bytes=?, suspended_at=?, reason=?"
                f" WHERE id=? AND {schema.states(JobState.RUNNING)}",
                (host_bytes, at, in_host_memory(host_bytes), job_id),
            )

    def mark_resumed(self, job_id: int, at: float) -> None:
        """The resume finished: running on its GPUs again, the time it spent suspended counted."""
        with self.batch():
            self._db.execute(
                f"UPDATE jobs SET state={_RUNNING}, step=NULL, host_bytes=NULL, reason='',"
                " suspended_for=COALESCE(suspended_for, 0) + MAX(0, ? - COALESCE(suspended_at, ?)),"
                f" suspended_at=NULL WHERE id=? AND {schema.states(JobState.SUSPENDED)}",
                (at, at, job_id),
            )

    def requeue(
        self, job_id: int, reason: str, *, attempt: int | None = None, not_before: float | None = None,
        outcome: Outcome | None = None,
    ) -> None:  # fmt: skip
        """Put a job back in the queue: a launch interrupted before its go, a retry (a new attempt), or a
        victim of another job's memory (``outcome``: the run's, whose cause and culprit it keeps to show)."""
        cause, culprit = (None, None) if outcome is None else (outcome.cause.value, outcome.culprit)
        with self.batch():
            self._db.execute(
                f"UPDATE jobs SET state={_PENDING}, gpus='[]', gpu_uuids='[]', started_at=NULL, ended_at=NULL,"
                " exit_code=NULL, signal=NULL, shim_pid=NULL, shim_start=NULL, boot_id=NULL, port=NULL,"
                " cancel_by=NULL, reason=?, attempt=COALESCE(?, attempt), not_before=?, cause=?, culprit=?"
                f" WHERE id=? AND {_AGAIN}",
                (reason, attempt, not_before, cause, culprit, job_id),
            )

    @_reading
    def not_before(self) -> dict[int, float]:
        query = f"SELECT id, not_before FROM jobs WHERE {schema.states(JobState.PENDING)} AND not_before IS NOT NULL"
        rows = self._db.execute(query)
        return {row[0]: row[1] for row in rows}

    def set_reasons(self, reasons: dict[int, str], state: JobState = JobState.PENDING) -> None:
        """Record why pending jobs wait (or, of running ones, how long an interactive job was idle)."""
        with self.batch():
            self._db.executemany(
                "UPDATE jobs SET reason=? WHERE id=? AND state=?", [(r, i, state.value) for i, r in reasons.items()]
            )

    def set_cancel_by(self, job_id: int, who: str) -> None:
        with self.batch():
            running = schema.states(JobState.RUNNING)
            self._db.execute(f"UPDATE jobs SET cancel_by=? WHERE id=? AND {running}", (who, job_id))

    def set_learned(self, learned: Mapping[str, tuple[int, int, bool]]) -> None:
        """What --mem auto learned: kind -> (bytes, job id, raised after an out-of-memory)."""
        with self.batch():
            self._db.executemany(
                "INSERT OR REPLACE INTO learned (kind, bytes, job_id, raised) VALUES (?, ?, ?, ?)",
                [(kind, size, job_id, int(raised)) for kind, (size, job_id, raised) in learned.items()],
            )

    @_reading
    def learned(self) -> dict[str, tuple[int, int, bool]]:
        try:
            rows = self._db.execute("SELECT kind, bytes, job_id, raised FROM learned").fetchall()
        except sqlite3.OperationalError:  # a table from before --mem auto, opened by a reader
            return {}
        return {kind: (size, job_id, bool(raised)) for kind, size, job_id, raised in rows}

    def set_host_usage(self, job_id: int, cpu_seconds: float | None, peak_ram: int | None) -> None:
        """What the job's cgroup accounted of its run (its latest attempt's)."""
        with self.batch():
            self._db.execute(
                "INSERT OR REPLACE INTO host_usage (job_id, cpu_seconds, peak_ram) VALUES (?, ?, ?)",
                (job_id, cpu_seconds, peak_ram),
            )

    @_reading
    def host_usage(self, job_ids: Iterable[int] | None = None) -> dict[int, tuple[float | None, int | None]]:
        """(CPU seconds, peak host memory) of each job's last run where its cgroup accounted them, for
        ``job_ids`` (None: every job); jobs with none are left out."""
        try:
            if job_ids is None:
                rows = self._db.execute("SELECT job_id, cpu_seconds, peak_ram FROM host_usage").fetchall()
            else:
                ids = list(job_ids)
                if not ids:
                    return {}
                marks = ",".join("?" * len(ids))
                rows = self._db.execute(
                    f"SELECT job_id, cpu_seconds, peak_ram FROM host_usage WHERE job_id IN ({marks})", ids
                ).fetchall()
        except sqlite3.OperationalError:  # a table no daemon of this version opened yet
            return {}
        return {int(job_id): (cpu, peak) for job_id, cpu, peak in rows}

    def set_peak_mem(self, peaks: dict[int, int]) -> None:
        with self.batch():
            self._db.executemany(
                "UPDATE jobs SET peak_mem=MAX(COALESCE(peak_mem, 0), ?) WHERE id=?",
                [(peak, job_id) for job_id, peak in peaks.items()],
            )

    # -- reads ----------------------------------------------------------------------------------

    @_reading
    def get(self, job_id: int, *, with_env: bool = False) -> JobRecord | None:
        row = self._named(
            f"SELECT {self._columns}, {schema.ENV} AS job_env FROM {schema.JOINED} WHERE jobs.id=?", (job_id,)
        ).fetchone()
        if row is None:
            return None
        record = job_rows.records_from([row], with_env=with_env)[0]
        return self._whole(record) if with_env else record

    @_reading
    def records(self, *, active_only: bool = False, limit: int | None = None) -> list[JobRecord]:
        """Jobs in id order; ``limit`` keeps the most recent ones."""
        where = f"WHERE {schema.LIVE_STATES}" if active_only else ""
        if limit is None:
            rows = self._named(f"SELECT {self._columns} FROM jobs {where} ORDER BY id").fetchall()
        else:
            rows = self._named(
                f"SELECT * FROM (SELECT {self._columns} FROM jobs {where} ORDER BY id DESC LIMIT ?) ORDER BY id",
                (limit,),
            ).fetchall()
        return job_rows.records_from(rows)

    @_reading
    def lines(self) -> list[Line]:
        """Every job as a listing's line (``jobs.listing``), in id order: no record is built."""
        columns = listing.COLUMNS if self._listed else listing.FROM_SPEC
        query = f"SELECT {columns}{self._suspension} FROM jobs ORDER BY id"
        return [listing.line_from(row) for row in self._db.execute(query)]

    @_reading
    def pending(self) -> list[JobRecord]:
        """Pending jobs in queue order: priority first, then submission order."""
        rows = self._named(
            f"SELECT {self._columns}, {schema.ENV} AS job_env FROM {schema.JOINED}"
            f" WHERE {schema.states(JobState.PENDING)} ORDER BY priority DESC, jobs.id"
        ).fetchall()
        envs: dict[str, Mapping[str, str]] = {}  # 10,000 members of one array share one parsed environment
        return [self._whole(record) for record in job_rows.records_from(rows, with_env=True, envs=envs)]

    @_reading
    def arrays(self, ids: Iterable[int] | None = None, *, active_only: bool = False) -> dict[int, ArrayInfo]:
        """Arrays by id (without their environments); ``active_only``: those with a member pending or running."""
        query = f"SELECT {', '.join(_ARRAY)}, notified FROM arrays"  # all but its environment
        if active_only:
            active = f"SELECT array_id FROM jobs WHERE {schema.LIVE_STATES} AND array_id IS NOT NULL"
            rows = self._named(f"{query} WHERE id IN ({active})").fetchall()
        elif ids is None:
            rows = self._named(query).fetchall()
        else:
            wanted = list(ids)
            rows = self._named(f"{query} WHERE id IN ({','.join('?' * len(wanted))})", wanted).fetchall()
        found = {
            row["id"]: ArrayInfo(**{name: row[name] for name in _ARRAY}, notified=bool(row["notified"]))
            for row in rows
        }
        if self.private is not None:
            for array_id, info in found.items():
                notify = self._private_field(array_id, info.uid, "notify")
                found[array_id] = dataclasses.replace(info, notify=notify if isinstance(notify, str) else None)
        return found

    @_reading
    def members(self, array_id: int) -> list[JobRecord]:
        query = f"SELECT {self._columns} FROM jobs WHERE array_id=? ORDER BY id"
        rows = self._named(query, (array_id,)).fetchall()
        return job_rows.records_from(rows)

    def set_notified(self, array_id: int) -> None:
        with self.batch():
            self._db.execute("UPDATE arrays SET notified=1 WHERE id=?", (array_id,))

    @_reading
    def settings(self) -> dict[str, Any]:
        return {key: json.loads(value) for key, value in self._db.execute("SELECT key, value FROM settings")}

    def set_setting(self, key: str, value: Any) -> None:
        with self.batch():
            self._db.execute("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def set_held(self, job_ids: Iterable[int], held: bool, reason: str = "") -> None:
        with self.batch():
            self._db.executemany(
                f"UPDATE jobs SET held=?, reason=? WHERE id=? AND {schema.states(JobState.PENDING)}",
                [(int(held), reason, job_id) for job_id in job_ids],
            )

    def update_spec(self, job_id: int, spec: JobSpec) -> None:
        """A pending job's new priority or time limit, or a retry's new memory (callers check the state)."""
        with self.batch():
            self._db.execute(
                f"UPDATE jobs SET ({job_rows.SPEC_COLUMNS}) = ({job_rows.SPEC_VALUES}), priority=? WHERE id=?",
                (*self._spec_row(spec), spec.priority, job_id),
            )

    @_reading
    def running(self, state: JobState = JobState.RUNNING) -> list[tuple[JobRecord, Launch]]:
        """Running jobs (or, ``state``, suspended ones: alive too) and how to find each one's shim again."""
        rows = self._named(
            f"SELECT {self._columns}, {', '.join(_LAUNCH)} FROM jobs WHERE state=? ORDER BY id", (state.value,)
        ).fetchall()
        return [
            (self._whole(record), Launch(**{name: row[name] for name in _LAUNCH}))
            for record, row in zip(job_rows.records_from(rows), rows, strict=True)
        ]

    @_reading
    def owners(self, job_ids: Iterable[int]) -> dict[int, tuple[int, str, JobState]]:
        ids, found, query = list(job_ids), {}, "SELECT id, uid, user, state FROM jobs WHERE id IN "
        for at in range(0, len(ids), 10_000):  # below any SQLite's limit on variables, however many requests came
            chunk = ids[at : at + 10_000]
            rows = self._db.execute(f"{query}({','.join('?' * len(chunk))})", chunk)
            found.update({row[0]: (row[1], row[2], JobState(row[3])) for row in rows})
        return found

    @_reading
    def count_pending(self, uid: int) -> int:
        query = f"SELECT COUNT(*) FROM jobs WHERE {schema.states(JobState.PENDING)} AND uid=?"
        return int(self._db.execute(query, (uid,)).fetchone()[0])

    @_reading
    def runs_since(self, since: float) -> list[tuple[str, int, float, float]]:
        """(user, GPUs, started, ended) of the GPU runs that ended after ``since``: history for fair share."""
        rows = self._db.execute(
            "SELECT user, gpus, started_at, ended_at FROM jobs WHERE ended_at > ? AND started_at IS NOT NULL"
            " AND gpus != '[]'",
            (since,),
        )
        return [(row[0], len(json.loads(row[1])), row[2], row[3]) for row in rows]

    @_reading
    def intake_ids(self, tokens: Sequence[str]) -> dict[str, tuple[int, int]]:
        """(id, uid of its writer) given to the shared queue's requests named by ``tokens``, where one was
        given already. The table keeps only the tokens' digests (``schema.token_digest``): it is public."""
        digests = {schema.token_digest(token): token for token in tokens}
        found: dict[str, tuple[int, int]] = {}
        wanted = list(digests)
        for at in range(0, len(wanted), 500):  # under SQLite's limit on a statement's variables
            part = wanted[at : at + 500]
            query = f"SELECT digest, id, uid FROM intake WHERE digest IN ({','.join('?' * len(part))})"
            found.update({digests[row[0]]: (row[1], row[2]) for row in self._db.execute(query, part)})
        return found

    def forget_intake(self, before: float) -> None:
        """Drop the record of requests read before ``before`` (their files left the spool long ago)."""
        self._db.execute("DELETE FROM intake WHERE at < ?", (before,))  # a transaction of its own

    def max_id(self) -> int:
        return int(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0])

    def add_energy(self, joules: Mapping[int, float]) -> None:
        """Charge jobs GPU energy (``launcher.policy.energy``), added to what each was charged before. Its
        table is made by the first charge: a table no daemon of this version has opened reads as none."""
        with self.batch():
            self._db.execute(ENERGY)
            self._db.executemany(
                "INSERT INTO energy (job_id, joules) VALUES (?, ?) "
                "ON CONFLICT(job_id) DO UPDATE SET joules = joules + excluded.joules",
                list(joules.items()),
            )

    @_reading
    def energy(self, job_ids: Iterable[int] | None = None) -> dict[int, float]:
        """The GPU energy charged to each job so far, in joules (those never charged are left out)."""
        try:
            if job_ids is None:
                rows = self._db.execute("SELECT job_id, joules FROM energy").fetchall()
            else:
                ids = list(job_ids)
                if not ids:
                    return {}
                marks = ",".join("?" * len(ids))
                rows = self._db.execute(f"SELECT job_id, joules FROM energy WHERE job_id IN ({marks})", ids).fetchall()
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):
                return {}
            raise
        return {int(job_id): float(joules) for job_id, joules in rows}

    def _named(self, query: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        """``query``'s rows, read by column name (``sqlite3.Row``)."""
        cursor = self._db.cursor()
        cursor.row_factory = sqlite3.Row
        return cursor.execute(query, args)

    def _spec_row(self, spec: JobSpec) -> tuple[Any, ...]:
        return job_rows.spec_row(public(spec) if self.private is not None else spec)

    def _whole(self, record: JobRecord) -> JobRecord:
        """The record with its full spec, for the daemon of a shared queue (a no-op otherwise). A job whose
        private part is gone keeps its public spec: it can never start, and says so when it is launched."""
        if self.private is None:
            return record
        owner = record.id if record.array_id is None else record.array_id
        try:
            return record.replace(spec=self.private.restore(record.spec, owner, record.uid, record.array_index))
        except (BadInput, OSError):
            return record

    def _private_field(self, owner_id: int, uid: int, key: str) -> Any:
        assert self.private is not None
        try:
            return self.private.fields(owner_id, uid).get(key)
        except (BadInput, OSError):
            return None

    def batch(self) -> _Transaction:
        """Group the writes of a whole tick into one transaction: every commit costs an fsync, and a
        job ending and the next one starting on its GPU then cost one between them, not four."""
        return _Transaction(self._db)


class _Transaction:
    """One write transaction; inside a ``batch()`` it joins the batch's (one commit, one fsync)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._owner = False

    def __enter__(self) -> None:
        if not self._db.in_transaction:
            self._db.execute("BEGIN IMMEDIATE")
            self._owner = True

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        if self._owner:
            self._db.execute("COMMIT" if kind is None else "ROLLBACK")


# What finds a running job's shim again (``Launch``): its columns are its fields' names.
_LAUNCH = tuple(field.name for field in dataclasses.fields(Launch))
# An array's columns, read by its fields' names: all but its environment (read only where a job needs it) and
# whether it was notified (a 0 or 1 read as a boolean).
_ARRAY = tuple(field.name for field in dataclasses.fields(ArrayInfo) if field.name not in ("env", "notified"))

# Each job's GPU energy (joules), charged at every sample while it runs. A table of its own, made by the first
# charge, like ``learned`` added without a new table version: older daemons and readers never look at it.
ENERGY = "CREATE TABLE IF NOT EXISTS energy (job_id INTEGER PRIMARY KEY, joules REAL NOT NULL)"
