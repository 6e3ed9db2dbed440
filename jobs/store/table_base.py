"""What every part of the job table shares (``table.JobTable`` puts them together): its one SQLite connection,
the transaction a tick's writes join, the guard that turns a damaged table into one line, and a shared queue's
private specs (written public, read back whole by its daemon)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from gpuq_scheduler.jobs.errors import BadInput, StateDirError
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.store import rows as job_rows
from gpuq_scheduler.jobs.store.private import PrivateSpecs, public

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S", bound="TableBase")


def reading(read: Callable[Concatenate[S, P], T]) -> Callable[Concatenate[S, P], T]:
    """A read that meets a damaged table (or a record that no longer parses) says so in one line that
    names the file and what to do, instead of raising sqlite3.DatabaseError through every reader."""

    def checked(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
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


class TableBase:
    """The connection and what the reads and writes of the job table share; ``JobTable`` opens it."""

    path: Path
    private: PrivateSpecs | None
    _db: sqlite3.Connection
    _columns: str  # a record's columns, as this table has them (``rows.record_select``)

    def batch(self) -> Transaction:
        """Group the writes of a whole tick into one transaction: every commit costs an fsync, and a
        job ending and the next one starting on its GPU then cost one between them, not four."""
        return Transaction(self._db)

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


class Transaction:
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
