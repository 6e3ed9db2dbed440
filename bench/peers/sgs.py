"""simple_gpu_scheduler (PyPI): reads shell commands on stdin, runs each with one GPU.

There is no queue to submit to: a "submit" is a line appended to the file (or pipe) it reads, so
the one-submit figure is a ``sh -c 'echo ... >> FILE'``. "Held" is the file before the scheduler
starts reading it; "released" is starting ``simple_gpu_scheduler --gpus 0 1 2 3 < FILE``, which exits
when the file is done. For an idle tool it runs with stdin on a pipe we write lines to.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from bench.peers.base import GPUS, Tool, ToolError


def binary() -> str | None:
    here = Path(sys.executable).parent / "simple_gpu_scheduler"
    return str(here) if here.exists() else shutil.which("simple_gpu_scheduler")


class SimpleGpuScheduler(Tool):
    name = "sgs"
    title = "simple_gpu_scheduler"
    max_gpus_per_job = 1

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        found = binary()
        if found is None:
            raise ToolError("simple_gpu_scheduler is not installed: pip install simple_gpu_scheduler")
        self.binary = found
        self.file = work / "jobs.txt"
        self.file.write_text("")
        self.proc: subprocess.Popen[bytes] | None = None
        self._live: subprocess.Popen[bytes] | None = None

    def _argv(self) -> list[str]:
        return [self.binary, "--gpus", *map(str, range(GPUS))]

    def stop(self) -> None:
        for proc in (self.proc, self._live):
            if proc is None:
                continue
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.proc = self._live = None

    def queue(self, jobs: Sequence[tuple[int, list[str]]]) -> None:
        if any(gpus != 1 for gpus, _ in jobs):
            raise ToolError("simple_gpu_scheduler gives each job exactly one GPU")
        with self.file.open("a") as handle:
            handle.writelines(shlex.join(argv) + "\n" for _, argv in jobs)

    def release(self) -> None:
        with self.file.open("rb") as jobs:
            self.proc = subprocess.Popen(self._argv(), stdin=jobs, stdout=subprocess.DEVNULL, env=self.env)

    def wait_idle(self, timeout: float = 300.0) -> None:
        if self.proc is not None:
            self.proc.wait(timeout=timeout)
            self.proc = None
            self.file.write_text("")

    def submit_argv(self, gpus: int, argv: list[str]) -> list[str]:
        line = shlex.join(argv)
        return ["sh", "-c", f"echo {shlex.quote(line)} >> {shlex.quote(str(self.file))}"]

    def discard(self) -> None:
        self.file.write_text("")

    def submit_now(self, gpus: int, argv: list[str]) -> None:
        """Write one line to a scheduler that is already up and reading its stdin."""
        if self._live is None:
            self._live = subprocess.Popen(self._argv(), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=self.env)
            time.sleep(1.0)  # let its interpreter start: we time an idle scheduler, not its start-up
        assert self._live.stdin is not None
        self._live.stdin.write((shlex.join(argv) + "\n").encode())
        self._live.stdin.flush()

    def version(self) -> str:
        try:
            return f"simple_gpu_scheduler {metadata.version('simple_gpu_scheduler')}"
        except metadata.PackageNotFoundError:
            return "unknown"
