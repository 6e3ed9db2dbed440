"""What the harness needs from each tool, and the helpers the tools share.

A tool is set up in a private work directory (its own socket, state directory or config), so a run
never touches a system instance and several can coexist. Every method blocks until it is done.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
ROOT = BENCH.parent
JOB = BENCH / "job.sh"
GPUS = 4


class ToolError(RuntimeError):
    pass


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The harness's environment without any tool's own variables, plus ``extra``.

    PYTHONDONTWRITEBYTECODE goes too: with it every Python tool compiles its modules from source at
    every start (tens of ms more for each gpuq command here), which no installed tool does.
    """
    prefixes = ("GPUQ_", "TS_", "SLURM_", "BENCH_", "CUDA_VISIBLE_DEVICES", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(extra or {})
    return env


def run(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    check: bool = True,
    timeout: float = 120.0,
    stdin: int | None = subprocess.DEVNULL,
) -> str:
    proc = subprocess.run(list(argv), env=dict(env), stdin=stdin, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ToolError(f"`{' '.join(argv)}` failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def timed(argv: Sequence[str], env: Mapping[str, str], timeout: float = 120.0) -> float:
    """Seconds one command takes, as the user waiting for it feels it (it must succeed)."""
    started = time.perf_counter()
    proc = subprocess.run(
        list(argv),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=timeout,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise ToolError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.decode().strip()}")
    return elapsed


def wait_until(ready: object, timeout: float, what: str, poll: float = 0.02) -> None:
    assert callable(ready)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(poll)
    raise ToolError(f"timed out after {timeout:.0f}s waiting for {what}")


def job_argv(out: Path, seconds: float, gpus: int) -> list[str]:
    return [str(JOB), str(out), f"{seconds:g}", str(gpus)]


class Tool:
    """One queue under test. Subclasses fill these in; see bench/README.md for what each one does."""

    name = ""  # short key: tsp, sgs, slurm, gpuq
    title = ""  # how the table names it
    max_gpus_per_job = 1

    def __init__(self, work: Path) -> None:
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self.env: dict[str, str] = clean_env()

    # -- lifetime ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Bring the tool up, idle, with 4 GPUs (or slots) and nothing queued."""

    def stop(self) -> None:
        """Tear everything down; nothing of it may be left running."""

    def __enter__(self) -> Tool:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- a batch: queue everything while held, then release ----------------------------------------
    def hold(self) -> None:
        """Jobs submitted from now on queue but do not start."""

    def queue(self, jobs: Sequence[tuple[int, list[str]]]) -> None:
        """Queue (gpus, argv) jobs while held, the fastest way the tool offers (not timed)."""
        raise NotImplementedError

    def release(self) -> None:
        """Start what is queued."""

    def wait_idle(self, timeout: float = 300.0) -> None:
        """Block until nothing is queued or running."""

    # -- submit figures -----------------------------------------------------------------------------
    def submit_argv(self, gpus: int, argv: list[str]) -> list[str]:
        """The one command a user runs to submit one job."""
        raise NotImplementedError

    def discard(self) -> None:
        """Drop everything queued (after timing submits while held) and come back idle and released."""

    def submit_now(self, gpus: int, argv: list[str]) -> None:
        """Submit one job to the idle, released tool, the way a user would; returns when the submit has."""
        run(self.submit_argv(gpus, argv), self.env)

    def version(self) -> str:
        return "unknown"
