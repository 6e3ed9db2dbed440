"""GPU snapshots: what each GPU holds right now, and the source to ask.

Two sources behave alike: real GPUs through NVML (``gpus.nvml``, the only NVML import), and the fake
inventory of ``GPUQ_FAKE_GPUS`` for machines without GPUs (``gpus.fake``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU at one instant. ``used`` is all memory in use on the device (NVML's view), including
    gpuq's own jobs; ``processes`` maps pids to their usage when the driver tells (None when it can't)."""

    index: int
    uuid: str
    name: str
    total: int
    used: int
    processes: Mapping[int, int] | None = None
    lost: bool = False
    error: str = ""
    utilization: int | None = None  # percent of the last sample period a kernel ran (NVML); None: not known
    # The two below only where the snapshot was asked for them (``GpuSource.snapshot``); None: not read, or not known.
    process_utilization: Mapping[int, int] | None = None  # pid -> its share of the GPU's time, percent (NVML)
    energy: int | None = None  # millijoules the GPU has used since its driver loaded (NVML's counter)

    def outside_use(self, ours: set[int] | frozenset[int]) -> int:
        """Memory held by processes that are not gpuq's jobs (``ours``). When the driver hides who uses
        what, all of it: counting a job's own use twice wastes room, counting a teammate's as ours
        would over-commit the GPU. Placement and `gpuq gpus` both ask here, so they agree."""
        if self.processes is None:
            return self.used
        return sum(used for pid, used in self.processes.items() if pid not in ours)


class GpuSource(Protocol):
    def snapshot(self, *, energy: bool = False, process_utilization: bool = False) -> list[GpuSnapshot]:
        """Each GPU now: memory, processes, utilisation. ``energy`` and ``process_utilization`` read those
        fields too (None otherwise): NVML is slow to answer them on some GPUs (about 3 ms of CPU each, per GPU,
        on an H200, where the rest of a GPU's reading takes 0.03 ms; ``bench/nvml_cost.py``), so only a caller
        that uses them asks, and the daemon never before a pass's starts."""
        ...

    def distance(self, a: int, b: int) -> int | None:
        """How far apart two GPUs are (0 = NVLink; larger = further over PCIe); None if unknown."""
        ...

    def close(self) -> None: ...
