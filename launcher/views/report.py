"""The morning report: how jobs ended, who used the GPU-hours, and how long GPUs sat idle while work waited.

Pure functions over job records (no NVML, no disk, ``now`` is a parameter): ``build_report`` turns records
into a ``Report``; ``render_text`` prints it for a terminal and ``render_html`` writes one page that stands
alone (inline CSS and SVG, no scripts, nothing fetched, and a Content-Security-Policy that would block it).
"""

from __future__ import annotations

import html
import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gpuq_scheduler.jobs.model import JobRecord, JobState, signal_name
from gpuq_scheduler.jobs.units import format_duration, format_size
from gpuq_scheduler.launcher.views.tables import _table, runtime

HOUR = 3600.0
Span = tuple[float, float]
K = TypeVar("K", str, int)


@dataclass(frozen=True)
class JobRow:
    """One job's line in the outcomes table."""

    id: int
    name: str
    user: str
    array: str  # "3[5]": member 5 of array 3; "" outside arrays
    state: JobState
    exit: str  # the exit code, else the signal that ended it, else ""
    reason: str
    runtime: float | None  # seconds, the whole run (not clipped to the window)
    peak_mem: int | None  # bytes
    gpus: tuple[int, ...]
    gpus_requested: int


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

    @property
    def gpu_hours(self) -> float:
        return sum(self.gpu_hours_by_user.values())

    @property
    def capacity_gpu_hours(self) -> float:
        return self.gpu_count * (self.end - self.start) / HOUR


def build_report(records: Iterable[JobRecord], gpu_count: int, now: float, since: float | None = None) -> Report:
    """Summarise the jobs that were queued, ran or ended in the window ``[now - since, now]``.

    ``since=None`` reaches back to the first submit. ``gpu_count`` comes from the inventory; GPUs a job was
    recorded on beyond it (lost since, or no inventory yet) still get a lane. A job's GPU-hours are the GPUs
    it held times its running time inside the window, so a CPU job counts 0 and two ``--mem`` jobs sharing a
    GPU count it twice (each held it). Jobs sent to a cluster count in the outcomes and GPU-hours (the whole
    GPUs Slurm gave them) but ran on other machines' GPUs: they get no lane here and no part in idle time.
    """
    records = list(records)
    start = now - since if since is not None else min((r.submitted_at for r in records), default=now)
    chosen = sorted((r for r in records if _in_window(r, start, now)), key=lambda r: r.id)
    here = [r for r in chosen if r.cluster is None]
    gpu_count = max(gpu_count, *(g + 1 for r in here for g in r.gpus), 0)
    by_user: dict[str, float] = defaultdict(float)
    by_array: dict[int, float] = defaultdict(float)
    segments = []
    for record in chosen:
        held = _clip(_running(record, now), start, now)
        count = record.spec.gpus if record.cluster else len(record.gpus)
        hours = count * (held[1] - held[0]) / HOUR if held else 0.0
        by_user[record.user] += hours
        if record.array_id is not None:
            by_array[record.array_id] += hours
        if held and held[1] > held[0] and record.cluster is None:
            name = record.spec.display_name
            segments += [Segment(g, record.id, name, record.user, *held, record.state) for g in record.gpus]
    return Report(
        start=start,
        end=now,
        timeline_start=max(start, min((r.submitted_at for r in chosen), default=start)),
        gpu_count=gpu_count,
        counts=dict(Counter(r.state for r in chosen)),
        rows=[_row(r, now) for r in chosen],
        gpu_hours_by_user=_largest_first(by_user),
        gpu_hours_by_array=_largest_first(by_array),
        idle_gpu_hours=_idle_while_waiting(here, gpu_count, start, now) / HOUR,
        segments=segments,
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


def _row(record: JobRecord, now: float) -> JobRow:
    ending = signal_name(record.signal) if record.signal is not None else ""
    array = "" if record.array_id is None else f"{record.array_id}[{record.array_index}]"
    return JobRow(record.id, record.spec.display_name, record.user, array, record.state,
                  ending if record.exit_code is None else str(record.exit_code), record.reason,
                  runtime(record, now), record.peak_mem, record.gpus, record.spec.gpus)  # fmt: skip


def _largest_first(hours: Mapping[K, float]) -> dict[K, float]:
    return dict(sorted(hours.items(), key=lambda item: (-item[1], str(item[0]))))


# -- text ------------------------------------------------------------------------------------------------


def render_text(report: Report) -> str:
    """What ``gpuq report`` prints: a headline, the outcomes table, GPU-hours by user and by array."""
    lines = [_headline(report), _usage(report)]
    if report.rows:
        lines += ["", _table(_COLUMNS, [_cells(row) for row in report.rows])]
    else:
        lines.append("no jobs in this window")
    if report.gpu_hours_by_user:
        by_user = [(user, _hours(h)) for user, h in report.gpu_hours_by_user.items()]
        lines += ["", _table(("USER", "GPU-HOURS"), by_user)]
    if report.gpu_hours_by_array:
        by_array = [(str(array), _hours(h)) for array, h in report.gpu_hours_by_array.items()]
        lines += ["", _table(("ARRAY", "GPU-HOURS"), by_array)]
    return "\n".join(lines)


def _headline(report: Report) -> str:
    counts = ", ".join(f"{n} {state.value}" for state, n in _ordered_counts(report))
    window = f"{_when(report.start)} to {_when(report.end)} ({format_duration(report.end - report.start)})"
    return f"gpuq report {window}: {sum(report.counts.values())} jobs" + (f", {counts}" if counts else "")


def _usage(report: Report) -> str:
    share = f" ({report.gpu_hours / report.capacity_gpu_hours:.0%})" if report.capacity_gpu_hours else ""
    return (
        f"{report.gpu_count} GPUs; GPU-hours held {_hours(report.gpu_hours)} of {_hours(report.capacity_gpu_hours)}"
        f"{share}; idle while work waited {_hours(report.idle_gpu_hours)} GPU-hours"
    )


def _ordered_counts(report: Report) -> list[tuple[JobState, int]]:
    # Succeeded and failed always show (the brief's headline); other states only when they happened.
    return [(s, report.counts.get(s, 0)) for s in _ORDER if report.counts.get(s) or s in _ORDER[:2]]


# The headline's order: how things ended first, then what is still going on.
_ORDER = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.LOST,
          JobState.RUNNING, JobState.PENDING)  # fmt: skip


_COLUMNS = ("ID", "NAME", "USER", "ARRAY", "STATE", "EXIT", "RUNTIME", "PEAK MEM", "GPUS", "REASON")


def _cells(row: JobRow, name_width: int | None = 24) -> tuple[str, ...]:
    gpus = ",".join(map(str, row.gpus)) or ("-" if row.gpus_requested == 0 else f"({row.gpus_requested})")
    return (str(row.id), row.name[:name_width], row.user, row.array or "-", row.state.value, row.exit or "-",
            format_duration(row.runtime), format_size(row.peak_mem), gpus, row.reason)  # fmt: skip


def _hours(hours: float) -> str:
    if 0 < hours < 0.005:
        return "<0.01"  # a few GPU-seconds: "0.00" would read as "nothing ran"
    return f"{hours:.1f}" if hours >= 10 else f"{hours:.2f}"


def _when(stamp: float, fmt: str = "%Y-%m-%d %H:%M") -> str:
    return time.strftime(fmt, time.localtime(stamp))


# -- HTML ------------------------------------------------------------------------------------------------

_COLOURS = {
    JobState.SUCCEEDED: "#2e7d32", JobState.FAILED: "#c62828", JobState.RUNNING: "#1565c0",
    JobState.CANCELLED: "#757575", JobState.TIMEOUT: "#e65100", JobState.LOST: "#6a1b9a",
    JobState.PENDING: "#9e9e9e",
}  # fmt: skip
_WIDTH, _LABEL_W, _LANE_H, _GAP, _AXIS_H = 1200, 72, 30, 6, 34
_TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
# No script, font, image or frame may load, even if something slipped past the escaping.
_CSP = "default-src 'none'; style-src 'unsafe-inline'"
_CSS = """
body{font:14px/1.4 "DejaVu Sans","Liberation Sans",Arial,sans-serif;margin:24px;color:#212121;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:24px 0 8px}.note{color:#616161;margin:0 0 8px}
#summary{display:flex;gap:28px;list-style:none;padding:0;margin:12px 0}#summary b{display:block;font-size:22px}
#timeline{max-width:100%;height:auto;border:1px solid #e0e0e0}.grid{stroke:#d0d0d0;stroke-width:1}
.lane-bg{fill:#f5f5f5}.lane-label{font-size:13px;font-weight:bold;fill:#424242}.tick{font-size:12px;fill:#616161}
.job-label{font-size:12px;fill:#fff;font-weight:bold;pointer-events:none}.legend span{margin-right:16px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px}th{background:#fafafa}
table{border-collapse:collapse}th,td{padding:3px 10px;text-align:left;border-bottom:1px solid #eee}
"""


def render_html(report: Report) -> str:
    """One self-contained page: summary, the per-GPU timeline as inline SVG, then the tables.

    Every string a user chose (job names, reasons, user names) is escaped. Stable hooks for tests and
    styling: ``svg#timeline``, ``g.lane[data-gpu]``, ``rect.job.state-<state>[data-job][data-gpu]``.
    """
    e = html.escape
    summary = [(str(sum(report.counts.values())), "jobs")]
    summary += [(str(n), state.value) for state, n in _ordered_counts(report)]
    summary += [(_hours(report.gpu_hours), "GPU-hours held"), (_hours(report.idle_gpu_hours), "idle GPU-hours")]
    window = f"{_when(report.start)} to {_when(report.end)} ({format_duration(report.end - report.start)})"
    legend = "".join(f'<span><i style="background:{c}"></i>{s.value}</span>' for s, c in _COLOURS.items())
    users = [(user, _hours(h)) for user, h in report.gpu_hours_by_user.items()]
    arrays = [(str(array), _hours(h)) for array, h in report.gpu_hours_by_array.items()]
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        f"<title>gpuq report {e(_when(report.end))}</title><style>{_CSS}</style></head><body>",
        f'<h1>gpuq report</h1><p id="window">{e(window)}, {report.gpu_count} GPUs</p>',
        '<ul id="summary">' + "".join(f"<li><b>{e(n)}</b>{e(what)}</li>" for n, what in summary) + "</ul>",
        '<h2>Timeline</h2><p class="note">From the first job queued in the window to now; hover a bar for'
        " its job.</p>", _timeline_svg(report), f'<p class="legend">{legend}</p>',
        "<h2>Outcomes</h2>",
        _html_table("outcomes", _COLUMNS, [_cells(row, name_width=None) for row in report.rows]),
        "<h2>GPU-hours by user</h2>", _html_table("by-user", ("USER", "GPU-HOURS"), users),
        "<h2>GPU-hours by array</h2>", _html_table("by-array", ("ARRAY", "GPU-HOURS"), arrays),
        "</body></html>",
    ])  # fmt: skip


def _timeline_svg(report: Report) -> str:
    t0, t1 = report.timeline_start, report.end
    span = max(t1 - t0, 1e-9)
    plot_w = _WIDTH - _LABEL_W - 32  # room for half of the last tick's label

    def x(t: float) -> float:
        return _LABEL_W + (t - t0) / span * plot_w

    lanes_h = report.gpu_count * (_LANE_H + _GAP)
    height = lanes_h + _AXIS_H
    parts = [f'<svg id="timeline" width="{_WIDTH}" height="{height}" viewBox="0 0 {_WIDTH} {height}" role="img">']
    for gpu in range(report.gpu_count):
        y = gpu * (_LANE_H + _GAP)
        parts.append(
            f'<g class="lane" data-gpu="{gpu}"><rect class="lane-bg" x="{_LABEL_W}" y="{y}" width="{plot_w}" '
            f'height="{_LANE_H}"/><text class="lane-label" x="6" y="{y + 20}">GPU {gpu}</text></g>'
        )
    step = next((s for s in _TICK_STEPS if span / s <= 8), _TICK_STEPS[-1] * math.ceil(span / 8 / 86400))
    fmt = "%H:%M:%S" if step < 60 else ("%H:%M" if step < 86400 else "%m-%d")
    offset = time.localtime(t0).tm_gmtoff  # ticks on round local times, not round UTC ones
    tick = math.ceil((t0 + offset) / step) * step - offset
    while tick <= t1:
        parts.append(
            f'<line class="grid" x1="{x(tick):.1f}" y1="0" x2="{x(tick):.1f}" y2="{lanes_h + 4}"/>'
            f'<text class="tick" x="{x(tick):.1f}" y="{lanes_h + 20}" text-anchor="middle">{_when(tick, fmt)}</text>'
        )
        tick += step
    clock = "%H:%M:%S" if span < 2 * HOUR else "%H:%M"
    for seg in report.segments:
        left, width = x(seg.start), max(x(seg.end) - x(seg.start), 2.0)  # a 1 s job on a 12 h axis still shows
        y = seg.gpu * (_LANE_H + _GAP)
        tip = f"job {seg.job_id} {seg.name} ({seg.user}) {_when(seg.start, clock)}-{_when(seg.end, clock)} "
        parts.append(
            f'<rect class="job state-{seg.state.value}" data-job="{seg.job_id}" data-gpu="{seg.gpu}" '
            f'x="{left:.1f}" y="{y + 2}" width="{width:.1f}" height="{_LANE_H - 4}" rx="3" '
            f'fill="{_COLOURS[seg.state]}"><title>{html.escape(tip + seg.state.value)}</title></rect>'
        )
        label = str(seg.job_id)
        if width >= 8 * len(label) + 6:  # the id only where it fits; the tooltip always has it
            parts.append(
                f'<text class="job-label" x="{left + width / 2:.1f}" y="{y + 20}" text-anchor="middle">{label}</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts)


def _html_table(table_id: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    if not rows:
        return f'<p id="{table_id}" class="empty">none</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
