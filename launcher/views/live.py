"""What a live view shows, as plain data: one ``Picture`` of the box (GPUs, running and waiting jobs) taken
from the state directory and the GPUs, and the rows ``gpuq top`` draws from it. No terminal code here:
``views.top`` draws it, and tests read it directly.

Per GPU the memory is split four ways, each drawn with its own character so the bar reads without colour:
``█`` held by gpuq's jobs (NVML, per process; with the MPS servers of their fence), ``▒`` reserved for them
but not (yet) used, ``░`` used by processes outside gpuq, and blank: free.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.units import format_duration, format_size
from gpuq_scheduler.launcher.gpus import holders, mps
from gpuq_scheduler.launcher.gpus.holders import Holder
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot, GpuSource
from gpuq_scheduler.launcher.policy.placement import Policy
from gpuq_scheduler.launcher.supervisor import containment, limits, processes
from gpuq_scheduler.launcher.views import reservation_lines as reserved
from gpuq_scheduler.launcher.views.gpu_rows import GpuRow, gpu_rows
from gpuq_scheduler.launcher.views.tables import runtime

JOBS, RESERVED, OUTSIDE, FREE = "█", "▒", "░", " "


@dataclass(frozen=True)
class GpuLine:
    row: GpuRow
    jobs_use: int  # what gpuq's jobs hold on it now (NVML, per process)
    utilization: int | None
    drained: bool

    def holders(self) -> dict[str, int]:
        """The GPU's memory split four ways, adding up to at most its total: what gpuq's jobs use, what is
        reserved for them and unused, what processes outside gpuq use, and what is free (none on a lost GPU).
        The bar of `gpuq top`, the page and the metrics of `gpuq serve` all draw this."""
        row = self.row
        jobs = min(self.jobs_use, row.total)
        reserved = min(max(0, row.reserved - jobs), row.total - jobs)
        outside = min(row.external, row.total - jobs - reserved)
        return {"jobs": jobs, "reserved": reserved, "outside": outside, "free": 0 if row.state != "ok" else row.free}


@dataclass(frozen=True)
class Picture:
    taken: float
    gpus: list[GpuLine]
    running: list[JobRecord]
    waiting: list[JobRecord]
    job_use: dict[int, int]  # job id -> memory its processes hold now, on its busiest GPU
    paused: bool
    job_util: dict[int, int] = field(default_factory=dict)  # job id -> its processes' share of a GPU's time, %
    reserved: list[str] = field(default_factory=list)  # the reservations on or to come, in words
    outside: list[Holder] = field(default_factory=list)  # processes holding GPU memory that gpuq did not start


def take(queue: Queue, source: GpuSource, now: float | None = None) -> Picture:
    """Read the queue and the GPUs once (readers only: the daemon need not run)."""
    now = time.time() if now is None else now
    active = [r for r in queue.records(active_only=True) if r.cluster is None]  # a cluster's jobs: not on this box
    running = [r for r in active if r.state is JobState.RUNNING]
    waiting = [r for r in active if r.state is JobState.PENDING]
    table = queue.table()
    try:
        launches = table.running()
        settings = table.settings()
    finally:
        table.close()
    pids = {record.id: processes.job_pids(record, launch.shim_pid) for record, launch in launches}
    ours = {pid for found in pids.values() for pid in found}
    snapshot = source.snapshot(process_utilization=True)
    on_gpus = {pid for gpu in snapshot for pid in (gpu.processes or {})}
    recorded = containment.read_record(str(queue.state.inventory))
    group = recorded.group if recorded is not None else ""
    for pid in on_gpus - ours:
        owner = containment.job_of(pid, group)  # it left its job's process tree, never its cgroup
        if owner is not None and owner in pids:
            pids[owner].add(pid)
            ours.add(pid)
    ours |= mps.server_pids(queue.state.mps, on_gpus - ours)  # gpuq's fence: counted with its jobs
    rows = gpu_rows(snapshot, running, ours, fences=fences(queue.state))
    drained = set(settings.get("drained", []))
    lines = [
        GpuLine(row, _held(gpu, ours), gpu.utilization, gpu.index in drained)
        for row, gpu in zip(rows, snapshot, strict=True)
    ]
    job_use = {
        job_id: max((sum(u for p, u in (g.processes or {}).items() if p in found) for g in snapshot), default=0)
        for job_id, found in pids.items()
    }
    job_util: dict[int, int] = {}
    for job_id, found in pids.items():
        shares = [u for g in snapshot for p, u in (g.process_utilization or {}).items() if p in found]
        if shares:  # none under MPS: NVML files an MPS client's work under the server's pid
            job_util[job_id] = max(shares)
    booked = [reserved.words(r, now) for r in reserved.current(queue.state, now)]
    return Picture(
        now,
        lines,
        running,
        waiting,
        job_use,
        bool(settings.get("paused_by")),
        job_util,
        booked,
        holders.outside(snapshot, ours),
    )


def with_host_usage(state: StateDir, record: JobRecord) -> JobRecord:
    """A running job with what its cgroup has accounted so far (CPU time, peak host memory); an ended
    job's were recorded when it ended."""
    recorded = containment.read_record(str(state.inventory))
    if record.state is not JobState.RUNNING or recorded is None or not recorded.group:
        return record
    used = limits.usage(f"{recorded.group}/job-{record.id}")
    cpu, peak = used.get("cpu_seconds"), used.get("peak_ram")
    return record.replace(
        cpu_seconds=cpu if isinstance(cpu, float) else None, peak_ram=peak if isinstance(peak, int) else None
    )


def fences(state: StateDir) -> dict[int, str]:
    """Each GPU's fence, as the daemon last recorded it (gpus.json); none known before a daemon ran here."""
    try:
        gpus = json.loads(state.inventory.read_bytes())["gpus"]
        return {int(gpu["index"]): str(gpu.get("fence", "-")) for gpu in gpus}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _held(gpu: GpuSnapshot, ours: set[int]) -> int:
    return sum(used for pid, used in (gpu.processes or {}).items() if pid in ours)


def bar(line: GpuLine, width: int) -> str:
    """The GPU's memory as ``width`` characters: jobs' use, reserved but unused, outside use, free."""
    total, part = max(line.row.total, 1), line.holders()
    jobs, reserved, outside = part["jobs"], part["reserved"], part["outside"]
    cells = [round(width * part / total) for part in (jobs, jobs + reserved, jobs + reserved + outside)]
    drawn = JOBS * cells[0] + RESERVED * (cells[1] - cells[0]) + OUTSIDE * (cells[2] - cells[1])
    return drawn + FREE * (width - cells[2])


def gpu_label(line: GpuLine) -> str:
    row = line.row
    lost = row.state != "ok"
    state = "LOST" if lost else ("drained" if line.drained else "ok")
    util = "   -" if line.utilization is None or lost else f"{line.utilization:3d}%"
    free = "-" if lost else format_size(row.free)
    return f"GPU {row.index} {row.name[:22]:<22} util {util}  free {free:>6}  fence {row.fence:<11} {state}"


def gpu_detail(line: GpuLine) -> str:
    """What the bar shows, in figures (short enough to sit beside a 30-character bar in 80 columns)."""
    row = line.row
    return (
        f"jobs {format_size(line.jobs_use)} res {format_size(row.reserved)} out {format_size(row.external)}"
        f" /{format_size(row.total)}"
    )


# GPUS is how many GPUs a job asked for, ON the numbers of those it holds, as in `gpuq status`: one header,
# one meaning, in every table (issue #39: GPUS read "0,1" in one table and "2" in the next).
RUNNING_COLUMNS = ("ID", "USER", "NAME", "GPUS", "ON", "RESERVED", "USES", "UTIL", "RUNTIME", "LEFT")
WAITING_COLUMNS = ("ID", "USER", "NAME", "GPUS", "MEM", "WAITING", "WHY")
SORTS = ("id", "user", "runtime", "gpus")


def running_rows(picture: Picture, sort: str = "id", folded: Mapping[int, int] | None = None) -> list[tuple[str, ...]]:
    """``folded``: array id -> how many members a folded array's line stands for."""
    records = sorted(picture.running, key=_sort_key(sort, picture.taken))
    overhead = Policy().overhead
    return [
        (
            str(r.id),
            r.user,
            _name(r, folded),
            str(r.spec.gpus),
            ",".join(map(str, r.gpus)) or "-",
            "whole" if r.spec.mem_per_gpu is None else format_size(r.spec.mem_per_gpu + overhead),
            format_size(picture.job_use.get(r.id, 0)) if r.gpus else "-",
            f"{picture.job_util[r.id]}%" if r.id in picture.job_util else "-",
            format_duration(runtime(r, picture.taken) or 0.0),
            _left(r, picture.taken),
        )
        for r in records
    ]


def waiting_rows(picture: Picture, sort: str = "id", folded: Mapping[int, int] | None = None) -> list[tuple[str, ...]]:
    records = sorted(picture.waiting, key=_sort_key(sort, picture.taken))
    return [
        (
            str(r.id),
            r.user,
            _name(r, folded),
            str(r.spec.gpus),
            "auto"
            if r.spec.mem_auto and r.spec.mem_per_gpu is None
            else ("whole" if r.spec.mem_per_gpu is None else format_size(r.spec.mem_per_gpu)),
            format_duration(picture.taken - r.submitted_at),
            ("held: " if r.held else "") + (r.reason or "-"),
        )
        for r in records
    ]


def only(picture: Picture, user: str) -> Picture:
    """The same picture with only ``user``'s jobs (the GPUs stay whole: they are shared)."""
    return dataclasses.replace(
        picture,
        running=[r for r in picture.running if r.user == user],
        waiting=[r for r in picture.waiting if r.user == user],
    )


def _left(record: JobRecord, now: float) -> str:
    if record.spec.time_limit is None or record.started_at is None:
        return "-"
    # The limit does not run while the job is suspended: it is owed the time it spent so.
    return format_duration(max(0.0, record.started_at + record.suspended_for + record.spec.time_limit - now))


def _sort_key(sort: str, now: float) -> Callable[[JobRecord], tuple[Any, ...]]:
    if sort == "user":
        return lambda r: (r.user, r.id)
    if sort == "runtime":
        return lambda r: (-(now - (r.started_at or r.submitted_at)), r.id)
    if sort == "gpus":
        return lambda r: (-r.spec.gpus, r.id)
    return lambda r: (r.id,)


def summary(picture: Picture, sort: str, mine: bool) -> str:
    pieces = [f"{len(picture.running)} running", f"{len(picture.waiting)} waiting"]
    if picture.paused:
        pieces.append("queue PAUSED")
    pieces += [f"sort: {sort}", "mine only" if mine else "everyone"]
    booked = "".join(f"\nreservation {words}" for words in picture.reserved)
    return "  ".join(pieces) + f"   {JOBS} jobs {RESERVED} reserved {OUTSIDE} outside" + booked


def fold(records: Sequence[JobRecord]) -> tuple[list[JobRecord], dict[int, int]]:
    """One line per array (its first member stands for it), and how many members each such line stands for."""
    counts = Counter(r.array_id for r in records if r.array_id is not None)
    seen: set[int] = set()
    kept = []
    for record in records:
        if record.array_id is not None:
            if record.array_id in seen:
                continue
            seen.add(record.array_id)
        kept.append(record)
    return kept, {array: n for array, n in counts.items() if n > 1}


def _name(record: JobRecord, folded: Mapping[int, int] | None) -> str:
    more = (folded or {}).get(record.array_id) if record.array_id is not None else None
    return record.spec.display_name + (f" [+{more - 1} of array {record.array_id}]" if more else "")
