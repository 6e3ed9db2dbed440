"""From what a shim left on disk to an Outcome: exit code or signal, plus the reason a person wants to read."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from gpuq_scheduler.jobs.causes import Cause, OutOfMemory
from gpuq_scheduler.jobs.model import JobRecord, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store.statedir import read_bytes
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.jobs.units import format_size
from gpuq_scheduler.launcher.supervisor.exits import BadExitFile, ExitFile, Stop

_TAIL_BYTES = 64 << 10
_OOM = re.compile(rb"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED")
_EXCEPTION = re.compile(rb"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): ?(.*)$", re.MULTILINE)
# torchrun's own summary when a rank fails: its root cause names the rank that failed first, whose own
# traceback is earlier in the log, each line prefixed "[rankN]: ".
_ROOT_CAUSE = re.compile(rb"^Root Cause \(first observed failure\):\n\[\d+\]:\n(.*?)^=+$", re.MULTILINE | re.DOTALL)
_INDENTED_EXCEPTION = re.compile(rb"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): ?(.*)$", re.MULTILINE)
_ROOT_FIELD = re.compile(rb"^\s*(rank|exitcode)\s*: (-?\d+)", re.MULTILINE)
# A command line parser's refusal, as it ends the log of a program that exits 2: argparse's "PROG: error:
# MESSAGE" under its usage, click's (and typer's without rich) "Error: MESSAGE", typer's boxed "Error".
USAGE_EXIT = 2
_USAGE_LINES = 12  # a parser's refusal is the last thing its program says
_ARGPARSE = re.compile(rb"^\S+: error: \S.*$")
_CLICK = re.compile(rb"^Error: \S.*$")
_BOX_TOP, _BOX_SIDE, _BOX_BOTTOM = "\u256d\u2500 Error ".encode(), "\u2502".encode(), "\u2570".encode()


def exit_files(run: Path) -> set[str] | None:
    """The names of the exit files in ``run/`` now, or None if it cannot be listed (then read each job's).
    One listing per pass, not one failed open per running job: 40 packed jobs cost 40 opens, each raising."""
    try:
        return {name for name in os.listdir(run) if name.endswith(".exit")}
    except OSError:
        return None


def read_exit(path: str) -> ExitFile | None:
    """The shim's exit file, or None if there is none yet (or it is torn: the shim died mid-write). Raises
    ``BadExitFile`` for one that is whole and not what a shim writes."""
    try:
        data = json.loads(read_bytes(path))
    except (OSError, ValueError):
        return None
    return ExitFile.from_json(data)


def unreadable(err: BadExitFile) -> Outcome:
    """The outcome of a job whose shim left an exit file gpuq cannot read."""
    return Outcome.lost(f"its supervisor's exit file is not one gpuq reads: {err}")


def log_reason(log: str, exit_code: int | None = None) -> str | None:
    """A short diagnosis from the end of a failed job's log: None for CUDA out of memory (the daemon then
    works out which kind), else its last exception (or, for ``exit_code`` 2, its parser's usage error), or
    nothing."""
    try:
        with open(log, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - _TAIL_BYTES))
            tail = handle.read()
    except OSError:
        return ""
    return tail_reason(tail, exit_code)


def tail_reason(tail: bytes, exit_code: int | None = None) -> str | None:
    """The diagnosis from the end of a log: None for CUDA OOM, else the failing torchrun rank's own exception, else
    the last exception. torchrun ends its log with its own ``ChildFailedError``, which says only that a
    rank failed: the rank's own error is the one a person needs."""
    if _OOM.search(tail):
        return None
    root = _ROOT_CAUSE.search(tail)
    if root:
        return _rank_reason(tail, root.group(1))
    usage = usage_error(tail) if exit_code == USAGE_EXIT else None
    return usage or _last_exception(tail)


def usage_error(tail: bytes) -> str | None:
    """The usage error a command line parser ended the log with (argparse, click, typer), as it said it:
    ``train.py: error: unrecognized arguments: --sed 4``. Read only in the last lines, and only for a job
    that exited 2, as they do: an "error:" line earlier in a log is the program's own business."""
    lines = [line.rstrip() for line in tail.rstrip().splitlines()[-_USAGE_LINES:]]
    for at in range(len(lines) - 1, -1, -1):
        line = lines[at]
        if _ARGPARSE.match(line) or _CLICK.match(line):
            return line.decode(errors="replace")[:200]
        if line.startswith(_BOX_TOP):  # typer with rich: the message is the box's inside, maybe wrapped
            inside = []
            for row in lines[at + 1 :]:
                if not row.startswith(_BOX_SIDE):
                    break
                inside.append(row.strip(_BOX_SIDE + b" ").decode(errors="replace"))
            text = " ".join(part for part in inside if part)
            return f"Error: {text}"[:200] if text else None
    return None


def _last_exception(text: bytes, pattern: re.Pattern[bytes] = _EXCEPTION) -> str:
    matches = pattern.findall(text)
    if not matches:
        return ""
    name, message = matches[-1]
    found: str = (name + b": " + message).decode(errors="replace").strip()
    return found[:200]


def _rank_reason(tail: bytes, summary: bytes) -> str:
    fields = dict(_ROOT_FIELD.findall(summary))
    rank = fields.get(b"rank")
    if rank is None:
        return _last_exception(summary, _INDENTED_EXCEPTION)
    prefix = b"[rank" + rank + b"]: "
    own = b"\n".join(line[len(prefix) :] for line in tail.splitlines() if line.startswith(prefix))
    # Its traceback as torchrun prints it, else the one its error file held (with @record), else its exit.
    found = _last_exception(own) or _last_exception(summary, _INDENTED_EXCEPTION)
    if found:
        return f"rank {rank.decode()}: {found}"[:200]
    code = fields.get(b"exitcode", b"?").decode()
    return f"rank {rank.decode()} failed first (exit code {code})"


def contained(outcome: Outcome, exit_data: ExitFile) -> Outcome:
    """The outcome with what the job's containment saw (the exit file's ``contained``, written by
    ``launcher.supervisor.containment.end``): the kernel's OOM killer at its --ram limit, or forks refused at
    its --pids limit, which explain a failure (and are said beside any other end), and the processes that
    outlived the job's first one and were ended with it."""
    facts = exit_data.contained
    kills, limit = facts.get("oom_kills"), facts.get("ram_limit")
    if isinstance(kills, int) and kills > 0 and isinstance(limit, int) and outcome.state is JobState.FAILED:
        detail = f"out of host memory at its {format_size(limit)} limit"
        if outcome.exit_code is not None:
            detail += f" (exit code {outcome.exit_code})"
        outcome = Outcome.out_of_host_memory(detail, outcome.exit_code, outcome.signal)
    refused, most = facts.get("pids_refused"), facts.get("pids_limit")
    if isinstance(refused, int) and refused > 0 and isinstance(most, int):
        if outcome.cause in (Cause.EXIT_CODE, Cause.SIGNAL):  # a failure the refused forks explain
            outcome = Outcome.process_limit(most, outcome)
        elif outcome.state is not JobState.FAILED:  # it ended otherwise, but was held to its limit: say so too
            note = f"it reached its limit of {most} processes"
            outcome = dataclasses.replace(outcome, reason=f"{outcome.reason}; {note}" if outcome.reason else note)
    outlived = facts.get("outlived")
    if isinstance(outlived, int) and not isinstance(outlived, bool) and outlived > 0:
        return dataclasses.replace(outcome, outlived=outlived)
    return outcome


def record_host_usage(table: JobTable, job_id: int, exit_data: ExitFile) -> None:
    """Keep what the job's cgroup accounted (the exit file's ``contained``), for `gpuq show`."""
    facts = exit_data.contained
    cpu, peak = facts.get("cpu_seconds"), facts.get("peak_ram")
    cpu = float(cpu) if isinstance(cpu, int | float) and not isinstance(cpu, bool) else None
    peak = peak if isinstance(peak, int) and not isinstance(peak, bool) else None
    if cpu is not None or peak is not None:
        table.set_host_usage(job_id, cpu, peak)


def classify(exit_data: ExitFile, record: JobRecord, launch: Launch, oom: Callable[[], OutOfMemory]) -> Outcome | None:
    """How the job ended; None when it never started (the launch was interrupted: requeue it). ``oom``
    says what kind of CUDA out of memory it was, asked only when its log shows one."""
    if not exit_data.started:
        return None
    if exit_data.spawn_error is not None:
        return Outcome.failed_to_spawn(exit_data.spawn_error)
    code, signum, stop = exit_data.exit_code, exit_data.signal, exit_data.reason
    # gpuq's stop comes before the exit code: a job that catches SIGTERM and exits 0 did not finish its work,
    # and reads as timed out or cancelled (as in Slurm), never as succeeded.
    if stop is Stop.TIMEOUT and record.spec.time_limit is not None:
        return Outcome.timeout(record.spec.time_limit, signum)
    if stop is Stop.CANCEL or launch.cancel_by:
        return Outcome.cancelled(launch.cancel_by or "a signal to its supervisor", signum)
    if code == 0:
        return Outcome.succeeded()
    diagnosis = log_reason(record.log, code)
    if diagnosis is None and (signum is not None or code is not None):
        return Outcome.out_of_memory(oom(), code, signum)
    diagnosis = diagnosis or ""
    if signum is not None:
        return Outcome.killed(signum, diagnosis)
    if code is None:
        return Outcome.lost("its supervisor reported no exit status")
    return Outcome.failed(code, diagnosis)
