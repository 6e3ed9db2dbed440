"""MPS control daemons started and quit beside the scheduling pass (launcher/daemon/controls.py), on the fake
MPS (launcher/gpus/fake_mps.py: a real detached process per control daemon, which the tests make wedge or
fail as a real one can, with files in <state>/mps). One control daemon per (GPU, user); here one user."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import Gpuq, fake_cuda_queue, wait_for

GiB = 1 << 30
DONE = ("succeeded", "failed", "cancelled", "timeout", "lost")


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[Gpuq]:
    client = fake_cuda_queue(
        tmp_path, "2x80GiB", GPUQ_FAKE_MPS="1", GPUQ_MPS_TIMEOUT="2", GPUQ_MPS_RETRY="1", GPUQ_RETRY_BACKOFF="0.2"
    )
    client.run("daemon", "start")
    (client.home / "mps").mkdir(exist_ok=True)
    yield client
    for switch in (client.home / "mps").glob("fake-*"):
        switch.unlink()
    client.cleanup()
    for pid_file in (client.home / "mps").glob("*/*/pipe/control.pid"):  # a control daemon a test left wedged
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), 9)


def _folders(gpuq: Gpuq) -> list[Path]:
    return sorted((gpuq.home / "mps").glob("GPU-*/*/pipe"))


def _control_pid(pipe: Path) -> int | None:
    try:
        pid = int((pipe / "control.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def test_a_wedged_control_daemon_stalls_no_placement_and_its_job_gets_the_cooperative_fence(mps: Gpuq) -> None:
    """Its `-d` hangs for as long as this test wants (a deadline far beyond it), so that "still waiting after
    the others ended" holds by construction, not because they ended within a deadline; then `-d` dies."""
    mps.run("daemon", "stop")
    mps.env["GPUQ_MPS_TIMEOUT"] = "3600"
    mps.run("daemon", "start")
    (mps.home / "mps" / "fake-wedge-start").write_text("")
    packed = mps.submit("--mem", "4G", "fake_cuda.py", "1", "1")
    wait_for(lambda: mps.job(packed)["reason"].startswith("waiting for its MPS fence on GPU"), 10, "its reason")
    hung = wait_for(lambda: _wedged_start(mps), 10, "the hung `-d`")
    # Meanwhile the queue goes on: a whole-GPU job and a CPU job start and end while its control daemon hangs.
    whole = mps.submit("fake_cuda.py", "1", "0.2")
    cpu = mps.submit("--gpus", "0", "true")
    assert mps.wait_state(whole, *DONE)["state"] == "succeeded"
    assert mps.wait_state(cpu, *DONE)["state"] == "succeeded"
    assert mps.job(packed)["state"] == "pending"  # still waiting: its `-d` has not returned
    hung.kill()  # a control command that dies: its start failed
    record = mps.wait_state(packed, *DONE, timeout=30)
    assert record["state"] == "succeeded"  # behind the cooperative fence
    assert "fence: 4831838208" in Path(record["log"]).read_text()  # PyTorch's cap: 4 GiB of 80, and its context
    log = (mps.home / "daemon.log").read_text()
    assert "-d exited -9" in log and "cooperative fence" in log


def test_a_control_command_past_its_deadline_is_killed_and_its_job_gets_the_cooperative_fence(mps: Gpuq) -> None:
    (mps.home / "mps" / "fake-wedge-start").write_text("")
    packed = mps.submit("--mem", "4G", "fake_cuda.py", "1", "1")
    record = mps.wait_state(packed, *DONE, timeout=30)
    assert record["state"] == "succeeded"  # after the deadline (GPUQ_MPS_TIMEOUT=2), behind the cooperative fence
    assert "fence: 4831838208" in Path(record["log"]).read_text()
    log = (mps.home / "daemon.log").read_text()
    assert "did not return within 2s" in log and "cooperative fence" in log
    assert _wedged_start(mps) is None  # killed at its deadline


def _wedged_start(gpuq: Gpuq) -> psutil.Process | None:
    """This queue's fake control program's `-d`, hanging (``fake-wedge-start``)."""
    for process in psutil.process_iter(["cmdline"]):
        line = process.info["cmdline"] or []
        if not (any(part.endswith("fake_mps.py") for part in line) and "-d" in line):
            continue
        with contextlib.suppress(psutil.Error):
            if str(gpuq.home) in process.environ().get("CUDA_MPS_PIPE_DIRECTORY", ""):
                return process
    return None


def test_a_quit_that_fails_is_kept_shown_and_tried_again(mps: Gpuq) -> None:
    (mps.home / "mps" / "fake-fail-quit").write_text("")
    job = mps.submit("--mem", "4G", "fake_cuda.py", "1", "0.5")
    assert mps.wait_state(job, *DONE)["state"] == "succeeded"
    (pipe,) = wait_for(lambda: _folders(mps), 10, "the control daemon's folder")
    note = wait_for(lambda: list((mps.home / "mps").glob("GPU-*/*.quit-failed")), 10, "the failed quit's note")
    assert "did not answer" in note[0].read_text()
    assert _control_pid(pipe) is not None  # still up, and still known
    doctor = mps.run("doctor", check=False).stdout
    assert "did not quit" in doctor and "echo quit | CUDA_MPS_PIPE_DIRECTORY=" in doctor
    # It is tried again (GPUQ_MPS_RETRY=1 s, doubling): once the control daemon answers, it quits.
    (mps.home / "mps" / "fake-fail-quit").unlink()
    wait_for(lambda: not _folders(mps), 20, "the retried quit")
    assert "did not quit" not in mps.run("doctor", check=False).stdout
    assert not list((mps.home / "mps").glob("GPU-*"))


def test_a_control_daemon_that_did_not_quit_at_daemon_stop_is_quit_by_the_next_daemon(mps: Gpuq) -> None:
    """The shutdown bug: Mps.stop() deleted the pipe directory even when quit failed, and nothing knew the
    control daemon (and its server) were still up after the last packed job and after `gpuq daemon stop`."""
    wedge = mps.home / "mps" / "fake-wedge-quit"
    wedge.write_text("")
    job = mps.submit("--mem", "4G", "fake_cuda.py", "1", "0.5")
    assert mps.wait_state(job, *DONE)["state"] == "succeeded"
    (pipe,) = wait_for(lambda: _folders(mps), 10, "the control daemon's folder")
    pid = _control_pid(pipe)
    mps.run("daemon", "stop")
    assert _control_pid(pipe) == pid and pid is not None  # still up: its folder is kept, with why
    assert list((mps.home / "mps").glob("GPU-*/*.quit-failed"))
    assert "did not quit" in mps.run("doctor", check=False).stdout
    wedge.unlink()
    mps.run("daemon", "start")  # finds it and quits it: no packed job runs
    wait_for(lambda: not _folders(mps), 20, "the next daemon to quit it")
    wait_for(lambda: _control_pid(pipe) is None, 10, "the control daemon to end")


def test_daemon_stop_quits_idle_control_daemons_and_keeps_those_of_running_jobs(mps: Gpuq) -> None:
    job = mps.submit("--mem", "4G", "fake_cuda.py", "1", "30")
    mps.wait_state(job, "running")
    (pipe,) = wait_for(lambda: _folders(mps), 10, "the control daemon's folder")
    mps.run("daemon", "stop")
    assert _control_pid(pipe) is not None  # its job runs on: its server stays with it
    mps.run("cancel", str(job))
    mps.run("daemon", "start")
    assert mps.wait_state(job, *DONE)["state"] == "cancelled"
    wait_for(lambda: not _folders(mps), 20, "the control daemon to quit after its last job")
