"""Durations follow the monotonic clock (STYLE.md 12): a jump of the wall clock (NTP, a resumed VM, an admin's
`date -s`) changes no job's outcome. The wall clock is moved for the daemon and its shims through their
test hook (``launcher.daemon.testclock``): the real clock of a shared machine is not a test's to move."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpuq_scheduler.launcher.daemon.testclock import ENV
from tests.conftest import Gpuq, fake_cuda_queue, make_env, wait_for

JUMP = 90 * 60.0


def test_a_wall_clock_jump_does_not_end_a_job_as_timeout(tmp_path: Path) -> None:
    """+90 min of wall time once killed a 1 h job as "timeout" within seconds."""
    offset = tmp_path / "offset"
    offset.write_text("0")
    home = tmp_path / "state"
    queue = Gpuq(home, make_env(home, **{ENV: str(offset)}), tmp_path)
    try:
        marker = tmp_path / "go"
        script = f"while [ ! -e {marker} ]; do echo tick; sleep 0.2; done; echo done"
        job = queue.submit("--gpus", "0", "--time", "1h", "sh", "-c", script)
        queue.wait_state(job, "running")
        wait_for(lambda: "tick" in Path(queue.job(job)["log"]).read_text(), 20, "the job's output")
        offset.write_text(str(JUMP))
        # The shim wakes at each line of output and compares the time: let it see the jump several times.
        log = Path(queue.job(job)["log"])
        seen = log.read_text().count("tick")
        wait_for(lambda: log.read_text().count("tick") >= seen + 10, 30, "ten more lines after the jump")
        marker.touch()
        ended = queue.wait_state(job, "succeeded", "timeout", "failed", "lost")
        assert ended["state"] == "succeeded", ended
    finally:
        queue.cleanup()


def test_a_wall_clock_jump_does_not_release_an_allocation_as_idle(tmp_path: Path) -> None:
    """+90 min of wall time once released, as idle for 90 minutes, an allocation that had been idle for seconds."""
    offset = tmp_path / "offset"
    offset.write_text("0")
    queue = fake_cuda_queue(tmp_path, "1x80GiB", GPUQ_IDLE_LIMIT="1h", **{ENV: str(offset)})
    try:
        command = [sys.executable, "-m", queue.entry, "run", sys.executable, "fake_cuda.py", "1", "20", "--busy", "0"]
        run = subprocess.Popen(command, env=queue.env, cwd=queue.cwd, stderr=subprocess.PIPE, text=True)
        queue.wait_state(1, "running")
        offset.write_text(str(JUMP))
        # Its GPU does no work, but for seconds, not 90 minutes: it keeps running, and is not even called idle.
        events = queue.home / "events.jsonl"
        wait_for(lambda: queue.job(1)["state"] != "running" or run.poll() is not None, 60, "the program to end")
        assert not any(e.get("event") == "idle-released" for e in map(json.loads, events.open()))
        assert queue.wait_state(1, "succeeded", "failed", "cancelled")["state"] == "succeeded", run.stderr
    finally:
        queue.cleanup()
