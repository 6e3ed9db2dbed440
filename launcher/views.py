"""What the read-only commands print: tables and key/value views over records and GPU snapshots."""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobs.model import JobRecord, JobState
from jobs.units import format_duration, format_size
from launcher.gpus import GpuSnapshot
from launcher.placement import Policy


def runtime(record: JobRecord, now: float) -> float | None:
    if record.started_at is None:
        return None
    return (record.ended_at or now) - record.started_at


def _ending(record: JobRecord) -> str:
    if record.state is JobState.SUCCEEDED:
        return "0"
    if record.state is JobState.PENDING:
        return record.reason
    if record.state is JobState.RUNNING:
        return ""
    return record.reason or (str(record.exit_code) if record.exit_code is not None else "")


def status_table(records: Sequence[JobRecord], now: float | None = None) -> str:
    now = time.time() if now is None else now
    header = ("ID", "NAME", "USER", "STATE", "GPUS", "MEM", "RUNTIME", "EXIT / REASON")
    rows = [
        (
            str(r.id), r.spec.display_name[:24], r.user, r.state.value,
            ",".join(map(str, r.gpus)) if r.gpus else ("-" if r.spec.gpus == 0 else f"({r.spec.gpus})"),
            format_size(r.spec.mem_per_gpu) if r.spec.mem_per_gpu else ("whole" if r.spec.gpus else "-"),
            format_duration(runtime(r, now)), _ending(r),
        )
        for r in records
    ]  # fmt: skip
    return _table(header, rows)


def show(record: JobRecord, now: float | None = None) -> str:
    now = time.time() if now is None else now
    spec = record.spec
    lines = [
        ("id", str(record.id)),
        ("name", spec.display_name),
        ("user", f"{record.user} (uid {record.uid})"),
        ("state", record.state.value),
        ("command", shlex.join(spec.command)),
        ("python", spec.python or "-"),
        ("cwd", spec.cwd),
        ("mode", spec.mode.value),
        ("priority", str(spec.priority)),
        ("gpus requested", str(spec.gpus)),
        ("memory per gpu", format_size(spec.mem_per_gpu) if spec.mem_per_gpu else "whole GPUs"),
        ("time limit", format_duration(spec.time_limit)),
        ("gpus", ",".join(map(str, record.gpus)) or "-"),
        ("gpu uuids", ",".join(record.gpu_uuids) or "-"),
        ("submitted", _when(record.submitted_at)),
        ("started", _when(record.started_at)),
        ("ended", _when(record.ended_at)),
        ("runtime", format_duration(runtime(record, now))),
        ("exit code", "-" if record.exit_code is None else str(record.exit_code)),
        ("signal", "-" if record.signal is None else str(record.signal)),
        ("reason", record.reason or "-"),
        ("peak gpu memory", format_size(record.peak_mem)),
        ("log", record.log),
    ]
    width = max(len(key) for key, _ in lines)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in lines)


def _when(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


@dataclass(frozen=True)
class GpuRow:
    index: int
    uuid: str
    name: str
    total: int
    external: int
    reserved: int
    free: int
    jobs: tuple[int, ...]
    state: str

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index, "uuid": self.uuid, "name": self.name, "total": self.total,
            "used_outside_gpuq": self.external, "reserved_by_gpuq": self.reserved, "free": self.free,
            "jobs": list(self.jobs), "state": self.state,
        }  # fmt: skip


def gpu_rows(
    snapshot: Sequence[GpuSnapshot], running: Sequence[JobRecord], ours: set[int], overhead: int = Policy().overhead
) -> list[GpuRow]:
    """Per GPU: what outside processes use, what gpuq reserved for its jobs, what is left, and who holds it.

    ``ours`` are the pids of gpuq's jobs, so their usage is not mistaken for a teammate's. A --mem job's
    reservation includes the per-process overhead placement adds for its CUDA context.
    """
    rows = []
    for gpu in snapshot:
        holders = [r for r in running if gpu.index in r.gpus]
        reserved = sum(gpu.total if r.spec.mem_per_gpu is None else r.spec.mem_per_gpu + overhead for r in holders)
        if gpu.processes is None:
            external = max(0, gpu.used - reserved)
        else:
            external = sum(used for pid, used in gpu.processes.items() if pid not in ours)
        free = max(0, gpu.total - max(gpu.used, reserved + external))
        rows.append(
            GpuRow(gpu.index, gpu.uuid, gpu.name, gpu.total, external, min(reserved, gpu.total), free,
                   tuple(r.id for r in holders), "lost: " + gpu.error if gpu.lost else "ok")
        )  # fmt: skip
    return rows


def gpu_table(rows: Sequence[GpuRow]) -> str:
    header = ("GPU", "NAME", "TOTAL", "OUTSIDE", "RESERVED", "FREE", "JOBS", "STATE", "UUID")
    body = [
        (
            str(r.index), r.name, format_size(r.total), format_size(r.external), format_size(r.reserved),
            format_size(r.free), ",".join(map(str, r.jobs)) or "-", r.state, r.uuid,
        )
        for r in rows
    ]  # fmt: skip
    return _table(header, body)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in [header, *rows]]
    return "\n".join(lines)
