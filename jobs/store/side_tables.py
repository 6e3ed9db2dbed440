"""The tables the daemon keeps beside the jobs: its settings, what --mem auto learned, each job's host usage
and GPU energy, and the shared queue's intake (which request got which id). Older tables may lack them: a read
of one that is not there is empty."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuq_scheduler.jobs.store import schema
from gpuq_scheduler.jobs.store.table_base import TableBase, reading

# Each job's GPU energy (joules), charged at every sample while it runs. A table of its own, made by the first
# charge, like ``learned`` added without a new table version: older daemons and readers never look at it.
ENERGY = "CREATE TABLE IF NOT EXISTS energy (job_id INTEGER PRIMARY KEY, joules REAL NOT NULL)"


class SideTables(TableBase):
    """Reads and writes of the tables beside ``jobs``."""

    @reading
    def settings(self) -> dict[str, Any]:
        return {key: json.loads(value) for key, value in self._db.execute("SELECT key, value FROM settings")}

    def set_setting(self, key: str, value: Any) -> None:
        with self.batch():
            self._db.execute("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def set_learned(self, learned: Mapping[str, tuple[int, int, bool]]) -> None:
        """What --mem auto learned: kind -> (bytes, job id, raised after an out-of-memory)."""
        with self.batch():
            self._db.executemany(
                "INSERT OR REPLACE INTO learned (kind, bytes, job_id, raised) VALUES (?, ?, ?, ?)",
                [(kind, size, job_id, int(raised)) for kind, (size, job_id, raised) in learned.items()],
            )

    @reading
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

    @reading
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

    @reading
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

    @reading
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
