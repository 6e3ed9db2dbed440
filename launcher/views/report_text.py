"""The morning report's tables and its text: what ``gpuq report`` prints, and the header and rows of each
table, which the page (``report_html``) and ``gpuq serve`` draw too.

Formatting only: ``report.build_report`` computes everything once; nothing here reads a record.
"""

from __future__ import annotations

import time

from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.units import format_duration, format_energy, format_size
from gpuq_scheduler.launcher.views.report import JobRow, Report
from gpuq_scheduler.launcher.views.tables import _table


def render_text(report: Report) -> str:
    """What ``gpuq report`` prints: a headline, the outcomes table, GPU-hours by user and by array."""
    lines = [_headline(report), _usage(report)]
    if report.rows:
        lines += ["", _table(*outcome_table(report))]
    else:
        lines.append("no jobs in this window")
    if report.gpu_hours_by_user:
        lines += ["", _table(*user_table(report))]
    if report.gpu_hours_by_array:
        by_array = [
            (str(array), report.array_names.get(array, "-"), hours_text(h))
            for array, h in report.gpu_hours_by_array.items()
        ]
        lines += ["", _table(("ARRAY", "NAME", "GPU-HOURS"), by_array)]
    if report.saved_by_user or report.fenced_by_user:
        lines += ["", _packing(report)]
    if report.moves_by_user:
        lines += ["", _table(*suspension_table(report))]
    return "\n".join(lines)


def suspension_table(report: Report) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """What suspending and preemption cost each user's jobs: the header and the rows."""
    header: tuple[str, ...] = ("USER", "PREEMPTED", "REQUEUED", "SUSPENDS", "MOVED", "SUSPENDED")
    rows: list[tuple[str, ...]] = [
        (user, str(m.preemptions), str(m.requeues), str(m.suspends), format_size(m.bytes), format_duration(m.seconds))
        for user, m in sorted(report.moves_by_user.items())
    ]
    return header, rows


def user_table(report: Report) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """What each user's jobs used: GPU-hours, and where measured GPU energy (NVML: every GPU since Volta,
    the fake inventory), host CPU time and the largest peak host memory (a job's cgroup): a column each
    only where some job has a figure. The header and the rows, for the text and the page alike."""
    measured = [
        (header, shown)
        for header, shown in (
            ("GPU ENERGY", {user: format_energy(j) for user, j in report.energy_by_user.items()}),
            ("CPU TIME", {user: format_duration(s) for user, s in report.cpu_by_user.items()}),
            ("PEAK RAM", {user: format_size(b) for user, b in report.peak_ram_by_user.items()}),
        )
        if shown
    ]
    header = ("USER", "GPU-HOURS", *(h for h, _ in measured))
    rows = [
        (user, hours_text(hours), *(shown.get(user, "-") for _, shown in measured))
        for user, hours in report.gpu_hours_by_user.items()
    ]
    return header, rows


def _packing(report: Report) -> str:
    saved, fenced = sum(report.saved_by_user.values()), sum(report.fenced_by_user.values())
    head = f"packing saved {hours_text(saved)} GPU-hours against whole GPUs; {fenced} job(s) stopped at their fence"
    return head + "\n" + _table(PACKING_COLUMNS, packing_rows(report))


PACKING_COLUMNS = ("WHO", "SAVED GPU-HOURS", "STOPPED AT FENCE")


def packing_rows(report: Report) -> list[tuple[str, str, str]]:
    """Packing's payoff, per user and per array: GPU-hours saved against whole GPUs, jobs stopped at their fence."""
    users = [
        (f"user {user}", hours_text(report.saved_by_user.get(user, 0.0)), str(report.fenced_by_user.get(user, 0)))
        for user in sorted({*report.saved_by_user, *report.fenced_by_user})
    ]
    arrays = [
        (f"array {a}", hours_text(report.saved_by_array.get(a, 0.0)), str(report.fenced_by_array.get(a, 0)))
        for a in sorted({*report.saved_by_array, *report.fenced_by_array})
    ]
    return users + arrays


def _headline(report: Report) -> str:
    counts = ", ".join(f"{n} {state.value}" for state, n in ordered_counts(report))
    window = f"{when(report.start)} to {when(report.end)} ({format_duration(report.end - report.start)})"
    return f"gpuq report {window}: {sum(report.counts.values())} jobs" + (f", {counts}" if counts else "")


def _usage(report: Report) -> str:
    share = f" ({report.gpu_hours / report.capacity_gpu_hours:.0%})" if report.capacity_gpu_hours else ""
    return (
        f"{report.gpu_count} GPUs; GPU-hours held {hours_text(report.gpu_hours)}"
        f" of {hours_text(report.capacity_gpu_hours)}"
        f"{share}; idle while work waited {hours_text(report.idle_gpu_hours)} GPU-hours"
    )


def ordered_counts(report: Report) -> list[tuple[JobState, int]]:
    # Succeeded and failed always show (the brief's headline); other states only when they happened.
    return [(s, report.counts.get(s, 0)) for s in _ORDER if report.counts.get(s) or s in _ORDER[:2]]


# The headline's order: how things ended first, then what is still going on.
_ORDER = (
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.TIMEOUT,
    JobState.LOST,
    JobState.RUNNING,
    JobState.SUSPENDED,
    JobState.PENDING,
)


# PEAK MEM: GPU memory (NVML); CPU TIME and PEAK RAM: host use, from the job's cgroup (HOST_COLUMNS).
COLUMNS = (
    "ID",
    "NAME",
    "USER",
    "ARRAY",
    "ARGS",
    "STATE",
    "EXIT",
    "RUNTIME",
    "PEAK MEM",
    "CPU TIME",
    "PEAK RAM",
    "GPUS",
    "REASON",
)
HOST_COLUMNS = (9, 10)


def outcome_table(report: Report, name_width: int | None = 24) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The outcomes' header and rows; each host-use column only where some job has a figure in it (none
    does without a cgroup to account it), as the users' table does."""
    rows = [cells(row, name_width) for row in report.rows]
    kept = [i for i in range(len(COLUMNS)) if i not in HOST_COLUMNS or any(row[i] != "-" for row in rows)]
    return tuple(COLUMNS[i] for i in kept), [tuple(row[i] for i in kept) for row in rows]


def cells(row: JobRow, name_width: int | None = 24) -> tuple[str, ...]:
    gpus = ",".join(map(str, row.gpus)) or ("-" if row.gpus_requested == 0 else f"({row.gpus_requested})")
    return (
        str(row.id),
        row.name[:name_width],
        row.user,
        row.array or "-",
        row.args[:40] or "-",
        row.state.value,
        row.exit or "-",
        format_duration(row.runtime),
        format_size(row.peak_mem),
        format_duration(row.cpu_seconds),
        format_size(row.peak_ram),
        gpus,
        row.reason,
    )


def hours_text(hours: float) -> str:
    if 0 < hours < 0.005:
        return "<0.01"  # a few GPU-seconds: "0.00" would read as "nothing ran"
    return f"{hours:.1f}" if hours >= 10 else f"{hours:.2f}"


def when(stamp: float, fmt: str = "%Y-%m-%d %H:%M") -> str:
    return time.strftime(fmt, time.localtime(stamp))
