"""Shared fixtures: a real state directory (with a space in its path), fake GPUs, and the real CLI."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLICK = [sys.executable, "-m", "gpuq_scheduler.launcher.cli.app"]  # `gpuq` straight to click, no quick path
FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPORT = FIXTURES / "report.py"
UNIT = Path(__file__).resolve().parent / "unit"


# Two tiers, by folder (docs/development.md). tests/unit/ is the unit tier: no torch, root, browser, Slurm, tmux
# or GPU, about a minute on a 2-core machine (`pytest tests/unit`). Every other module under tests/ is the system
# tier (real daemons, Unix users, browsers, clusters, GPUs) and is marked `slow` here, so `pytest -m "not slow"`
# selects the unit tier as well. A module's tier is the folder it is put in; no list to keep.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if UNIT not in item.path.parents or item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.slow)


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll with a deadline instead of sleeping a fixed time."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


@dataclass
class Gpuq:
    """The real `gpuq` command against one state directory."""

    home: Path
    env: dict[str, str]
    cwd: Path
    entry: str = "gpuq_scheduler.launcher.cli.entry"  # the `gpuq` script; "gpuq_scheduler.launcher.cli.app" is click

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", self.entry, *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"gpuq {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
        return result

    def submit(self, *args: str) -> int:
        return int(json.loads(self.run("submit", "--json", *args).stdout)["id"])

    def status(self) -> list[dict[str, Any]]:
        return list(json.loads(self.run("status", "--all", "--json").stdout))

    def job(self, job_id: int) -> dict[str, Any]:
        return dict(json.loads(self.run("show", "--json", str(job_id)).stdout))

    def wait_state(self, job_id: int, *states: str, timeout: float = 60) -> dict[str, Any]:
        """The job once it is in one of ``states``. A job not known yet, or a queue not made yet, is waited
        for too: another process (`gpuq run`, a client under test) may still be starting when the test asks."""

        def reached() -> dict[str, Any] | None:
            shown = self.run("show", "--json", str(job_id), check=False)
            not_yet = (f"no job {job_id} ", "is not a gpuq state directory")
            if shown.returncode != 0 and any(words in shown.stderr for words in not_yet):
                return None
            if shown.returncode != 0:
                raise AssertionError(f"gpuq show {job_id} exited {shown.returncode}: {shown.stderr}")
            job = dict(json.loads(shown.stdout))
            return job if job["state"] in states else None

        return dict(wait_for(reached, timeout, f"job {job_id} {states}"))

    def events(self, job: int | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """events.jsonl as it is now (none yet: empty), only ``job``'s and only of ``kind`` where given."""
        path = self.home / "events.jsonl"
        found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        return [e for e in found if (job is None or e.get("job") == job) and (kind is None or e.get("event") == kind)]

    def daemon_pid(self) -> int | None:
        info = json.loads(self.run("daemon", "status", "--json").stdout)
        return info["pid"] if info["running"] else None

    def wait_exit_file(self, job_id: int, timeout: float = 60) -> None:
        """Until the job's shim wrote its exit file: the job ended, whether or not a daemon runs to see it."""
        exit_file = self.home / "run" / f"{job_id}.exit"
        wait_for(exit_file.exists, timeout, f"job {job_id}'s exit file")

    def kill_daemon(self) -> None:
        pid = self.daemon_pid()
        if pid:
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: self.daemon_pid() is None, 10, "the daemon to die")

    def cleanup(self) -> None:
        """Stop the daemon and every job it left, so tests never leak processes."""
        with contextlib.suppress(Exception):
            self.run("daemon", "stop", check=False, timeout=30)
        with contextlib.suppress(Exception):  # a daemon that did not stop in time must not outlive the test
            os.kill(int((self.home / "daemon.pid").read_text()), signal.SIGKILL)
        run = self.home / "run"
        if run.is_dir():
            for pid_file in run.glob("*.pid"):
                with contextlib.suppress(Exception):
                    os.killpg(json.loads(pid_file.read_text())["pid"], signal.SIGKILL)
        with contextlib.suppress(Exception):  # what jobs left in their cgroups (setsid children...), then the cgroups
            group = Path(json.loads((self.home / "gpus.json").read_text())["containment"]["group"])
            for job in group.glob("job-*"):
                (job / "cgroup.kill").write_text("1")
                wait_for(lambda job=job: "populated 0" in (job / "cgroup.events").read_text(), 10, f"{job} to empty")
                job.rmdir()
            group.rmdir()
        # The fake MPS control daemons its packed jobs were clients of: a daemon stopped with jobs running leaves
        # them for its successor (launcher/gpus/fake_mps.py writes each one's pid there).
        for pid_file in (self.home / "mps").rglob("control.pid") if (self.home / "mps").is_dir() else []:
            with contextlib.suppress(Exception):
                pid = int(pid_file.read_text())
                if b"fake_mps" in Path(f"/proc/{pid}/cmdline").read_bytes():  # not a pid reused since
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            import sqlite3

            db = sqlite3.connect(self.home / "jobs.db")
            for (pid,) in db.execute("SELECT shim_pid FROM jobs WHERE state='running'"):
                with contextlib.suppress(Exception):
                    os.kill(pid, signal.SIGKILL)
            db.close()


def counted(path: Path) -> list[int]:
    """The numbers a counting job (tests/fixtures/fake_counter.py) has written so far, one a line."""
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def make_env(home: Path, fake: str | None = "4x80GiB", **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env["GPUQ_HOME"] = str(home)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["GPUQ_KILL_GRACE"] = "2"
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", os.defpath)  # `.py` jobs run with this interpreter
    if fake is not None:
        env["GPUQ_FAKE_GPUS"] = fake
    env.update(extra)
    return env


@pytest.fixture
def gpuq(tmp_path: Path) -> Iterator[Gpuq]:
    home = tmp_path / "state dir 'quoted'"
    work = tmp_path / "work dir"
    work.mkdir()
    client = Gpuq(home, make_env(home), work)
    yield client
    client.cleanup()


@pytest.fixture
def one_gpu(tmp_path: Path) -> Iterator[Gpuq]:
    """A queue with one fake GPU: every job after the first waits for the one before it."""
    home = tmp_path / "state"
    work = tmp_path / "work"
    work.mkdir()
    client = Gpuq(home, make_env(home, fake="1x80GiB"), work)
    yield client
    client.cleanup()


def nvml_gpu_count() -> int:
    """How many NVIDIA GPUs NVML sees here (0 without a driver): the GPU tests skip where it is 0."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: a machine without GPUs
        return 0


def read_reports(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


FAKE_CUDA = Path(__file__).parent / "fixtures" / "fake_cuda.py"
# Three fake GPUs as tests of the views see them: a teammate's 10 GiB on GPU 0, a busy GPU 1, a lost GPU 2.
THREE_GPUS: list[dict[str, Any]] = [
    {"name": "H100", "total": "80GiB", "used": "10GiB", "util": 35},
    {"name": "H100", "total": "80GiB", "util": 80},
    {"total": "80GiB", "lost": True},
]


def fake_cuda_queue(tmp_path: Path, gpus: str | list[dict[str, Any]], **extra: str) -> Gpuq:
    """A queue whose jobs can run tests/fixtures/fake_cuda.py (copied into its work directory), which holds
    memory where the fake NVML sees it (GPUQ_FAKE_USAGE). ``gpus``: a spec like 2x80GiB, or the JSON
    inventory's list of GPUs."""
    home, work, usage = tmp_path / "state dir", tmp_path / "work dir", tmp_path / "usage"
    work.mkdir(parents=True)
    usage.mkdir()
    shutil.copy(FAKE_CUDA, work / "fake_cuda.py")
    if not isinstance(gpus, str):
        inventory = tmp_path / "gpus.json"
        inventory.write_text(json.dumps({"gpus": gpus}))
        gpus = str(inventory)
    return Gpuq(home, make_env(home, gpus, GPUQ_FAKE_USAGE=str(usage), **extra), work)
