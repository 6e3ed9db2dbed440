"""The morning report: how jobs ended, who used the GPU-hours, and how long GPUs sat idle while work waited.

Pure functions over job records (no NVML, no disk, ``now`` is a parameter): ``build_report`` turns records
into a ``Report``; ``report_text.render_text`` prints it for a terminal (its tables are there too), and
``report_html.render_html`` writes it as one page that stands alone.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState, signal_name
from gpuq_scheduler.launcher.views.suspend_costs import Moves, of_job
from gpuq_scheduler.launcher.views.suspend_costs import by_user as by_user_moves
from gpuq_scheduler.launcher.views.tables import member_arguments, runtime

HOUR = 3600.0
Span = tuple[float, float]
K = TypeVar("K", str, int)


@dataclass(frozen=True)
class JobRow:
    """One job's line in the outcomes table."""

    id: int
    name: str
    user: str
    array: str  # "lr-sweep 3[5]": member 5 of array 3 (named lr-sweep); "" outside arrays
    args: str  # what sets an array member apart: its values in a sweep, else its command's arguments
    state: JobState
    exit: str  # the exit code, else the signal that ended it, else ""
    reason: str
    runtime: float | None  # seconds, the whole run (not clipped to the window)
    peak_mem: int | None  # bytes
    gpus: tuple[int, ...]
    gpus_requested: int
    cpu_seconds: float | None = None  # host CPU time of all its processes, where its cgroup accounted it
    peak_ram: int | None = None  # bytes of host memory at most, where its cgroup's memory controller measured it


@dataclass(frozen=True)
class Segment:
    """One job holding one GPU for a stretch of the window: one bar of the timeline."""

    gpu: int
    job_id: int
    name: str
    user: str
    start: float
    end: float
    state: JobState


@dataclass(frozen=True)
class Report:
    """Everything the report shows, computed once; the renderers only format it."""

    start: float  # the window, epoch seconds
    end: float
    timeline_start: float  # the first moment in the window when any job was queued: the picture starts there
    gpu_count: int
    counts: dict[JobState, int]
    rows: list[JobRow]
    gpu_hours_by_user: dict[str, float]  # largest first
    gpu_hours_by_array: dict[int, float]
    idle_gpu_hours: float  # GPUs nobody held while some GPU job waited
    segments: list[Segment]
    # Packing's payoff: GPU-hours that whole-GPU placement of the same --mem jobs would have held and
    # packing did not (each job held its share of a GPU, not the GPU), and jobs stopped at their fence.
    saved_by_user: dict[str, float] = field(default_factory=dict)
    saved_by_array: dict[int, float] = field(default_factory=dict)
    fenced_by_user: dict[str, int] = field(default_factory=dict)
    fenced_by_array: dict[int, int] = field(default_factory=dict)
    array_names: dict[int, str] = field(default_factory=dict)
    energy_by_user: dict[str, float] = field(default_factory=dict)  # joules of GPU energy (NVML), whole jobs
    # Host use of whole jobs, where their cgroups accounted it: CPU seconds summed, and the largest peak
    # memory of any one job (a sum of peaks that never coincided would describe no moment).
    cpu_by_user: dict[str, float] = field(default_factory=dict)
    peak_ram_by_user: dict[str, int] = field(default_factory=dict)
    # What suspending and preemption cost each user's jobs in the window (``views.suspend_costs``).
    moves_by_user: dict[str, Moves] = field(default_factory=dict)
    moves_by_job: dict[int, Moves] = field(default_factory=dict)  # the jobs it cost anything, by id

    @property
    def gpu_hours(self) -> float:
        return sum(self.gpu_hours_by_user.values())

    @property
    def capacity_gpu_hours(self) -> float:
        return self.gpu_count * (self.end - self.start) / HOUR


def build_report(
    records: Iterable[JobRecord],
    gpu_count: int,
    now: float,
    since: float | None = None,
    totals: Sequence[int] = (),
    overhead: int = 0,
    array_names: Mapping[int, str] | None = None,
    moves: Mapping[int, Moves] | None = None,
) -> Report:
    """Summarise the jobs that were queued, ran or ended in the window ``[now - since, now]``.

    ``since=None`` reaches back to the first submit. ``gpu_count`` comes from the inventory; GPUs a job was
    recorded on beyond it (lost since, or no inventory yet) still get a lane. A job's GPU-hours are the GPUs
    it held times its running time inside the window, so a CPU job counts 0 and two ``--mem`` jobs sharing a
    GPU count it twice (each held it). Jobs sent to a cluster count in the outcomes and GPU-hours (the whole
    GPUs Slurm gave them) but ran on other machines' GPUs: they get no lane here and no part in idle time.

    ``totals`` (each GPU's memory, by index) and ``overhead`` (what placement adds to a share) give packing's
    payoff: a --mem job held ``(share + overhead) / total`` of each of its GPUs where a whole-GPU job holds all.
    ``array_names`` (array id -> name) names the arrays. The outcomes list what did not succeed first.
    ``moves`` (``views.suspend_costs.read``: each job's preemptions, suspends and bytes moved) gives what
    suspending cost each user's jobs in the window.
    """
    records = list(records)
    names = dict(array_names or {})
    start = now - since if since is not None else min((r.submitted_at for r in records), default=now)
    chosen = sorted((r for r in records if _in_window(r, start, now)), key=lambda r: r.id)
    here = [r for r in chosen if r.cluster is None]
    gpu_count = max(gpu_count, *(g + 1 for r in here for g in r.gpus), 0)
    by_user: dict[str, float] = defaultdict(float)
    by_array: dict[int, float] = defaultdict(float)
    saved_user: dict[str, float] = defaultdict(float)
    saved_array: dict[int, float] = defaultdict(float)
    fenced_user: Counter[str] = Counter()
    fenced_array: Counter[int] = Counter()
    energy_user: dict[str, float] = defaultdict(float)
    cpu_user: dict[str, float] = defaultdict(float)
    ram_user: dict[str, int] = {}
    segments = []
    for record in chosen:
        held = _clip(_running(record, now), start, now)
        count = record.spec.gpus if record.cluster else len(record.gpus)
        hours = count * (held[1] - held[0]) / HOUR if held else 0.0
        by_user[record.user] += hours
        energy_user[record.user] += record.energy or 0.0
        if record.cpu_seconds is not None:
            cpu_user[record.user] += record.cpu_seconds
        if record.peak_ram is not None:
            ram_user[record.user] = max(ram_user.get(record.user, 0), record.peak_ram)
        if record.array_id is not None:
            by_array[record.array_id] += hours
        share = record.spec.mem_per_gpu
        if share is not None and held and record.cluster is None:
            saved = sum(max(0.0, 1 - (share + overhead) / totals[g]) for g in record.gpus if g < len(totals))
            saved_user[record.user] += saved * (held[1] - held[0]) / HOUR
            if record.array_id is not None:
                saved_array[record.array_id] += saved * (held[1] - held[0]) / HOUR
        if record.cause is Cause.OOM_PAST_SHARE:
            fenced_user[record.user] += 1
            if record.array_id is not None:
                fenced_array[record.array_id] += 1
        if held and held[1] > held[0] and record.cluster is None:
            name = record.spec.display_name
            segments += [Segment(g, record.id, name, record.user, *held, record.state) for g in record.gpus]
    return Report(
        start=start,
        end=now,
        timeline_start=max(start, min((r.submitted_at for r in chosen), default=start)),
        gpu_count=gpu_count,
        counts=dict(Counter(r.state for r in chosen)),
        rows=[_row(r, now, names) for r in sorted(chosen, key=lambda r: (r.state not in _FAILED, r.id))],
        gpu_hours_by_user=_largest_first(by_user),
        gpu_hours_by_array=_largest_first(by_array),
        idle_gpu_hours=_idle_while_waiting(here, gpu_count, start, now) / HOUR,
        segments=segments,
        saved_by_user=_largest_first(saved_user),
        saved_by_array=_largest_first(saved_array),
        fenced_by_user=dict(fenced_user),
        fenced_by_array=dict(fenced_array),
        array_names={a: names[a] for a in {r.array_id for r in chosen} if a is not None and a in names},
        energy_by_user={user: joules for user, joules in energy_user.items() if joules > 0},
        cpu_by_user=dict(cpu_user),
        peak_ram_by_user=ram_user,
        moves_by_user=by_user_moves(chosen, moves or {}, now),
        moves_by_job={r.id: m for r in chosen if (m := of_job(r, moves or {}, now))},
    )


def _in_window(record: JobRecord, start: float, end: float) -> bool:
    # Its life in the queue (submit to end, or to now) touches the window; active jobs always count.
    if not record.state.finished:
        return True
    return record.submitted_at <= end and (record.ended_at or end) >= start


def _running(record: JobRecord, now: float) -> Span | None:
    if record.started_at is None or record.state is JobState.PENDING:
        return None
    return record.started_at, record.ended_at or now


def _waiting(record: JobRecord, now: float) -> Span | None:
    # Only GPU work that could run: a CPU job or a held job waiting is not the GPUs' loss.
    if record.spec.gpus == 0 or (record.held and record.state is JobState.PENDING):
        return None
    if record.state is JobState.PENDING:
        return record.submitted_at, now
    return record.submitted_at, record.started_at or record.ended_at or now


def _clip(span: Span | None, start: float, end: float) -> Span | None:
    if span is None or span[1] < start or span[0] > end:
        return None
    return max(span[0], start), min(span[1], end)


def _idle_while_waiting(records: Sequence[JobRecord], gpu_count: int, start: float, end: float) -> float:
    """GPU-seconds in ``[start, end]`` when some GPU job waited and a GPU was held by no running job.

    A sweep over the moments anything starts or stops (not sampling), so short gaps are counted exactly.
    """
    events: list[tuple[float, int, tuple[int, ...] | None]] = []  # (when, +1/-1, GPUs held or None: a waiter)
    for record in records:
        for span, gpus in ((_waiting(record, end), None), (_running(record, end), record.gpus)):
            clipped = _clip(span, start, end)
            if clipped and clipped[1] > clipped[0]:
                events += [(clipped[0], 1, gpus), (clipped[1], -1, gpus)]
    events.sort(key=lambda event: event[0])  # events at one moment add nothing between them: any order will do
    holders: Counter[int] = Counter()  # --mem jobs share GPUs: a GPU is busy while any job holds it
    waiting = busy = 0
    idle = 0.0
    last = start
    for when, delta, gpus in events:
        if waiting > 0:
            idle += (when - last) * max(0, gpu_count - busy)
        last = when
        if gpus is None:
            waiting += delta
            continue
        for gpu in gpus:
            before = holders[gpu] > 0
            holders[gpu] += delta
            busy += (holders[gpu] > 0) - before
    return idle


_FAILED = (JobState.FAILED, JobState.TIMEOUT, JobState.LOST)


def _row(record: JobRecord, now: float, names: Mapping[int, str]) -> JobRow:
    ending = signal_name(record.signal) if record.signal is not None else ""
    array, args = "", ""
    if record.array_id is not None:
        array = f"{names.get(record.array_id, '')[:16]} {record.array_id}[{record.array_index}]".lstrip()
        args = member_arguments(record.spec)
    return JobRow(
        record.id,
        record.spec.display_name,
        record.user,
        array,
        args,
        record.state,
        ending if record.exit_code is None else str(record.exit_code),
        record.reason,
        runtime(record, now),
        record.peak_mem,
        record.gpus,
        record.spec.gpus,
        record.cpu_seconds,
        record.peak_ram,
    )


def _largest_first(hours: Mapping[K, float]) -> dict[K, float]:
    return dict(sorted(hours.items(), key=lambda item: (-item[1], str(item[0]))))
