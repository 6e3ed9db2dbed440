"""`gpuq status --format id,name,state,gpus,runtime,peak_mem,gpu_hours,energy`: the columns a user picks, as
`sacct --format` (and a default for them in the config's ``[status] format``).

Each column is declared once here: its name on the command line, its header, and how a job's cell reads. A
listing in columns a user picked is built from full records (its costs and peaks are not in a ``Line``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.shown import shown
from gpuq_scheduler.jobs.units import format_duration, format_energy, format_gpu_hours, format_size
from gpuq_scheduler.launcher.views.tables import _table, _when, runtime


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[JobRecord, float], str]  # (job, now) -> its cell


def _runtime(r: JobRecord, now: float) -> str:
    ran = runtime(r, now)  # as `gpuq status` counts it: time spent suspended is not runtime
    return "-" if ran is None else format_duration(ran)


def _mem(r: JobRecord) -> str:
    if r.spec.mem_auto and r.spec.mem_per_gpu is None:
        return "auto"
    return format_size(r.spec.mem_per_gpu) if r.spec.mem_per_gpu else ("whole" if r.spec.gpus else "-")


def _optional(value: object) -> str:
    return "-" if value is None else str(value)


# GPUS is how many GPUs a job asked for and ON the numbers of those it holds, as in every other table.
COLUMNS: dict[str, Column] = {
    "id": Column("ID", lambda r, now: str(r.id)),
    "name": Column("NAME", lambda r, now: shown(r.spec.display_name[:24])),
    "user": Column("USER", lambda r, now: shown(r.user)),
    "state": Column("STATE", lambda r, now: r.state.value),
    "gpus": Column("GPUS", lambda r, now: str(r.spec.gpus)),
    "on": Column("ON", lambda r, now: ",".join(map(str, r.gpus)) or "-"),
    "mem": Column("MEM", lambda r, now: _mem(r)),
    "runtime": Column("RUNTIME", _runtime),
    "time_limit": Column("TIME LIMIT", lambda r, now: format_duration(r.spec.time_limit)),
    "submitted": Column("SUBMITTED", lambda r, now: _when(r.submitted_at)),
    "started": Column("STARTED", lambda r, now: _when(r.started_at)),
    "ended": Column("ENDED", lambda r, now: _when(r.ended_at)),
    "exit": Column("EXIT", lambda r, now: _optional(r.exit_code)),
    "reason": Column("REASON", lambda r, now: shown(r.reason) or "-"),
    "peak_mem": Column("PEAK MEM", lambda r, now: format_size(r.peak_mem)),
    "gpu_hours": Column("GPU-HOURS", lambda r, now: format_gpu_hours(r.gpu_hours(now))),
    "energy": Column("ENERGY", lambda r, now: format_energy(r.energy)),
    "cpu_time": Column("CPU TIME", lambda r, now: "-" if r.cpu_seconds is None else format_duration(r.cpu_seconds)),
    "peak_ram": Column("PEAK RAM", lambda r, now: format_size(r.peak_ram)),
    "priority": Column("PRIORITY", lambda r, now: str(r.spec.priority)),
    "array": Column("ARRAY", lambda r, now: _optional(r.array_id)),
    "index": Column("INDEX", lambda r, now: _optional(r.array_index)),
    "attempt": Column("ATTEMPT", lambda r, now: str(r.attempt)),
}


def parse(text: str, where: str = "--format") -> tuple[str, ...]:
    """Column names from "id,name,state" (any case, spaces allowed); an unknown one is refused with the list."""
    names = tuple(word.strip().lower() for word in text.split(","))
    for name in names:
        if name not in COLUMNS:
            what = "an empty column name" if not name else f"no column {name[:40]!r}"
            raise BadInput(f"{where}: {what}; the columns are {','.join(COLUMNS)}")
    return names


def table(records: Sequence[JobRecord], names: Sequence[str], now: float | None = None) -> str:
    """The jobs, one line each, in the columns ``names``, left-aligned two spaces apart."""
    now = time.time() if now is None else now
    chosen = [COLUMNS[name] for name in names]
    return _table([column.header for column in chosen], [[column.cell(r, now) for column in chosen] for r in records])
