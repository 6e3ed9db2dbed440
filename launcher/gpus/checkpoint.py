"""Moving a process's GPU state into host memory and back: the driver's checkpoint API (libcuda, driver 570
and later) through ctypes, and a fake of it for the fake inventory.

Every call names another process by pid and acts on all of its CUDA state. ``state`` says where a process
stands (None: it holds no CUDA state, or is gone), so that a suspend or resume cut short by a crash can be
finished or undone from what the driver says, not from what a dead daemon meant to do.

Order (``launcher.daemon.suspension.suspender``): lock and checkpoint a process while it runs, and only then stop it;
restore and unlock it once it runs again. The driver does the work through a thread of its own inside the
target process: a process frozen before its lock makes the lock hang (CRIU's CUDA plugin met this, and locks
every process of a container before freezing it: checkpoint-restore/criu #2458, #2470).
"""

from __future__ import annotations

import ctypes
import enum
import json
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import Protocol


class CudaState(str, enum.Enum):
    """``CUprocessState``: what the driver says of a process."""

    RUNNING = "running"  # its CUDA calls go through
    LOCKED = "locked"  # its CUDA calls block; its state still on the GPU
    CHECKPOINTED = "checkpointed"  # its state in host memory, its GPU memory freed
    FAILED = "failed"  # a checkpoint or restore of it failed part way


NOT_SUPPORTED = 801  # CUDA_ERROR_NOT_SUPPORTED: what an MPS client's lock returns


class CheckpointError(Exception):
    def __init__(self, pid: int, call: str, code: int) -> None:
        self.pid, self.call, self.code = pid, call, code
        super().__init__(f"{call} of process {pid} failed with CUDA error {code}")

    @property
    def unsupported(self) -> bool:
        return self.code == NOT_SUPPORTED


class Checkpointer(Protocol):
    """The driver's checkpoint calls for one process each; every one raises CheckpointError on failure."""

    def state(self, pid: int) -> CudaState | None: ...
    def lock(self, pid: int) -> None: ...
    def checkpoint(self, pid: int) -> None: ...
    def restore(self, pid: int) -> None: ...
    def unlock(self, pid: int) -> None: ...
    def left(self, pids: Collection[int]) -> int | None:
        """Bytes the processes hold on the GPUs now (None: it cannot be said)."""
        ...


_STATES = {0: CudaState.RUNNING, 1: CudaState.LOCKED, 2: CudaState.CHECKPOINTED, 3: CudaState.FAILED}


class DriverCheckpoint:
    """The real calls, on libcuda.so.1 (``cuCheckpointProcess*``, each given a pid and a NULL argument struct)."""

    def __init__(self) -> None:
        self._cuda = ctypes.CDLL("libcuda.so.1")
        code = self._cuda.cuInit(0)
        if code != 0:
            raise CheckpointError(os.getpid(), "cuInit", code)
        for name in ("Lock", "Checkpoint", "Restore", "Unlock", "GetState"):
            if not hasattr(self._cuda, f"cuCheckpointProcess{name}"):
                raise CheckpointError(os.getpid(), f"cuCheckpointProcess{name} (driver 570 or later)", NOT_SUPPORTED)

    def state(self, pid: int) -> CudaState | None:
        value = ctypes.c_int(-1)
        code = self._cuda.cuCheckpointProcessGetState(ctypes.c_int(pid), ctypes.byref(value))
        return _STATES.get(value.value) if code == 0 else None  # not a CUDA process (or gone)

    def _call(self, name: str, pid: int) -> None:
        code = getattr(self._cuda, f"cuCheckpointProcess{name}")(ctypes.c_int(pid), None)
        if code != 0:
            raise CheckpointError(pid, f"cuCheckpointProcess{name}", code)

    def lock(self, pid: int) -> None:
        self._call("Lock", pid)

    def checkpoint(self, pid: int) -> None:
        self._call("Checkpoint", pid)

    def restore(self, pid: int) -> None:
        self._call("Restore", pid)

    def unlock(self, pid: int) -> None:
        self._call("Unlock", pid)

    def left(self, pids: Collection[int]) -> int | None:
        """As NVML sees them (opened here, only when asked: a fast path that left something to judge)."""
        from gpuq_scheduler.launcher.gpus.nvml import NvmlGpus

        gpus = NvmlGpus()
        try:
            found = gpus.snapshot()
        finally:
            gpus.close()
        if not found or any(gpu.lost or gpu.processes is None for gpu in found):
            return None  # a GPU it cannot read, or the driver hides who holds what: nothing to judge by
        return sum(used for gpu in found for pid, used in (gpu.processes or {}).items() if pid in pids)


class FakeCheckpoint:
    """The same calls for fake CUDA processes (tests/fixtures/fake_cuda.py), which say what they hold in
    ``usage``/<pid>.json: a lock marks it (a fake process makes no CUDA calls to block: freezing the job is
    what stops it), a checkpoint moves that file to <pid>.host (the fake GPU's memory is free, as the driver
    frees it), a restore moves it back, an unlock removes the mark. Its state is its files, so a crash in
    between leaves it readable, as the driver's is. A client of an MPS server (CUDA_MPS_PIPE_DIRECTORY in
    its environment) is refused as the driver refuses one."""

    def __init__(self, usage: str | os.PathLike[str] | None, seconds: float = 0.0) -> None:
        """``usage`` None: no fake process says what it holds (GPUQ_FAKE_USAGE unset), none is a CUDA one.
        ``seconds``: how long each checkpoint and restore takes (the driver's take seconds per 10 GB)."""
        self.usage = Path(usage) if usage else None
        self.seconds = seconds

    def _files(self, pid: int) -> tuple[Path, Path, Path]:
        usage = self.usage or Path("/nonexistent")
        return usage / f"{pid}.json", usage / f"{pid}.host", usage / f"{pid}.locked"

    def state(self, pid: int) -> CudaState | None:
        on_gpu, in_host, locked = self._files(pid)
        if self.usage is None or not _alive(pid):
            return None
        if in_host.exists():
            return CudaState.CHECKPOINTED
        if not on_gpu.exists():
            return None
        return CudaState.LOCKED if locked.exists() else CudaState.RUNNING

    def lock(self, pid: int) -> None:
        if self.state(pid) is not CudaState.RUNNING:
            raise CheckpointError(pid, "cuCheckpointProcessLock", 1)  # CUDA_ERROR_INVALID_VALUE
        if _mps_client(pid):
            raise CheckpointError(pid, "cuCheckpointProcessLock", NOT_SUPPORTED)
        self._files(pid)[2].touch()

    def checkpoint(self, pid: int) -> None:
        if self.state(pid) is not CudaState.LOCKED:
            raise CheckpointError(pid, "cuCheckpointProcessCheckpoint", 1)
        time.sleep(self.seconds)
        on_gpu, in_host, _ = self._files(pid)
        os.replace(on_gpu, in_host)

    def restore(self, pid: int) -> None:
        if self.state(pid) is not CudaState.CHECKPOINTED:
            raise CheckpointError(pid, "cuCheckpointProcessRestore", 1)
        time.sleep(self.seconds)
        on_gpu, in_host, _ = self._files(pid)
        os.replace(in_host, on_gpu)

    def unlock(self, pid: int) -> None:
        if self.state(pid) is not CudaState.LOCKED:
            raise CheckpointError(pid, "cuCheckpointProcessUnlock", 1)
        self._files(pid)[2].unlink()

    def left(self, pids: Collection[int]) -> int | None:
        total = 0
        for pid in pids:
            try:
                said = json.loads(self._files(pid)[0].read_text())
            except (OSError, ValueError):
                continue  # holds nothing on a GPU (or checkpointed: in host memory)
            total += sum(int(v) for k, v in said.items() if k != "busy")
        return total

    def held(self, pid: int) -> int:
        """Bytes the process holds on its GPU (or, checkpointed, in host memory)."""
        for path in self._files(pid)[:2]:
            try:
                return sum(int(v) for k, v in json.loads(path.read_text()).items() if k != "busy")
            except (OSError, ValueError, AttributeError):
                continue
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mps_client(pid: int) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(item.startswith(b"CUDA_MPS_PIPE_DIRECTORY=") for item in environ)
