"""What the read-only commands print: tables and key/value views over records (GPU rows: views/gpu_rows.py)."""

from __future__ import annotations

import contextlib
import functools
import gc
import shlex
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpuq_scheduler.jobs.listing import Line
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.options import GPU_IDS
from gpuq_scheduler.jobs.outcome import JobState, in_host_memory
from gpuq_scheduler.jobs.shown import shown
from gpuq_scheduler.jobs.units import format_duration, format_energy, format_gpu_hours, format_size


@contextlib.contextmanager
def many_rows() -> Iterator[None]:
    """Cycle collection off while a listing is built: 100,000 jobs make half a million tuples and strings
    and not one reference cycle, and the collector, triggered by every 700 of them, would scan the growing
    heap again and again. Turned back on after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def runtime(record: JobRecord, now: float) -> float | None:
    """Seconds it ran, less the time it spent suspended (``Line.runtime``)."""
    return Line.of(record).runtime(now)


def _ending(line: Line) -> str:
    ending = _how_ended(line)
    if line.attempt > 1:  # it needed retries: say so, a success after two failures is not a clean run
        return f"{ending} (attempt {line.attempt})" if ending else f"attempt {line.attempt}"
    return ending


def _how_ended(line: Line) -> str:
    if line.state is JobState.SUCCEEDED:
        return "0"
    if line.state is JobState.PENDING:
        return line.reason
    if line.state is JobState.RUNNING:  # an interactive job's idle time, or where --mem auto's share came from
        return line.reason or (f"--mem auto: {line.mem_from}" if line.mem_auto and line.mem_from else "")
    return line.reason or (str(line.exit_code) if line.exit_code is not None else "")


_STATE_TEXT = {state: state.value for state in JobState}  # .value is a descriptor call: 0.04 s per 100,000 rows
# With the daemon down, a job it last saw running may have ended since: what it is now is unknown.
_DOWN_TEXT = {**_STATE_TEXT, JobState.RUNNING: "unknown"}
# GPUS is how many a job asked for, ON the indices of those it holds: one column of both read "0" (GPU 0)
# as no GPUs at all.
_HEADER = ("ID", "NAME", "USER", "STATE", "GPUS", "ON", "MEM", "RUNTIME", "EXIT / REASON")


def _cells(lines: Sequence[Line], now: float, down: bool = False) -> list[list[str]]:
    """The status table's cells, a list per column: one comprehension per column costs 40 ms less over
    100,000 jobs than a function call per row, and the table needs the columns for their widths anyway.
    ``down``: the daemon is not running (``_DOWN_TEXT``)."""
    states = _DOWN_TEXT if down else _STATE_TEXT
    return [
        [str(r.id) for r in lines],
        _shown([r.name[:24] for r in lines]),
        _shown([r.user for r in lines]),
        [states[r.state] for r in lines],
        [str(r.want_gpus) for r in lines],
        [_on(r.gpus) for r in lines],
        [_mem(r.mem_per_gpu, r.want_gpus, r.mem_auto, r.mem_from) for r in lines],
        ["-" if r.started_at is None else format_duration(r.runtime(now)) for r in lines],
        _shown([_ending(r) for r in lines]),
    ]


def _shown(column: list[str]) -> list[str]:
    """A column of text users chose, safe for a terminal (``jobs.shown``); a method call per cell, not a
    function call, on the 100,000 rows of `status --all`."""
    return [cell if cell.isprintable() else shown(cell) for cell in column]


@functools.cache  # a listing of 100,000 jobs holds a few dozen distinct values of each: format each once
def _on(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus)) if gpus else "-"


@functools.cache
def _mem(mem_per_gpu: int | None, wanted: int, auto: bool, chosen_from: str) -> str:
    size = format_size(mem_per_gpu) if mem_per_gpu else ("whole" if wanted else "-")
    if auto:  # "auto" until the daemon has chosen, then what it chose
        return f"auto:{size}" if chosen_from else "auto"
    return size


def status_table(lines: Sequence[Line], now: float | None = None, down: bool = False) -> str:
    now = time.time() if now is None else now
    columns = _cells(lines, now, down)
    if not any(line.cluster for line in lines):
        return _column_table(_HEADER, columns)
    return _table(*_where(_HEADER, list(zip(lines, zip(*columns, strict=True), strict=True))))


def _where(
    header: tuple[str, ...], rows: Sequence[tuple[Line, tuple[str, ...]]]
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """A WHERE column (``lab:1234``: cluster and Slurm id) after STATE, once any job went to a cluster."""
    if not any(line.cluster for line, _ in rows):
        return header, [row for _, row in rows]
    return (*header[:4], "WHERE", *header[4:]), [(*row[:4], _place(r), *row[4:]) for r, row in rows]


def _place(r: Line) -> str:
    if r.cluster is None:
        return "local"
    folded = r.id == r.array_id  # fold_arrays' line for a whole array: its Slurm array job
    slurm_id = (r.external_id or "").split("_")[0] if folded else r.external_id
    return f"{r.cluster}:{slurm_id}"


def fold_arrays(lines: Sequence[Line], names: Mapping[int, str], now: float | None = None, down: bool = False) -> str:
    """The status table with each array folded into one line of counts by state (``names``: array names;
    ``down``: the daemon is not running, as ``status_table``)."""
    now = time.time() if now is None else now
    groups: dict[int, list[Line]] = {}
    for line in lines:
        if line.array_id is not None:
            groups.setdefault(line.array_id, []).append(line)
    if not groups:
        return status_table(lines, now, down)  # nothing to fold: no pairs of line and row to keep for sorting
    alone = [r for r in lines if r.array_id is None]
    cells = zip(*_cells(alone, now, down), strict=True)
    rows: list[tuple[Line, tuple[str, ...]]] = list(zip(alone, cells, strict=True))
    states = _DOWN_TEXT if down else _STATE_TEXT
    # Every state, the live ones first: the counts add up to the array's size.
    order = [states[state] for state in (JobState.RUNNING, JobState.SUSPENDED, JobState.PENDING)]
    order += [states[state] for state in JobState if states[state] not in order]
    for array_id, members in groups.items():
        counts: dict[str, int] = {}
        for member in members:
            counts[states[member.state]] = counts.get(states[member.state], 0) + 1
        summary = ", ".join(f"{counts[state]} {state}" for state in order if state in counts)
        held_ones = [m for m in members if m.held and m.state is JobState.PENDING]
        held = len(held_ones)
        first = members[0]
        name = f"{shown((names.get(array_id) or first.name)[:18])} [{len(members)}]"
        held_gpus = sorted({g for m in members if m.state is JobState.RUNNING for g in m.gpus})
        # Why they are held, and how to let them run (the hold's own reason: "held: ...; `gpuq release 3`").
        why = f"{held} {shown(_held_why(held_ones[0].reason))}" if held else ""
        failed = next((m for m in members if m.state in _FAILURES), None)
        if failed is not None:  # what went wrong first says more than the counts
            why = f"job {failed.id}: {shown(_ending(failed))}" + (f"; {why}" if why else "")
        mem = _mem(first.mem_per_gpu, first.want_gpus, first.mem_auto, first.mem_from)
        on = _on(tuple(held_gpus))
        row = (str(array_id), name, shown(first.user), summary, str(first.want_gpus), on, mem, "-", why)
        rows.append((first._replace(id=array_id), row))
    rows.sort(key=lambda row: row[0].id)
    return _table(*_where(_HEADER, rows))


_FAILURES = (JobState.FAILED, JobState.TIMEOUT, JobState.LOST)


def _held_why(reason: str) -> str:
    return reason if reason.startswith("held") else f"held: {reason}"


def array_view(
    array_id: int, name: str, members: Sequence[JobRecord], now: float | None = None, down: bool = False
) -> str:
    """`gpuq show ARRAY`: the array in a line (its name, counts, first failure), then one line per member with
    its own arguments (its values in a sweep, else its command's arguments), failures first. ``down``: the
    daemon is not running (``status_table``)."""
    now = time.time() if now is None else now
    states = _DOWN_TEXT if down else _STATE_TEXT
    counts: dict[str, int] = {}
    for member in members:
        counts[states[member.state]] = counts.get(states[member.state], 0) + 1
    head = f"array {array_id}: {name}, {len(members)} jobs: " + ", ".join(f"{n} {s}" for s, n in counts.items())
    ordered = sorted(members, key=lambda m: (m.state not in _FAILURES, m.id))
    rows = [
        (
            str(m.id),
            str(m.array_index),
            states[m.state],
            str(m.spec.gpus),
            _on(m.gpus),
            format_duration(runtime(m, now)),
            _ending(Line.of(m)) or "-",
            member_arguments(m.spec),
        )
        for m in ordered
    ]
    return head + "\n" + _table(("ID", "INDEX", "STATE", "GPUS", "ON", "RUNTIME", "EXIT / REASON", "ARGS"), rows)


def member_arguments(spec: JobSpec) -> str:
    """What sets an array member apart: its values in a sweep (lr=1e-4 seed=2), else its command's arguments."""
    if spec.values:
        return " ".join(f"{name}={value}" for name, value in spec.values)
    return shlex.join(spec.command[1:])[:60]


class Progress:
    """A one-line progress bar for `gpuq wait` on a terminal: done, failed, running, pending, ETA."""

    def __init__(self, out: Any, width: int = 30) -> None:
        self.out = out
        self.width = width
        self.started = time.monotonic()

    def __call__(self, records: Sequence[JobRecord]) -> None:
        total = len(records) or 1
        done = sum(1 for r in records if r.state.finished)
        failed = sum(1 for r in records if r.state.finished and r.state is not JobState.SUCCEEDED)
        running = sum(1 for r in records if r.state is JobState.RUNNING)
        away = sum(1 for r in records if r.state is JobState.SUSPENDED)  # neither running nor waiting to start
        filled = int(self.width * done / total)
        elapsed = time.monotonic() - self.started
        eta = format_duration(elapsed * (total - done) / done) if 0 < done < total else "-"
        bar = "#" * filled + "-" * (self.width - filled)
        self.out.write(
            f"\r[{bar}] {done}/{total} done, {failed} failed, {running} running, "
            + (f"{away} suspended, " if away else "")
            + f"{total - done - running - away} pending, ETA {eta}\x1b[K"  # clear what a longer line left
        )
        self.out.flush()

    def close(self) -> None:
        self.out.write("\n")
        self.out.flush()


def _suspension(record: JobRecord, now: float) -> str:
    """What a suspended job holds and since when, or the step in progress."""
    if record.step is not None:
        return f"{record.step.value} (in progress)"
    held = in_host_memory(record.host_bytes) if record.host_bytes is not None else "its GPU state in host memory"
    since = f", since {_when(record.suspended_at)}" if record.suspended_at is not None else ""
    return f"{held}{since} (its GPUs are free; `gpuq resume {record.id}` brings it back)"


def show(record: JobRecord, now: float | None = None, moved: str = "", down: bool = False) -> str:
    """``gpuq show``'s lines; ``moved``: what suspending and preemption cost it (``views.suspensions``);
    ``down``: the daemon is not running, so a job it saw running may have ended since."""
    now = time.time() if now is None else now
    spec = record.spec
    state = record.state.value
    if down and record.state is JobState.RUNNING:
        state = "unknown (running when the daemon last saw it; known again once it is back)"
    lines = [
        ("id", str(record.id)),
        ("name", spec.display_name),
        ("user", f"{record.user} (uid {record.uid})"),
        ("state", state),
        *(
            [("cluster", record.cluster), ("slurm job", record.external_id or "-"), ("node", record.node or "-")]
            if record.cluster
            else []
        ),
        ("command", shlex.join(spec.command)),
        ("python", spec.python or "-"),
        ("cwd", spec.cwd),
        ("mode", spec.mode.value),
        ("priority", str(spec.priority)),
        ("gpus requested", str(spec.gpus) + _pinned(spec)),
        ("memory per gpu", _memory(spec)),
        ("time limit", format_duration(spec.time_limit)),
        *([("from the script", shlex.join(spec.from_script) + " (its #GPUQ lines)")] if spec.from_script else []),
        ("gpus", ",".join(map(str, record.gpus)) or "-"),
        ("gpu uuids", ",".join(record.gpu_uuids) or "-"),
        ("submitted", _when(record.submitted_at)),
        ("started", _when(record.started_at)),
        ("ended", _when(record.ended_at)),
        ("runtime", format_duration(runtime(record, now))),
        ("gpu hours", format_gpu_hours(record.gpu_hours(now))),
        ("gpu energy", format_energy(record.energy)),
        ("exit code", "-" if record.exit_code is None else str(record.exit_code)),
        ("signal", "-" if record.signal is None else str(record.signal)),
        ("reason", record.reason or "-"),
        *([("suspended", _suspension(record, now))] if record.state is JobState.SUSPENDED or record.step else []),
        *(
            [("preemptible", f"yes (SIG{spec.preempt_signal or 'USR1'} where it cannot be suspended)")]
            if spec.preemptible
            else []
        ),
        *([("preempted", moved)] if moved else []),
        (
            "cause",
            "-"
            if record.cause is None
            else record.cause.value + (f" (culprit: job {record.culprit})" if record.culprit is not None else ""),
        ),
        ("array", "-" if record.array_id is None else f"{record.array_id} index {record.array_index}"),
        *([("values", " ".join(f"{k}={v}" for k, v in spec.values))] if spec.values else []),
        ("attempt", f"{record.attempt} of {record.spec.retries + 1}"),
        (
            "after",
            ",".join(map(str, record.spec.after)) + (" (however they end)" if record.spec.after_any else "")
            if record.spec.after
            else "-",
        ),
        ("peak gpu memory", format_size(record.peak_mem)),
        ("host cpu time", "-" if record.cpu_seconds is None else format_duration(record.cpu_seconds)),
        ("peak host memory", format_size(record.peak_ram)),
        ("log", record.log),
        *([("output", record.output_file)] if record.output_file else []),
    ]
    width = max(len(key) for key, _ in lines)
    return "\n".join(f"{key:<{width}}  {shown(value)}" for key, value in lines)


def _pinned(spec: JobSpec) -> str:
    gpu_ids = spec.value(GPU_IDS)
    return f" (these: --gpu-ids {','.join(map(str, gpu_ids))})" if gpu_ids else ""


def _memory(spec: JobSpec) -> str:
    chosen = format_size(spec.mem_per_gpu) if spec.mem_per_gpu else "whole GPUs"
    if not spec.mem_auto:
        return chosen
    learned = f" from job {spec.like}" if spec.like is not None else ""
    return f"{chosen} (--mem auto: {spec.mem_from})" if spec.mem_from else f"auto: learned{learned} when it starts"


def _when(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart."""
    columns = [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in header]
    return _column_table(header, columns)


def _column_table(header: Sequence[str], columns: Sequence[Sequence[str]]) -> str:
    """``_table`` from the cells a list per column. One format string for every row: 100,000 rows in ~0.1 s."""
    widths = [max(len(title), *map(len, column)) for title, column in zip(header, columns, strict=True)]
    line = "  ".join([*(f"%-{w}s" for w in widths[:-1]), "%s"])  # %: a fifth faster than str.format here
    body = [(line % row).rstrip() for row in zip(*columns, strict=True)]
    return "\n".join([(line % tuple(header)).rstrip(), *body])
