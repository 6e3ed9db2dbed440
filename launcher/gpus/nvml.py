"""Real GPUs through NVML (``import pynvml``, from nvidia-ml-py): the only module that imports it."""

from __future__ import annotations

from typing import Any

from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot


class NvmlGpus:
    """Real GPUs. An error on one GPU marks that GPU lost; it never stops the snapshot of the others."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[Any, str, str]] = {}  # index -> handle, UUID, name: fixed while NVML is up
        self._links: dict[tuple[int, int], int] = {}  # (a, b) -> distance, as ``distance`` found it
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

    def snapshot(self, *, energy: bool = False, process_utilization: bool = False) -> list[GpuSnapshot]:
        if self._nvml is None:
            return []
        return [self._one(index, energy, process_utilization) for index in range(self._count)]

    def _one(self, index: int, energy: bool, process_utilization: bool) -> GpuSnapshot:
        nvml = self._nvml
        uuid, name, total = f"GPU-unknown-{index}", "unknown", 0
        try:
            handle, uuid, name = self._identity(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            total = int(memory.total)
            processes = self._processes(handle)
            return GpuSnapshot(
                index,
                uuid,
                name,
                total,
                int(memory.used),
                processes,
                utilization=self._busy(handle),
                process_utilization=self._busy_processes(handle) if process_utilization else None,
                energy=self._energy(handle) if energy else None,
            )
        except nvml.NVMLError as err:
            self._known.pop(index, None)  # asked afresh next time: a GPU back from a reset may have a new handle
            return GpuSnapshot(index, uuid, name, total, total, None, lost=True, error=f"NVML: {err}")

    def _identity(self, index: int) -> tuple[Any, str, str]:
        if index not in self._known:
            nvml = self._nvml
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            self._known[index] = handle, _text(nvml.nvmlDeviceGetUUID(handle)), _text(nvml.nvmlDeviceGetName(handle))
        return self._known[index]

    def _busy(self, handle: Any) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except self._nvml.NVMLError:
            return None  # not supported on this GPU (or under MIG): shown as unknown, nothing depends on it

    def _energy(self, handle: Any) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except self._nvml.NVMLError:
            return None  # before Volta, or not supported here: jobs are charged no energy

    def _busy_processes(self, handle: Any) -> dict[int, int] | None:
        """Each process's latest share of the GPU's time (SM utilisation), from NVML's recent samples. MPS
        clients have none: NVML files their work under the MPS server's pid (measured on H100)."""
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, 0)
        except self._nvml.NVMLError:
            return None  # no samples yet, or not supported here
        latest: dict[int, tuple[int, int]] = {}
        for sample in samples:
            pid, stamp = int(sample.pid), int(sample.timeStamp)
            if stamp >= latest.get(pid, (-1, 0))[0]:
                latest[pid] = (stamp, int(sample.smUtil))
        return {pid: util for pid, (_, util) in latest.items()}

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
        """Asked of the driver once per pair: the links between GPUs do not change while NVML is up, and
        placement asks for every pair of a multi-GPU job's candidates in each pass."""
        if self._nvml is None:
            return None
        if (a, b) not in self._links:
            nvml = self._nvml
            try:
                first, second = nvml.nvmlDeviceGetHandleByIndex(a), nvml.nvmlDeviceGetHandleByIndex(b)
                status = nvml.nvmlDeviceGetP2PStatus(first, second, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
                if status == nvml.NVML_P2P_STATUS_OK:
                    found = 0
                else:
                    found = int(nvml.nvmlDeviceGetTopologyCommonAncestor(first, second))
            except nvml.NVMLError:
                return None  # not kept: asked again next time
            self._links[(a, b)] = found
        return self._links[(a, b)]

    def close(self) -> None:
        """Shut NVML down once: a second close (a source shared by two schedulers, as the benches do) is a no-op."""
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            nvml.nvmlShutdown()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
