"""CUDA MPS control daemons that gpuq starts and stops: the driver-enforced fence for packed jobs.

A job that shares a GPU (``--mem``, one GPU) runs as a client of an MPS server on that GPU with
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` at its share: allocating past it fails with CUDA out of memory in
that job, whatever framework it uses, and its neighbours keep their memory. gpuq runs one control daemon
per GPU that holds such a job (``nvidia-cuda-mps-control -d`` with its own pipe and log directories under
``<state>/mps/<gpu uuid>/`` and ``CUDA_VISIBLE_DEVICES`` set to that GPU), and quits it once no packed job
is left there. A control daemon is an ordinary process: no device setting (compute mode, MIG, clocks) is
ever changed. One MPS server serves one Unix user at a time, so a GPU whose server runs alice's jobs takes
only alice's packed jobs until they end (placement is told, ``GpuView.fenced_for``).

``FakeMps`` does the same bookkeeping without a driver for the fake inventory: a job gets the same
environment, and a test program that allocates past its limit fails as CUDA would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from gpuq_scheduler.jobs.store.statedir import read_bytes

CONTROL = "nvidia-cuda-mps-control"
MiB = 1 << 20


class Mps:
    """Per-GPU MPS control daemons under ``root`` (``<state>/mps``)."""

    fake = False

    def __init__(self, root: Path, binary: str | None = None) -> None:
        self.root = root
        self.binary = binary if binary is not None else shutil.which(CONTROL)

    @property
    def available(self) -> bool:
        return self.binary is not None

    def pipe(self, uuid: str) -> Path:
        return self.root / uuid / "pipe"

    def logs(self, uuid: str) -> Path:
        return self.root / uuid / "log"

    def client_env(self, uuid: str, limit: int) -> dict[str, str]:
        """What a job on GPU ``uuid`` needs to be a client held to ``limit`` bytes: the server's pipe, the
        limit on its device 0 (the job sees only its own GPU), and that GPU named by UUID: a client counts
        devices among its server's (this server has one), where an index would count the machine's."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe(uuid)), "CUDA_MPS_LOG_DIRECTORY": str(self.logs(uuid)),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={max(limit // MiB, 1)}M", "CUDA_VISIBLE_DEVICES": uuid,
        }  # fmt: skip

    def running(self) -> list[str]:
        """The GPUs (uuids) that have a control daemon of ours, from their directories: a daemon that
        restarts finds the ones an earlier daemon left."""
        try:
            return sorted(entry.name for entry in self.root.iterdir() if (entry / "pipe").is_dir())
        except FileNotFoundError:
            return []

    def start(self, uuid: str) -> str | None:
        """Start the control daemon of GPU ``uuid``; None when it runs, else why it could not start."""
        if self.binary is None:
            return f"{CONTROL} is not installed"
        pipe, logs = self.pipe(uuid), self.logs(uuid)
        pipe.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        # Clients of any user must reach the pipe (a shared queue runs jobs as their submitters).
        for folder in (self.root, self.root / uuid, pipe, logs):
            folder.chmod(0o755)
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs),
               "CUDA_VISIBLE_DEVICES": uuid}  # fmt: skip
        try:
            done = subprocess.run([self.binary, "-d"], env=env, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as err:
            self._forget(uuid)
            return f"{CONTROL} -d failed: {err}"
        if done.returncode != 0:
            self._forget(uuid)
            return f"{CONTROL} -d exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}"
        return None

    def stop(self, uuid: str) -> None:
        """Quit the control daemon of GPU ``uuid`` (it stops its server first) and forget its directories."""
        if self.binary is not None and self.pipe(uuid).is_dir():
            env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe(uuid)),
                   "CUDA_MPS_LOG_DIRECTORY": str(self.logs(uuid))}  # fmt: skip
            # Gone already, or wedged: its directory goes, and a later start makes a new one.
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run([self.binary], input="quit\n", env=env, capture_output=True, text=True, timeout=30)
        self._forget(uuid)

    def _forget(self, uuid: str) -> None:
        shutil.rmtree(self.root / uuid, ignore_errors=True)


class FakeMps(Mps):
    """MPS for the fake inventory: the directories and the clients' environment, no driver and no process.
    A fake control daemon "runs" while its pipe directory exists, so tests can see it started and quit."""

    fake = True

    def __init__(self, root: Path) -> None:
        super().__init__(root, binary="fake")

    def start(self, uuid: str) -> str | None:
        self.pipe(uuid).mkdir(parents=True, exist_ok=True)
        self.logs(uuid).mkdir(parents=True, exist_ok=True)
        return None

    def stop(self, uuid: str) -> None:
        self._forget(uuid)


SERVER = b"nvidia-cuda-mps-server"
PIPE = b"CUDA_MPS_PIPE_DIRECTORY="


def server_pids(root: Path, candidates: Iterable[int]) -> set[int]:
    """Those of ``candidates`` (pids NVML lists on a GPU) that are MPS servers of control daemons under
    ``root``: their memory is held for gpuq's fence, not by a teammate. Known by their command and the
    pipe directory in their environment or their parent's (the control daemon gpuq started with it); a
    process of another user whose environment cannot be read is not claimed."""
    prefix = PIPE + os.fsencode(root) + b"/"
    found = set()
    for pid in candidates:
        try:
            if os.path.basename(read_bytes(f"/proc/{pid}/cmdline").split(b"\0")[0]) != SERVER:
                continue
            parent = read_bytes(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[1].decode()
        except (OSError, IndexError):
            continue
        for owner in (str(pid), parent):
            try:
                if any(e.startswith(prefix) for e in read_bytes(f"/proc/{owner}/environ").split(b"\0")):
                    found.add(pid)
                    break
            except OSError:
                continue
    return found


def for_gpus(root: Path, fake_gpus: bool, environ: Mapping[str, str]) -> Mps | None:
    """MPS for packed jobs: on real GPUs when its control program is installed, on the fake inventory only
    when asked (``GPUQ_FAKE_MPS=1``). None: no MPS here (the fence is cooperative)."""
    if fake_gpus:
        return FakeMps(root) if environ.get("GPUQ_FAKE_MPS") == "1" else None
    mps = Mps(root)
    return mps if mps.available else None
