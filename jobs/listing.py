"""What a listing shows of a job: one ``Line`` per job, the few fields `gpuq status` prints.

`gpuq status --all` over 100,000 finished jobs must not build 100,000 full records, each spec parsed from JSON
and checked again, for a table that shows eight short columns. A Line is filled straight from SQL (the spec's
fields picked out by ``json_extract``), and a full record becomes one with ``Line.of`` (spooled jobs, cluster
jobs, the few rows of the default listing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState


class Line(NamedTuple):
    id: int
    name: str  # the spec's display name: its --name, or its command's base name
    user: str
    state: JobState
    gpus: tuple[int, ...]
    want_gpus: int  # how many it asked for
    mem_per_gpu: int | None
    mem_auto: bool
    mem_from: str
    started_at: float | None
    ended_at: float | None
    reason: str
    exit_code: int | None
    array_id: int | None
    held: bool
    cluster: str | None = None
    external_id: str | None = None
    attempt: int = 1  # a job retried after a failure runs as attempt 2, 3...
    suspended_for: float = 0.0  # seconds spent suspended, not counting a suspension in progress
    suspended_at: float | None = None  # when its suspension in progress began

    def runtime(self, now: float) -> float | None:
        """Seconds it ran: from its start to its end (or now), less the time it spent suspended."""
        if self.started_at is None:
            return None
        away = self.suspended_for + (now - self.suspended_at if self.suspended_at is not None else 0.0)
        return max(0.0, (self.ended_at or now) - self.started_at - away)

    @classmethod
    def of(cls, r: JobRecord) -> Line:
        spec = r.spec
        return cls(
            r.id,
            spec.display_name,
            r.user,
            r.state,
            r.gpus,
            spec.gpus,
            spec.mem_per_gpu,
            spec.mem_auto,
            spec.mem_from,
            r.started_at,
            r.ended_at,
            r.reason,
            r.exit_code,
            r.array_id,
            r.held,
            r.cluster,
            r.external_id,
            r.attempt,
            r.suspended_for,
            r.suspended_at if r.state is JobState.SUSPENDED else None,
        )


# The columns of ``jobs`` a Line is read from, in ``line_from``'s order: the spec's fields from their copies
# (``jobs.store.schema.LISTED``), or, in a table no daemon of table version 2 has opened yet, from the spec.
# The program only for a job without a name, and --mem auto's source only for an auto job: a value not
# read (NULL) costs the sqlite3 module less than one made into a Python object.
COLUMNS = (
    "id, name, CASE WHEN name = '' THEN program END, user, state, gpus, want_gpus, mem_per_gpu, "
    "CASE WHEN mem_auto THEN COALESCE(mem_from, '') END, started_at, ended_at, reason, exit_code, array_id, held"
)
FROM_SPEC = (
    "id, json_extract(spec, '$.name'), json_extract(spec, '$.command[0]'), user, state, gpus, "
    "json_extract(spec, '$.gpus'), json_extract(spec, '$.mem_per_gpu'), "
    "CASE WHEN json_extract(spec, '$.mem_auto') THEN COALESCE(json_extract(spec, '$.mem_from'), '') END, "
    "started_at, ended_at, reason, exit_code, array_id, held"
)

_STATES = {state.value: state for state in JobState}
_GPUS: dict[str, tuple[int, ...]] = {"[]": ()}  # a history holds few distinct GPU sets: parse each once


def line_from(row: Sequence[Any]) -> Line:
    gpus = _GPUS.get(row[5])
    if gpus is None:
        gpus = _GPUS[row[5]] = tuple(int(g) for g in row[5][1:-1].split(","))
    name = row[1] or row[2].rstrip("/").rsplit("/", 1)[-1] or row[2]  # as JobSpec.display_name
    auto_from = row[8]  # None: not --mem auto
    return Line(
        row[0],
        name,
        row[3],
        _STATES[row[4]],
        gpus,
        1 if row[6] is None else row[6],
        row[7],
        auto_from is not None,
        auto_from or "",
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
        bool(row[14]),
        None,
        None,
        row[15],
        row[16],
        row[17] if row[4] == "suspended" else None,
    )
