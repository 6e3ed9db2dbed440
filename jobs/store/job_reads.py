"""The job table's reads of jobs, by anyone (``gpuq status`` reads while the daemon writes: WAL): a record, the
queue in its order, the live jobs and their shims, a listing's lines, arrays, owners, fair share's history."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping

from gpuq_scheduler.jobs import listing
from gpuq_scheduler.jobs.listing import Line
from gpuq_scheduler.jobs.model import ArrayInfo, JobRecord, Launch
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store import rows as job_rows
from gpuq_scheduler.jobs.store import schema
from gpuq_scheduler.jobs.store.table_base import TableBase, reading

# What finds a running job's shim again (``Launch``): its columns are its fields' names.
_LAUNCH = tuple(field.name for field in dataclasses.fields(Launch))
# An array's columns, read by its fields' names: all but its environment (read only where a job needs it) and
# whether it was notified (a 0 or 1 read as a boolean).
_ARRAY = tuple(field.name for field in dataclasses.fields(ArrayInfo) if field.name not in ("env", "notified"))


class JobReads(TableBase):
    """Jobs as records (or lines) read back; a read of a damaged table says so in one line (``reading``)."""

    _listed: bool  # the spec's listed columns are filled (``JobTable``: a table of version 2 or later)
    _suspension: str  # a line's attempt and time suspended, as this table has them

    @reading
    def get(self, job_id: int, *, with_env: bool = False) -> JobRecord | None:
        row = self._named(
            f"SELECT {self._columns}, {schema.ENV} AS job_env FROM {schema.JOINED} WHERE jobs.id=?", (job_id,)
        ).fetchone()
        if row is None:
            return None
        record = job_rows.records_from([row], with_env=with_env)[0]
        return self._whole(record) if with_env else record

    @reading
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

    @reading
    def lines(self) -> list[Line]:
        """Every job as a listing's line (``jobs.listing``), in id order: no record is built."""
        columns = listing.COLUMNS if self._listed else listing.FROM_SPEC
        query = f"SELECT {columns}{self._suspension} FROM jobs ORDER BY id"
        return [listing.line_from(row) for row in self._db.execute(query)]

    @reading
    def pending(self) -> list[JobRecord]:
        """Pending jobs in queue order: priority first, then submission order."""
        rows = self._named(
            f"SELECT {self._columns}, {schema.ENV} AS job_env FROM {schema.JOINED}"
            f" WHERE {schema.states(JobState.PENDING)} ORDER BY priority DESC, jobs.id"
        ).fetchall()
        envs: dict[str, Mapping[str, str]] = {}  # 10,000 members of one array share one parsed environment
        return [self._whole(record) for record in job_rows.records_from(rows, with_env=True, envs=envs)]

    @reading
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
            row["id"]: ArrayInfo(**{name: row[name] for name in _ARRAY}, notified=bool(row["notified"])) for row in rows
        }
        if self.private is not None:
            for array_id, info in found.items():
                notify = self._private_field(array_id, info.uid, "notify")
                found[array_id] = dataclasses.replace(info, notify=notify if isinstance(notify, str) else None)
        return found

    @reading
    def members(self, array_id: int) -> list[JobRecord]:
        query = f"SELECT {self._columns} FROM jobs WHERE array_id=? ORDER BY id"
        rows = self._named(query, (array_id,)).fetchall()
        return job_rows.records_from(rows)

    @reading
    def running(self, state: JobState = JobState.RUNNING) -> list[tuple[JobRecord, Launch]]:
        """Running jobs (or, ``state``, suspended ones: alive too) and how to find each one's shim again."""
        rows = self._named(
            f"SELECT {self._columns}, {', '.join(_LAUNCH)} FROM jobs WHERE state=? ORDER BY id", (state.value,)
        ).fetchall()
        return [
            (self._whole(record), Launch(**{name: row[name] for name in _LAUNCH}))
            for record, row in zip(job_rows.records_from(rows), rows, strict=True)
        ]

    @reading
    def owners(self, job_ids: Iterable[int]) -> dict[int, tuple[int, str, JobState]]:
        ids, found, query = list(job_ids), {}, "SELECT id, uid, user, state FROM jobs WHERE id IN "
        for at in range(0, len(ids), 10_000):  # below any SQLite's limit on variables, however many requests came
            chunk = ids[at : at + 10_000]
            rows = self._db.execute(f"{query}({','.join('?' * len(chunk))})", chunk)
            found.update({row[0]: (row[1], row[2], JobState(row[3])) for row in rows})
        return found

    @reading
    def count_pending(self, uid: int) -> int:
        query = f"SELECT COUNT(*) FROM jobs WHERE {schema.states(JobState.PENDING)} AND uid=?"
        return int(self._db.execute(query, (uid,)).fetchone()[0])

    @reading
    def runs_since(self, since: float) -> list[tuple[str, int, float, float]]:
        """(user, GPUs, started, ended) of the GPU runs that ended after ``since``: history for fair share."""
        rows = self._db.execute(
            "SELECT user, gpus, started_at, ended_at FROM jobs WHERE ended_at > ? AND started_at IS NOT NULL"
            " AND gpus != '[]'",
            (since,),
        )
        return [(row[0], len(json.loads(row[1])), row[2], row[3]) for row in rows]

    @reading
    def not_before(self) -> dict[int, float]:
        query = f"SELECT id, not_before FROM jobs WHERE {schema.states(JobState.PENDING)} AND not_before IS NOT NULL"
        rows = self._db.execute(query)
        return {row[0]: row[1] for row in rows}

    def max_id(self) -> int:
        return int(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0])
