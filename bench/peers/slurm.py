"""Slurm, one node on loopback with a 4-GPU GRES (tests/slurm_local.py), tuned for short jobs.

Jobs are ``sbatch --gres=gpu:N --output=/dev/null job.sh ...``; Slurm sets CUDA_VISIBLE_DEVICES.
"Held": the partition is DOWN (jobs queue with reason PartitionDown); released: UP again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.peers.base import GPUS, Tool
from tests.slurm_local import LocalSlurm, version


class Slurm(Tool):
    name = "slurm"
    title = "Slurm, tuned"
    max_gpus_per_job = GPUS

    def __init__(self, work: Path, tuned: bool = True) -> None:
        super().__init__(work)
        self.tuned = tuned
        self.slurm: LocalSlurm | None = None

    def start(self) -> None:
        self.slurm = LocalSlurm(gpus=GPUS, tuned=self.tuned, root=self.work / "slurm").__enter__()
        self.env = {**self.env, "SLURM_CONF": str(self.slurm.conf)}

    def stop(self) -> None:
        if self.slurm is not None:
            self.slurm.__exit__(None, None, None)
            self.slurm = None

    def _live(self) -> LocalSlurm:
        assert self.slurm is not None, "Slurm is not started"
        return self.slurm

    def hold(self) -> None:
        self._live().hold_partition()

    def queue(self, jobs: Sequence[tuple[int, list[str]]]) -> None:
        for gpus, argv in jobs:
            self._live().sbatch(*self._args(gpus, argv))

    def release(self) -> None:
        self._live().release_partition()

    def wait_idle(self, timeout: float = 300.0) -> None:
        self._live().wait_empty(timeout=timeout)

    def submit_argv(self, gpus: int, argv: list[str]) -> list[str]:
        return ["sbatch", "--parsable", *self._args(gpus, argv)]

    def discard(self) -> None:
        slurm = self._live()
        slurm.run("scancel", "--quiet", f"--partition={slurm.partition}", check=False)
        slurm.wait_empty(timeout=120)
        slurm.release_partition()

    def version(self) -> str:
        return version() + (" (batch_sched_delay=0, Epilog=/bin/true)" if self.tuned else " (stock)")

    @staticmethod
    def _args(gpus: int, argv: list[str]) -> list[str]:
        return [f"--gres=gpu:{gpus}", "--output=/dev/null", "--job-name=bench", *argv]
