"""`gpuq gpus` and the live views' GPU rows: per GPU, what outside processes use, what gpuq reserved for
its jobs, what is left, and who holds it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.units import format_size
from gpuq_scheduler.launcher.views.tables import _table

if TYPE_CHECKING:
    from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot


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
    fence: str = "-"  # what holds a job that shares this GPU to its share: mps, cooperative or none

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "total": self.total,
            "used_outside_gpuq": self.external,
            "reserved_by_gpuq": self.reserved,
            "free": self.free,
            "jobs": list(self.jobs),
            "state": self.state,
            "fence": self.fence,
        }


def gpu_rows(
    snapshot: Sequence[GpuSnapshot],
    running: Sequence[JobRecord],
    ours: set[int],
    overhead: int | None = None,
    fences: Mapping[int, str] | None = None,
) -> list[GpuRow]:
    """Per GPU: what outside processes use, what gpuq reserved for its jobs, what is left, and who holds it.

    ``ours`` are the pids of gpuq's jobs, so their usage is not mistaken for a teammate's. A --mem job's
    reservation includes the per-process overhead placement adds for its CUDA context (None: the default).
    """
    if overhead is None:
        from gpuq_scheduler.launcher.policy.placement import Policy

        overhead = Policy().overhead
    rows = []
    for gpu in snapshot:
        holders = [r for r in running if gpu.index in r.gpus]
        reserved = sum(gpu.total if r.spec.mem_per_gpu is None else r.spec.mem_per_gpu + overhead for r in holders)
        external = gpu.outside_use(ours)
        free = max(0, gpu.total - max(gpu.used, reserved + external))
        rows.append(
            GpuRow(
                gpu.index,
                gpu.uuid,
                gpu.name,
                gpu.total,
                external,
                min(reserved, gpu.total),
                free,
                tuple(r.id for r in holders),
                "lost: " + gpu.error if gpu.lost else "ok",
                (fences or {}).get(gpu.index, "-"),
            )
        )
    return rows


def gpu_table(rows: Sequence[GpuRow]) -> str:
    header = ("GPU", "NAME", "TOTAL", "OUTSIDE", "RESERVED", "FREE", "JOBS", "FENCE", "STATE", "UUID")
    body = [
        (
            str(r.index),
            r.name,
            format_size(r.total),
            format_size(r.external),
            format_size(r.reserved),
            format_size(r.free),
            ",".join(map(str, r.jobs)) or "-",
            r.fence,
            r.state,
            r.uuid,
        )
        for r in rows
    ]
    return _table(header, body)
