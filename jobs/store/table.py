"""The job table: SQLite in WAL mode, written by the daemon only, read by anyone.

WAL lets ``gpuq status`` read while the daemon writes, and every write is a transaction, so a reader
never sees half a record. ``JobTable`` is one connection that its rooms share (``table_base``): a job's
life written (``job_writes``), jobs read back (``job_reads``) and the tables beside them (``side_tables``).

Durability: with WAL every commit survives a crash of the daemon. Only ingesting new jobs is also
fsynced (``synchronous=FULL``), because their spool files are deleted right after: a submit that
returned an id survives a power cut. Other commits (a job started, a job ended) use
``synchronous=NORMAL``: a power cut may lose the last of them, and after the reboot those jobs are
seen as lost (the boot id changed) and retried as asked. An fsync per launch would cost the dispatch
path 0.3 ms on an idle disk and ~9 ms on a busy one (measured here).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from gpuq_scheduler.jobs.store import rows as job_rows
from gpuq_scheduler.jobs.store import schema
from gpuq_scheduler.jobs.store.job_writes import JobWrites
from gpuq_scheduler.jobs.store.private import PrivateSpecs
from gpuq_scheduler.jobs.store.side_tables import SideTables


class JobTable(JobWrites, SideTables):
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
