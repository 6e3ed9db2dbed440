"""GPU memory held outside gpuq, named (#42): the fake inventory lists live processes on its GPUs as NVML would;
`gpuq gpus`, `gpuq status` and the dashboard name their user and pid (a desktop's own apart), never one of
gpuq's jobs; the admin's command runs once for each new one that is not a desktop's."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Gpuq, fake_cuda_queue, wait_for

# A process named as the X server is (its /proc/PID/comm), as a desktop's would be.
XORG = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'Xorg', 0, 0, 0); time.sleep(600)"


@pytest.fixture
def strangers() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    teammate = subprocess.Popen(["sleep", "600"])
    desktop = subprocess.Popen([sys.executable, "-c", XORG])
    wait_for(lambda: Path(f"/proc/{desktop.pid}/comm").read_text().strip() == "Xorg", 10, "the desktop's name")
    yield teammate, desktop
    for process in (teammate, desktop):
        process.kill()
        process.wait()


def _queue(tmp_path: Path, teammate: int, desktop: int, told: Path) -> Gpuq:
    gpus = [
        {"total": "80GiB", "processes": [{"pid": teammate, "used": "2GiB"}]},
        {"total": "80GiB", "processes": [{"pid": desktop, "used": "64MiB"}]},
    ]
    fields = "$GPUQ_OUTSIDE_USER $GPUQ_OUTSIDE_PID $GPUQ_OUTSIDE_NAME $GPUQ_OUTSIDE_GPU $GPUQ_OUTSIDE_BYTES"
    notify = f'echo "{fields}" >> "{told}"'
    return fake_cuda_queue(tmp_path, gpus, GPUQ_OUTSIDE_NOTIFY=notify)


def test_memory_held_outside_gpuq_is_named_and_its_holder_told_once(
    tmp_path: Path, strangers: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]
) -> None:
    teammate, desktop = strangers
    told = tmp_path / "told.txt"
    queue = _queue(tmp_path, teammate.pid, desktop.pid, told)
    me = getpass.getuser()
    try:
        job = queue.submit("fake_cuda.py", "5", "600")  # gpuq's own: never named as outside
        queue.wait_state(job, "running")
        wait_for(lambda: queue.job(job)["peak_mem"], 30, "the job's memory seen")
        shown = queue.run("gpus").stdout
        assert f"outside gpuq: GPU 0: {me} (pid {teammate.pid} sleep, 2.0G)" in shown
        assert f"desktop (outside gpuq): GPU 1: {me} (pid {desktop.pid} Xorg, 64.0M)" in shown
        assert "fake_cuda" not in shown and "python" not in shown
        rows = json.loads(queue.run("gpus", "--json").stdout)
        assert rows[0]["outside"] == [{"gpu": 0, "pid": teammate.pid, "user": me, "name": "sleep", "used": 2 << 30}]
        assert [h["name"] for h in rows[1]["outside"]] == ["Xorg"]
        said = wait_for(lambda: "outside gpuq: " in (e := queue.run("status").stderr) and e, 30, "status naming it")
        assert f"GPU 0: {me} (pid {teammate.pid} sleep, 2.0G)" in said and "Xorg" in said
        wait_for(told.exists, 30, "the admin's command")
        assert told.read_text() == f"{me} {teammate.pid} sleep 0 {2 << 30}\n"  # the desktop is nobody's to chase
        from gpuq_scheduler.jobs.store.queue import Queue
        from gpuq_scheduler.jobs.store.statedir import StateDir
        from gpuq_scheduler.launcher.gpus.sources import open_source
        from gpuq_scheduler.launcher.views import live
        from gpuq_scheduler.launcher.views.serve import Dashboard

        source = open_source(queue.env)
        try:
            state = Queue(StateDir(queue.home))
            page = Dashboard(state, source).page(live.take(state, source))
        finally:
            source.close()
        assert f"outside gpuq: GPU 0: {me} (pid {teammate.pid} sleep, 2.0G)" in page
        # Gone: no longer listed, as the driver lists no process that ended.
        teammate.kill()
        teammate.wait()
        wait_for(lambda: "sleep" not in queue.run("gpus").stdout, 30, "the teammate gone")
        assert told.read_text().count("\n") == 1  # told once, not at every look
    finally:
        queue.cleanup()
