"""GPU snapshots: what each GPU holds right now. The only module that imports NVML.

Two sources behave alike: real GPUs through NVML (``import pynvml``, from nvidia-ml-py), and the fake
inventory of ``GPUQ_FAKE_GPUS`` for machines without GPUs. The fake is either a spec (``4x80GiB``,
``2x24GiB,2x48GiB``) or the path of a JSON file re-read at every snapshot, so a test can play a
teammate filling a GPU or a GPU falling off the bus::

    {"gpus": [{"name": "A100", "total": "80GiB", "used": "30GiB"}, {"total": "80GiB", "lost": true}]}
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from jobs.errors import BadInput
from jobs.units import parse_size


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

    def outside_use(self, ours: set[int] | frozenset[int]) -> int:
        """Memory held by processes that are not gpuq's jobs (``ours``). When the driver hides who uses
        what, all of it: counting a job's own use twice wastes room, counting a teammate's as ours
        would over-commit the GPU. Placement and `gpuq gpus` both ask here, so they agree."""
        if self.processes is None:
            return self.used
        return sum(used for pid, used in self.processes.items() if pid not in ours)


class GpuSource(Protocol):
    def snapshot(self) -> list[GpuSnapshot]: ...

    def distance(self, a: int, b: int) -> int | None:
        """How far apart two GPUs are (0 = NVLink; larger = further over PCIe); None if unknown."""
        ...

    def close(self) -> None: ...


def open_source(environ: Mapping[str, str] | None = None) -> GpuSource:
    """The fake inventory when GPUQ_FAKE_GPUS is set, else NVML; no GPUs at all when NVML is absent."""
    environ = os.environ if environ is None else environ
    fake = environ.get("GPUQ_FAKE_GPUS", "").strip()
    if fake:
        return FakeGpus(fake)
    return NvmlGpus()


# -- the fake inventory ----------------------------------------------------------------------------------


_SPEC_PART = re.compile(r"^\s*(?:(\d+)\s*x\s*)?(\S+?)\s*$", re.IGNORECASE)


class FakeGpus:
    """GPUs that exist only on paper but behave: they hold memory, fill up, and get lost."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._path = Path(spec) if spec.endswith(".json") or os.path.sep in spec else None
        if self._path is None:
            self._fixed = parse_fake_spec(spec)
        else:
            self.snapshot()  # fail now, at start-up, if the file is unreadable

    def snapshot(self) -> list[GpuSnapshot]:
        if self._path is None:
            return list(self._fixed)
        try:
            data = json.loads(self._path.read_text())
        except (OSError, ValueError) as err:
            raise BadInput(f"GPUQ_FAKE_GPUS={self._path}: cannot read it ({err}); fix the JSON file") from None
        return parse_fake_json(data, str(self._path))

    def distance(self, a: int, b: int) -> int | None:
        return None

    def close(self) -> None:
        pass


TEAMMATE_PID = (1 << 22) + 1  # the fake's "used" memory: a process outside gpuq, past Linux's largest pid


def _fake(index: int, name: str, total: int, used: int = 0, lost: bool = False) -> GpuSnapshot:
    return GpuSnapshot(
        index=index, uuid=f"GPU-fake-{index:04d}", name=name, total=total, used=used,
        processes={TEAMMATE_PID: used} if used else {}, lost=lost,
        error="GPU lost (fake inventory)" if lost else "",
    )  # fmt: skip


def parse_fake_spec(spec: str) -> list[GpuSnapshot]:
    gpus: list[GpuSnapshot] = []
    for part in spec.split(","):
        match = _SPEC_PART.match(part)
        if not match:
            raise BadInput(f"GPUQ_FAKE_GPUS={spec!r}: write it like 4x80GiB or 2x24GiB,2x48GiB")
        count = int(match.group(1) or 1)
        try:
            total = parse_size(match.group(2))
        except BadInput as err:
            raise BadInput(f"GPUQ_FAKE_GPUS={spec!r}: {err}; write it like 4x80GiB or 2x24GiB,2x48GiB") from None
        gpus.extend(_fake(len(gpus), "Fake GPU", total) for _ in range(count))
    return gpus


def parse_fake_json(data: Any, where: str) -> list[GpuSnapshot]:
    items = data.get("gpus") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise BadInput(f'GPUQ_FAKE_GPUS={where}: expected a list of GPUs or {{"gpus": [...]}}')
    gpus = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or "total" not in item:
            raise BadInput(f'GPUQ_FAKE_GPUS={where}: GPU {index} needs at least a total, like {{"total": "80GiB"}}')
        total, used = _bytes(item["total"], where), _bytes(item.get("used", 0), where)
        gpus.append(_fake(index, str(item.get("name", "Fake GPU")), total, min(used, total), bool(item.get("lost"))))
    return gpus


def _bytes(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            return 0 if value.strip() in ("0", "") else parse_size(value)
        except BadInput as err:
            raise BadInput(f"GPUQ_FAKE_GPUS={where}: {err}") from None
    raise BadInput(f"GPUQ_FAKE_GPUS={where}: {value!r} is not a size")


# -- real GPUs through NVML ------------------------------------------------------------------------------


class NvmlGpus:
    """Real GPUs. An error on one GPU marks that GPU lost; it never stops the snapshot of the others."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            self._nvml: Any = None
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            self._nvml = None  # no driver: a CPU-only machine, zero GPUs
            return
        self._nvml = pynvml
        self._count = pynvml.nvmlDeviceGetCount()

    def snapshot(self) -> list[GpuSnapshot]:
        if self._nvml is None:
            return []
        return [self._one(index) for index in range(self._count)]

    def _one(self, index: int) -> GpuSnapshot:
        nvml = self._nvml
        uuid, name, total = f"GPU-unknown-{index}", "unknown", 0
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            name = _text(nvml.nvmlDeviceGetName(handle))
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            total = int(memory.total)
            return GpuSnapshot(index, uuid, name, total, int(memory.used), self._processes(handle))
        except nvml.NVMLError as err:
            return GpuSnapshot(index, uuid, name, total, total, None, lost=True, error=f"NVML: {err}")

    def _processes(self, handle: Any) -> dict[int, int] | None:
        try:
            found = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except self._nvml.NVMLError:
            return None
        usage: dict[int, int] = {}
        for process in found:
            used = process.usedGpuMemory
            if used is None:
                return None  # the driver hides per-process usage (some containers): attribute nothing
            usage[int(process.pid)] = usage.get(int(process.pid), 0) + int(used)
        return usage

    def distance(self, a: int, b: int) -> int | None:
        if self._nvml is None:
            return None
        nvml = self._nvml
        try:
            first, second = nvml.nvmlDeviceGetHandleByIndex(a), nvml.nvmlDeviceGetHandleByIndex(b)
            status = nvml.nvmlDeviceGetP2PStatus(first, second, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
            if status == nvml.NVML_P2P_STATUS_OK:
                return 0
            return int(nvml.nvmlDeviceGetTopologyCommonAncestor(first, second))
        except nvml.NVMLError:
            return None

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
