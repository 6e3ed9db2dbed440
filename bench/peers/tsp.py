"""task-spooler (Debian's ``task-spooler``, command ``tsp``): 4 slots stand for 4 GPUs.

Each queued job keeps its submitting ``tsp`` client waiting (it is the process that will run the job),
with one server connection each; ``TS_MAXCONN`` (default 1000) is raised so that 1000 jobs queued
while held do not block the next submit.

This build has no GPU mode, so a job picks its GPU ids itself: bench/job.sh takes free per-GPU flock
locks (``BENCH_GPU_LOCKS``) before it stamps its start, so that picking counts as dispatch time. A
2-GPU job asks tsp for 2 slots (``-N 2``) and takes 2 locks. "Held": a blocker job holding all 4
slots that waits on a FIFO; writing to the FIFO releases it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from bench.peers.base import GPUS, Tool, ToolError, clean_env, run, wait_until


class TaskSpooler(Tool):
    name = "tsp"
    title = "task-spooler"
    max_gpus_per_job = GPUS

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        self.binary = shutil.which("tsp") or "tsp"
        locks = work / "gpu-locks"
        locks.mkdir(exist_ok=True)
        self.env = clean_env(
            {
                "TS_SOCKET": str(work / "tsp.socket"),
                "TMPDIR": str(work),
                "TS_SLOTS": str(GPUS),
                "TS_MAXFINISHED": "100000",
                "TS_MAXCONN": "5000",
                "BENCH_GPU_LOCKS": str(locks),
                "BENCH_GPU_COUNT": str(GPUS),
            }
        )
        self.fifo = work / "release.fifo"
        self._started = False
        self._generation = 0

    def tsp(self, *args: str, check: bool = True) -> str:
        return run([self.binary, *args], self.env, check=check)

    def start(self) -> None:
        self.tsp("-S", str(GPUS))  # starts the server, with 4 slots
        self._started = True
        if self.tsp("-S").strip() != str(GPUS):
            raise ToolError("tsp did not take 4 slots")

    def stop(self) -> None:
        if self._started:
            self.tsp("-K", check=False)  # queued jobs go with the server
            self._started = False
        self._unblock()

    def _unblock(self) -> None:
        """Let a blocker still waiting on the FIFO go, so that nothing of ours is left behind."""
        if not self.fifo.exists():
            return
        try:
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # nobody is reading it
        try:
            os.write(fd, b"go\n")
        finally:
            os.close(fd)

    def hold(self) -> None:
        if not self.fifo.exists():
            os.mkfifo(self.fifo)
        self.tsp("-n", "-N", str(GPUS), "sh", "-c", f"read x < '{self.fifo}'")
        wait_until(lambda: self.tsp("-s").strip() == "running", 10, "the tsp blocker to run")

    def queue(self, jobs: Sequence[tuple[int, list[str]]]) -> None:
        for gpus, argv in jobs:
            self.tsp(*self._args(gpus, argv))

    def release(self) -> None:
        with open(self.fifo, "w") as fifo:  # blocks until the blocker reads: it is already running
            fifo.write("go\n")

    def wait_idle(self, timeout: float = 300.0) -> None:
        def idle() -> bool:
            lines = self.tsp("-l").splitlines()[1:]
            return not any(line.split()[1] in ("running", "queued", "allocating") for line in lines if line.split())

        wait_until(idle, timeout, "tsp to finish its queue", poll=0.05)

    def submit_argv(self, gpus: int, argv: list[str]) -> list[str]:
        return [self.binary, *self._args(gpus, argv)]

    def discard(self) -> None:
        self.stop()
        self._generation += 1  # a fresh server on a fresh socket: the old one may still be going away
        self.env["TS_SOCKET"] = str(self.work / f"tsp-{self._generation}.socket")
        self.start()

    def version(self) -> str:
        first = run([self.binary, "-V"], self.env, check=False).splitlines()
        return first[0].strip() if first else "unknown"

    @staticmethod
    def _args(gpus: int, argv: list[str]) -> list[str]:
        return ["-n", *(["-N", str(gpus)] if gpus > 1 else []), *argv]
