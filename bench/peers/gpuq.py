"""gpuq on fake GPUs (``GPUQ_FAKE_GPUS=4x80GiB``), with a private state directory and daemon; on the host's
real GPUs (NVML) where ``GPUQ_BENCH_REAL_GPUS=1`` is set (a lent GPU host: what NVML costs the dispatch).

"Held": ``gpuq pause``; released: ``gpuq unpause``. A batch is queued through the Python API (the same
spool files the CLI writes; only the CLI's start-up is skipped, and queueing is not timed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.peers.base import GPUS, ROOT, Tool, ToolError, clean_env, run


def binary() -> str | None:
    chosen = os.environ.get("GPUQ_BENCH_COMMAND")  # set by the harness to its regular install (install_regular)
    if chosen:
        return chosen
    here = Path(sys.executable).parent / "gpuq"
    return str(here) if here.exists() else shutil.which("gpuq")


def install_regular(work: Path) -> tuple[str | None, str]:
    """This checkout installed the way users get gpuq (``pip install .``, not editable), in a venv under
    ``work``: (its ``gpuq`` command, or None if that failed; what was installed, or why it failed).

    The development venv's install is editable: setuptools serves the jobs/ and launcher/ folders under
    ``gpuq_scheduler`` through an import hook that every Python start there loads (~8 ms on the 2-core VM,
    a third of a `gpuq submit`). The new venv sees this interpreter's packages (click, psutil, ...)
    through a path file, but not its .pth files, so not that hook.
    """
    venv = work / "gpuq-venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        return None, f"python -m venv failed: {made.stderr.strip()[-300:]}"
    why, wheels = "", work / "gpuq-wheel"
    for isolation in ([], ["--no-build-isolation"]):  # without an index (a lent GPU host), build with ours
        built = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(wheels), str(ROOT)],
            capture_output=True,
            text=True,
        )
        if built.returncode == 0:
            break
        why = f"pip wheel failed: {(built.stderr or built.stdout).strip()[-300:]}"
    else:
        return None, why
    wheel, python = next(wheels.glob("*.whl")), venv / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return None, f"pip install failed: {(done.stderr or done.stdout).strip()[-300:]}"
    site = next((venv / "lib").glob("python*/site-packages"))
    ours = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (site / "bench-deps.pth").write_text("".join(f"{p}\n" for p in ours))
    found = venv / "bin" / "gpuq"
    return (str(found), "regular (pip install ., in a venv of its own)") if found.exists() else (None, "no gpuq script")


class Gpuq(Tool):
    name = "gpuq"
    title = "gpuq"
    max_gpus_per_job = GPUS

    def __init__(self, work: Path, fake: str = f"{GPUS}x80GiB", command: str | None = None) -> None:
        super().__init__(work)
        found = command or binary()
        if found is None:
            raise ToolError("gpuq is not installed: pip install -e . (from the repository root)")
        self.binary = found
        self.home = work / "gpuq-home"
        self.fake = "" if os.environ.get("GPUQ_BENCH_REAL_GPUS") else fake
        self.env = clean_env({"GPUQ_HOME": str(self.home), "GPUQ_FAKE_GPUS": self.fake})
        # The settings passed through: costs with and without a cgroup, and cloned where the C library could spawn.
        for name in ("GPUQ_CONTAINMENT", "GPUQ_SPAWN", "GPUQ_FASTSTART_OFF"):
            if os.environ.get(name):
                self.env[name] = os.environ[name]
        self._up = False

    @property
    def python(self) -> str | None:
        """The interpreter the gpuq command runs on (its #! line): B times its bare start as the floor."""
        with open(self.binary, "rb") as script:
            first = script.readline()
        return first[2:].strip().decode() if first.startswith(b"#!") and b"python" in first else None

    def gpuq(self, *args: str, check: bool = True, timeout: float = 120.0) -> str:
        return run([self.binary, *args], self.env, check=check, timeout=timeout)

    def start(self) -> None:
        self.gpuq("daemon", "start")
        self._up = True

    def stop(self) -> None:
        if self._up:
            self.gpuq("daemon", "stop", check=False)
            self._up = False

    def daemon_pid(self) -> int:
        pid = int(self.home.joinpath("daemon.pid").read_text().strip())
        return pid

    def hold(self) -> None:
        self.gpuq("pause")

    def queue(self, jobs: Sequence[tuple[int, list[str]]], mem: str | None = None) -> None:
        from gpuq_scheduler.jobs.api import submit

        for gpus, argv in jobs:
            submit(argv, gpus=gpus, mem=mem, home=self.home)

    def release(self) -> None:
        self.gpuq("unpause")

    def wait_idle(self, timeout: float = 300.0) -> None:
        self.gpuq("wait", check=False, timeout=timeout)

    def submit_argv(self, gpus: int, argv: list[str]) -> list[str]:
        return [self.binary, "submit", "--gpus", str(gpus), *argv]

    def discard(self) -> None:
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
        self.start()

    def pending_count(self) -> int:
        import sqlite3

        db = self.home / "jobs.db"
        if not db.exists():
            return 0
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM jobs WHERE state='pending'").fetchone()[0])
        finally:
            conn.close()

    def version(self) -> str:
        def git(*args: str) -> str:
            try:
                return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
            except OSError:
                return ""

        commit = git("rev-parse", "--short", "HEAD") or "unknown"
        dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
        return f"gpuq {commit}{dirty}"
