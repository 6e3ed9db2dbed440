"""From what a shim left on disk to an Outcome: exit code or signal, plus the reason a person wants to read."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs.model import JobRecord, JobState, Launch, Outcome
from gpuq_scheduler.jobs.store.statedir import read_bytes
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.jobs.units import format_size
from gpuq_scheduler.launcher.policy import lifecycle

_TAIL_BYTES = 64 << 10
OOM = lifecycle.OOM_REASON  # --oom-retry and --mem auto key on it
_OOM = re.compile(rb"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED")
_EXCEPTION = re.compile(rb"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): ?(.*)$", re.MULTILINE)


def exit_files(run: Path) -> set[str] | None:
    """The names of the exit files in ``run/`` now, or None if it cannot be listed (then read each job's).
    One listing per pass, not one failed open per running job: 40 packed jobs cost 40 opens, each raising."""
    try:
        return {name for name in os.listdir(run) if name.endswith(".exit")}
    except OSError:
        return None


def read_exit(path: str) -> dict[str, Any] | None:
    """The shim's exit file, or None if there is none yet (or it is torn: the shim died mid-write)."""
    try:
        data = json.loads(read_bytes(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def log_reason(log: str) -> str:
    """A short diagnosis from the end of a failed job's log: CUDA OOM first, else its last exception."""
    try:
        with open(log, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - _TAIL_BYTES))
            tail = handle.read()
    except OSError:
        return ""
    if _OOM.search(tail):
        return OOM
    matches = _EXCEPTION.findall(tail)
    if matches:
        name, message = matches[-1]
        text: str = (name + b": " + message).decode(errors="replace").strip()
        return text[:200]
    return ""


def contained(outcome: Outcome, exit_data: dict[str, Any]) -> Outcome:
    """The outcome with what the job's containment saw (the exit file's ``contained``, written by
    ``launcher.daemon.containment.end``): the kernel's OOM killer at its --ram limit, which explains a
    failure, and the processes that outlived the job's first one and were ended with it."""
    facts = exit_data.get("contained")
    if not isinstance(facts, dict):
        return outcome
    reason = outcome.reason
    kills, limit = facts.get("oom_kills"), facts.get("ram_limit")
    if isinstance(kills, int) and kills > 0 and isinstance(limit, int) and outcome.state is JobState.FAILED:
        reason = f"out of host memory at its {format_size(limit)} limit"
        if outcome.exit_code is not None:
            reason += f" (exit code {outcome.exit_code})"
    outlived = facts.get("outlived")
    if isinstance(outlived, int) and outlived > 0:
        note = f"{outlived} processes outlived the job and were ended" if outlived > 1 else (
            "1 process outlived the job and was ended")
        reason = f"{reason}; {note}" if reason else note
    return dataclasses.replace(outcome, reason=reason) if reason != outcome.reason else outcome


def record_host_usage(table: JobTable, job_id: int, exit_data: dict[str, Any]) -> None:
    """Keep what the job's cgroup accounted (the exit file's ``contained``), for `gpuq show`."""
    facts = exit_data.get("contained")
    if not isinstance(facts, dict):
        return
    cpu, peak = facts.get("cpu_seconds"), facts.get("peak_ram")
    cpu = float(cpu) if isinstance(cpu, int | float) and not isinstance(cpu, bool) else None
    peak = peak if isinstance(peak, int) and not isinstance(peak, bool) else None
    if cpu is not None or peak is not None:
        table.set_host_usage(job_id, cpu, peak)


def classify(exit_data: dict[str, Any], record: JobRecord, launch: Launch, fenced: bool = True) -> Outcome | None:
    """How the job ended; None when it never started (the launch was interrupted: requeue it)."""
    if not exit_data.get("started", True):
        return None
    if exit_data.get("spawn_error"):
        return Outcome.failed_to_spawn(str(exit_data["spawn_error"]))
    code, signum, reason = exit_data.get("exit_code"), exit_data.get("signal"), exit_data.get("reason", "")
    code = code if isinstance(code, int) else None
    signum = signum if isinstance(signum, int) else None
    if code == 0:
        return Outcome.succeeded()
    if reason == "timeout" and record.spec.time_limit is not None:
        return Outcome.timeout(record.spec.time_limit, signum)
    if reason == "cancel" or launch.cancel_by:
        return Outcome.cancelled(launch.cancel_by or "a signal to its supervisor", signum)
    diagnosis = log_reason(record.log)
    share = record.spec.mem_per_gpu
    if diagnosis == OOM and share is not None and record.spec.gpus and fenced:
        # A job that shares a GPU runs behind a fence at its share (daemon/fences.py): say it stopped there.
        asked = "auto" if record.spec.mem_auto else format_size(share)
        diagnosis = lifecycle.at_fence(format_size(share), asked)
    if signum is not None:
        return Outcome.killed(signum, diagnosis)
    if code is None:
        return Outcome.lost("its supervisor reported no exit status")
    return Outcome.failed(code, f"{diagnosis} (exit code {code})" if diagnosis else "")
