"""The morning report as one standalone page: the outcomes table and a per-GPU timeline of which job ran
where and when (inline CSS and SVG, no scripts, nothing fetched, and a Content-Security-Policy that would
block it)."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Mapping, Sequence

from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.units import format_duration, format_size
from gpuq_scheduler.launcher.views.report import HOUR, Report
from gpuq_scheduler.launcher.views.report_text import (
    PACKING_COLUMNS,
    hours_text,
    ordered_counts,
    outcome_table,
    packing_rows,
    suspension_table,
    user_table,
    when,
)

_COLOURS = {
    JobState.SUCCEEDED: "#2e7d32",
    JobState.FAILED: "#c62828",
    JobState.RUNNING: "#1565c0",
    JobState.CANCELLED: "#757575",
    JobState.TIMEOUT: "#e65100",
    JobState.LOST: "#6a1b9a",
    JobState.PENDING: "#9e9e9e",
    JobState.SUSPENDED: "#f9a825",
}
_WIDTH, _LABEL_W, _LANE_H, _GAP, _AXIS_H = 1200, 72, 30, 6, 34
_TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
# No script, font, image or frame may load, even if something slipped past the escaping.
_CSP = "default-src 'none'; style-src 'unsafe-inline'"
# The timeline's own styles travel inside its <svg>, so every page that embeds it (the report, `gpuq serve`)
# draws it the same: an SVG shape without a style is filled black.
_TIMELINE_CSS = (
    "#timeline{max-width:100%;height:auto;border:1px solid #e0e0e0;background:#fff}"
    "#timeline .grid{stroke:#d0d0d0;stroke-width:1}#timeline .lane-bg{fill:#f5f5f5}"
    '#timeline .lane-label{font:bold 13px "DejaVu Sans",Arial,sans-serif;fill:#424242}'
    '#timeline .tick{font:12px "DejaVu Sans",Arial,sans-serif;fill:#616161}'
    '#timeline .job-label{font:bold 12px "DejaVu Sans",Arial,sans-serif;fill:#fff;pointer-events:none;'
    "stroke-width:3px;paint-order:stroke}"
    "#timeline .job-label.beside{fill:#212121;stroke:#fff;stroke-width:3px;paint-order:stroke}"
    "#timeline .reservation{fill:#7e57c2;fill-opacity:.12;stroke:#5e35b1;stroke-width:2;stroke-dasharray:6 3}"
    "#timeline .now{stroke:#212121;stroke-width:1;stroke-dasharray:2 2}"
)
# A job that ended badly within a pixel or two still shows: wide enough to see, and named beside itself.
_ENDED_BADLY = (JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.LOST)
_MIN_BAD_W = 6.0
# Time suspended is striped over the job's bar in the suspended colour (the stripes' own pattern).
_HATCH = (
    '<defs><pattern id="suspended-stripes" width="8" height="8" patternUnits="userSpaceOnUse" '
    f'patternTransform="rotate(45)"><rect width="8" height="8" fill="#fff"/>'
    f'<rect width="5" height="8" fill="{_COLOURS[JobState.SUSPENDED]}"/></pattern></defs>'
)


def legend_html(states: Sequence[JobState] = tuple(_COLOURS)) -> str:
    """What the timeline's colours mean, and its stripes: a line under it."""
    swatches = "".join(f'<span><i style="background:{_COLOURS[s]}"></i>{s.value}</span>' for s in states)
    stripes = f"repeating-linear-gradient(45deg,{_COLOURS[JobState.SUSPENDED]} 0 4px,#fff 4px 6px)"
    marked = f'<span><i style="background:{stripes}"></i>time suspended</span>'
    return f'<p class="legend" id="legend">{swatches}{marked}</p>'


_CSS = """
body{font:14px/1.4 "DejaVu Sans","Liberation Sans",Arial,sans-serif;margin:24px;color:#212121;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:24px 0 8px}.note{color:#616161;margin:0 0 8px}
#summary{display:flex;gap:28px;list-style:none;padding:0;margin:12px 0}#summary b{display:block;font-size:22px}
.legend span{margin-right:16px}
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
    summary += [(str(n), state.value) for state, n in ordered_counts(report)]
    summary += [(hours_text(report.gpu_hours), "GPU-hours held"), (hours_text(report.idle_gpu_hours), "idle GPU-hours")]
    summary += [(hours_text(sum(report.saved_by_user.values())), "GPU-hours saved by packing")]
    window = f"{when(report.start)} to {when(report.end)} ({format_duration(report.end - report.start)})"
    columns, users = user_table(report)
    arrays = [(str(a), report.array_names.get(a, "-"), hours_text(h)) for a, h in report.gpu_hours_by_array.items()]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
            f"<title>gpuq report {e(when(report.end))}</title><style>{_CSS}</style></head><body>",
            f'<h1>gpuq report</h1><p id="window">{e(window)}, {report.gpu_count} GPUs</p>',
            '<ul id="summary">' + "".join(f"<li><b>{e(n)}</b>{e(what)}</li>" for n, what in summary) + "</ul>",
            '<h2>Timeline</h2><p class="note">From the first job queued in the window to now; hover a bar for'
            " its job.</p>",
            timeline_svg(report),
            legend_html(),
            "<h2>Outcomes</h2>",
            html_table("outcomes", *outcome_table(report, name_width=None)),
            "<h2>GPU-hours by user</h2>",
            html_table("by-user", columns, users),
            "<h2>GPU-hours by array</h2>",
            html_table("by-array", ("ARRAY", "NAME", "GPU-HOURS"), arrays),
            '<h2>Packing</h2><p class="note">GPU-hours that whole GPUs for the same --mem jobs would have held,'
            " and jobs stopped at their memory fence.</p>",
            html_table("packing", PACKING_COLUMNS, packing_rows(report)),
            '<h2>Suspensions and preemptions</h2><p class="note">What suspending and preemption cost: times'
            " preempted (requeued among them), suspends, GPU state moved to host memory, time suspended.</p>",
            html_table("suspensions-by-user", *suspension_table(report)),
            html_table("suspensions-by-job", *job_suspension_table(report)),
            "</body></html>",
        ]
    )


def job_suspension_table(report: Report) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """``suspension_table`` per job (those it cost anything), by id: the header and the rows."""
    header: tuple[str, ...] = ("JOB", "NAME", "USER", "PREEMPTED", "REQUEUED", "SUSPENDS", "MOVED", "SUSPENDED")
    names = {row.id: (row.name, row.user) for row in report.rows}
    rows: list[tuple[str, ...]] = [
        (
            str(job),
            *names.get(job, ("-", "-")),
            str(m.preemptions),
            str(m.requeues),
            str(m.suspends),
            format_size(m.bytes),
            format_duration(m.seconds),
        )
        for job, m in sorted(report.moves_by_job.items())
    ]
    return header, rows


def sub_lanes(spans: Sequence[tuple[float, float]]) -> list[int]:
    """A row for each (left, right) bar of one GPU, so that bars on one row never overlap: jobs packed on a
    GPU at once get rows of their own, and a row is reused once its last bar has ended (first fit, by left)."""
    rows: list[float] = []  # the right edge of each row's last bar
    chosen = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i]):
        left, right = spans[i]
        row = next((r for r, end in enumerate(rows) if end <= left), len(rows))
        if row == len(rows):
            rows.append(right)
        rows[row] = right
        chosen[i] = row
    return chosen


def timeline_svg(
    report: Report,
    away: Mapping[int, Sequence[tuple[float, float]]] | None = None,
    reserved: Sequence[tuple[int, float, float, str]] = (),
) -> str:
    """Each GPU's lane holds one row per job it ran at once (packed jobs side by side, none hidden).
    ``away``: each job's stretches of time suspended (``views.suspensions.away``), striped over its bar. A
    job that ended badly is never a sliver: at least a few pixels wide, named beside its bar where its id
    does not fit inside. ``reserved``: (GPU, start, end, words) of reservations on or to come, outlined
    over their lanes; the axis then runs on past now (by at most half its span) to show the next ones."""
    t0, t1 = report.timeline_start, report.end
    if reserved:
        t1 = max(t1, min(max(end for _, _, end, _ in reserved), t1 + (t1 - t0) / 2))
    span = max(t1 - t0, 1e-9)
    plot_w = _WIDTH - _LABEL_W - 32  # room for half of the last tick's label

    def x(t: float) -> float:
        return _LABEL_W + (t - t0) / span * plot_w

    bars = [
        (x(seg.start), max(x(seg.end) - x(seg.start), _MIN_BAD_W if seg.state in _ENDED_BADLY else 2.0))
        for seg in report.segments
    ]  # a 1 s job shows
    row_of = [0] * len(bars)
    rows = [1] * report.gpu_count
    for gpu in range(report.gpu_count):
        mine = [i for i, seg in enumerate(report.segments) if seg.gpu == gpu]
        for i, row in zip(mine, sub_lanes([(bars[i][0], bars[i][0] + bars[i][1]) for i in mine]), strict=True):
            row_of[i] = row
            rows[gpu] = max(rows[gpu], row + 1)
    lane_top = [sum(n * _LANE_H + _GAP for n in rows[:gpu]) for gpu in range(report.gpu_count + 1)]
    lanes_h = lane_top[-1]
    height = lanes_h + _AXIS_H
    parts = [
        f'<svg id="timeline" width="{_WIDTH}" height="{height}" viewBox="0 0 {_WIDTH} {height}" role="img">',
        f"<style>{_TIMELINE_CSS}</style>",
        _HATCH,
    ]
    for gpu in range(report.gpu_count):
        y, lane_h = lane_top[gpu], rows[gpu] * _LANE_H
        parts.append(
            f'<g class="lane" data-gpu="{gpu}"><rect class="lane-bg" x="{_LABEL_W}" y="{y}" width="{plot_w}" '
            f'height="{lane_h}" fill="#f5f5f5"/><text class="lane-label" x="6" y="{y + lane_h / 2 + 5:g}">'
            f"GPU {gpu}</text></g>"
        )
    step = next((s for s in _TICK_STEPS if span / s <= 8), _TICK_STEPS[-1] * math.ceil(span / 8 / 86400))
    fmt = "%H:%M:%S" if step < 60 else ("%H:%M" if step < 86400 else "%m-%d")
    offset = time.localtime(t0).tm_gmtoff  # ticks on round local times, not round UTC ones
    tick = math.ceil((t0 + offset) / step) * step - offset
    while tick <= t1:
        parts.append(
            f'<line class="grid" x1="{x(tick):.1f}" y1="0" x2="{x(tick):.1f}" y2="{lanes_h + 4}"/>'
            f'<text class="tick" x="{x(tick):.1f}" y="{lanes_h + 20}" text-anchor="middle">{when(tick, fmt)}</text>'
        )
        tick += step
    clock = "%H:%M:%S" if span < 2 * HOUR else "%H:%M"
    beside: list[str] = []  # labels beside their bars, drawn last: over any bar that follows
    for seg, (left, width), row in zip(report.segments, bars, row_of, strict=True):
        y = lane_top[seg.gpu] + row * _LANE_H
        tip = f"job {seg.job_id} {seg.name} ({seg.user}) {when(seg.start, clock)}-{when(seg.end, clock)} "
        parts.append(
            f'<rect class="job state-{seg.state.value}" data-job="{seg.job_id}" data-gpu="{seg.gpu}" '
            f'data-row="{row}" x="{left:.1f}" y="{y + 2}" width="{width:.1f}" height="{_LANE_H - 4}" rx="3" '
            f'fill="{_COLOURS[seg.state]}"><title>{html.escape(tip + seg.state.value)}</title></rect>'
        )
        for since, until in (away or {}).get(seg.job_id, ()):
            a, b = x(max(since, seg.start)), x(min(until, seg.end))
            if b > a:
                parts.append(
                    f'<rect class="suspended" data-job="{seg.job_id}" x="{a:.1f}" y="{y + 2}" width="{b - a:.1f}" '
                    f'height="{_LANE_H - 4}" fill="url(#suspended-stripes)"><title>job {seg.job_id} suspended '
                    f"{when(since, clock)}-{when(until, clock)}</title></rect>"
                )
        label = str(seg.job_id)
        if width >= 8 * len(label) + 6:  # the id only where it fits; the tooltip always has it
            parts.append(
                f'<text class="job-label" x="{left + width / 2:.1f}" y="{y + 20}" text-anchor="middle" '
                f'stroke="{_COLOURS[seg.state]}">{label}</text>'  # a halo of its bar's colour: legible on stripes
            )
        elif seg.state in _ENDED_BADLY:  # a failure is news: say which and how, beside the bar
            beside.append(
                f'<text class="job-label beside" x="{left + width + 3:.1f}" y="{y + 20}">'
                f"{label} {seg.state.value}</text>"
            )
    if reserved:  # now, and the reservations (the part of each within the axis)
        parts.append(f'<line class="now" x1="{x(report.end):.1f}" y1="0" x2="{x(report.end):.1f}" y2="{lanes_h}"/>')
    for gpu, start, end, words in reserved:
        a, b = x(max(start, t0)), x(min(end, t1))
        if gpu < report.gpu_count and b > a:
            y, lane_h = lane_top[gpu], rows[gpu] * _LANE_H
            parts.append(
                f'<rect class="reservation" data-gpu="{gpu}" x="{a:.1f}" y="{y + 1}" width="{b - a:.1f}" '
                f'height="{lane_h - 2}"><title>{html.escape(words)}</title></rect>'
            )
    parts += [*beside, "</svg>"]
    return "\n".join(parts)


def html_table(table_id: str, header: Sequence[str], rows: Sequence[Sequence[str]], markup_column: int = -1) -> str:
    """A table with every cell escaped, except column ``markup_column``, which holds markup we made."""
    if not rows:
        return f'<p id="{table_id}" class="empty">none</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{c if i == markup_column else html.escape(c)}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
