"""A full disk never records a job that succeeded as "lost" (issue 25).

The state directory is a small tmpfs (root mounts it; skipped only where it cannot be made); the job itself
fills it, then exits 0. Its supervisor once died writing the exit file (ENOSPC), and the job was recorded
"lost" once there was room again. Now the exit file's space is reserved before the job starts.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Gpuq, make_env, wait_for


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "small"
    where.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )
    if not mounted:
        pytest.skip("needs root and a tmpfs mount to make a small disk")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _shim_alive(home: Path, job: int) -> bool:
    db = sqlite3.connect(f"file:{home / 'jobs.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT shim_pid FROM jobs WHERE id = ?", (job,)).fetchone()
    finally:
        db.close()
    if not row or not row[0]:
        return False
    try:
        os.kill(row[0], 0)
    except ProcessLookupError:
        return False
    return True


def test_a_job_that_fills_the_disk_and_succeeds_is_recorded_as_succeeded(small_disk: Path, tmp_path: Path) -> None:
    home = small_disk / "state"
    queue = Gpuq(home, make_env(home), tmp_path)
    go, filler = tmp_path / "go", small_disk / "filler"
    try:
        job = queue.submit(
            "--gpus",
            "0",
            "sh",
            "-c",
            f"while [ ! -e {go} ]; do sleep 0.1; done; cat /dev/zero > {filler} 2>/dev/null; exit 0",
        )
        queue.wait_state(job, "running")
        go.touch()
        exit_file = home / "run" / f"{job}.exit"
        wait_for(lambda: exit_file.exists() or not _shim_alive(home, job), 60, "the job's end to be written")
        assert exit_file.exists(), "the supervisor died writing the exit file on the full disk"
        filler.unlink()  # room again: the daemon records what the exit file says
        try:
            ended = queue.wait_state(job, "succeeded", "failed", "lost", timeout=60)
        except AssertionError:
            log = home / "daemon.log"
            raise AssertionError(log.read_text()[-3000:] if log.exists() else "no daemon log") from None
        assert ended["state"] == "succeeded", ended
    finally:
        filler.unlink(missing_ok=True)
        queue.cleanup()
