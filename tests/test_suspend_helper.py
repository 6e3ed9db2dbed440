"""The suspend helper's plumbing (launcher/daemon/suspension/suspender.py's ``start_helper``): a fork of a
single-threaded daemon; from a threaded one, a fork of its Forker (a server of one thread), or without one a fresh
interpreter; each answers down its pipe, then wakes the daemon."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq_scheduler.launcher.daemon.suspension import suspender
from gpuq_scheduler.launcher.daemon.suspension.forker import Forker
from tests.conftest import wait_for


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """The daemon's wake-up FIFO, and its end the daemon reads (open, so that a helper's poke lands)."""
    path = tmp_path / "wake.fifo"
    os.mkfifo(path)
    wake = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    yield path, wake
    os.close(wake)


@pytest.fixture
def leader() -> Iterator[subprocess.Popen[bytes]]:
    """A job's first process, holding no CUDA state: a resume only lets it go on."""
    process = subprocess.Popen(["sleep", "30"])
    yield process
    process.kill()
    process.wait()


@contextlib.contextmanager
def another_thread(on: bool = True) -> Iterator[None]:
    """This process with a second thread while inside, as a daemon with NVML's."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    if on:
        other.start()
    try:
        yield
    finally:
        stop.set()
        if on:
            other.join()


@pytest.mark.parametrize(("threaded", "served"), [(False, False), (True, False), (True, True)])
def test_the_helper_answers_down_its_pipe_and_then_wakes_the_daemon(
    fifo: tuple[Path, int], leader: subprocess.Popen[bytes], threaded: bool, served: bool
) -> None:
    path, wake = fifo
    forker = Forker() if served else None
    with another_thread(threaded):
        assert (len(os.listdir("/proc/self/task")) > 1) is threaded
        # A resume of a process that holds no CUDA state: it is let go (SIGCONT), nothing else to do.
        order = {"action": "resume", "leader": leader.pid, "box": None, "fake": True, "usage": None}
        helper = suspender.start_helper(order, str(path), forker)
        assert helper.started > 0
        result = wait_for(helper.result, 60, "the helper's answer")
        assert result["ok"] and result["pids"] == [] and set(result["steps"]) >= {"open", "thaw", "restore", "unlock"}
        assert helper.spawned <= result["began"] <= result["ended"]
        assert wait_for(lambda: _read(wake), 10, "the wake-up") == b"!"
        _reap(helper.pid)
        assert leader.poll() is None
        if forker is not None:  # the server's child, not ours; the server serves on until let go
            assert forker.alive and helper.pid != forker.process.pid
            assert suspender.start_helper(order, str(path), forker).pid > 0
            forker.close()
            assert forker.process.wait(10) == 0 and not forker.alive


def test_a_forker_that_died_is_given_up_for_a_fresh_interpreter(
    fifo: tuple[Path, int], leader: subprocess.Popen[bytes]
) -> None:
    with another_thread():  # a threaded caller, as a daemon with NVML's thread
        forker = Forker()
        forker.process.kill()
        forker.process.wait()
        order = {"action": "resume", "leader": leader.pid, "box": None, "fake": True, "usage": None}
        helper = suspender.start_helper(order, str(fifo[0]), forker)
        assert wait_for(helper.result, 60, "the helper's answer")["ok"] and not forker.alive
        _reap(helper.pid)


def test_a_helper_that_dies_without_answering_is_read_as_a_failure(fifo: tuple[Path, int]) -> None:
    order = {"action": "resume", "leader": "not a pid", "box": None, "fake": True, "usage": None}
    helper = suspender.start_helper(order, str(fifo[0]))  # its act raises before it writes anything
    result = wait_for(helper.result, 60, "the helper's end")
    assert result == {"ok": False, "why": "its helper ended saying nothing"}
    _reap(helper.pid)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 64)
    except BlockingIOError:
        return b""


def _reap(pid: int) -> None:
    """Collect the helper (as the daemon's pass does); an exec'd one's Popen may have collected it already."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def test_a_forker_keeps_a_spare_helper_that_opened_the_checkpoint_before_its_order(
    fifo: tuple[Path, int], leader: subprocess.Popen[bytes]
) -> None:
    """The second order goes to a helper forked while the first was served, which opened the checkpoint
    then (a driver's first cuInit costs ~200 ms where no process holds it); closing the Forker ends it."""
    with another_thread():  # a threaded caller, as a daemon with NVML's thread: its helpers are the Forker's
        forker = Forker()
        order = {"action": "resume", "leader": leader.pid, "box": None, "fake": True, "usage": None}
        first = suspender.start_helper(order, str(fifo[0]), forker)
        assert wait_for(first.result, 60, "the first answer")["ok"]
        # The first helper ends once it has answered; the spare forked after it waits.
        (spare,) = wait_for(lambda: _only(_children(forker.process.pid) - {first.pid}, first.pid), 30, "a spare alone")
        second = suspender.start_helper(order, str(fifo[0]), forker)
        assert second.pid == spare
        result = wait_for(second.result, 60, "the spare's answer")
        assert result["ok"] and result["steps"]["open"] == 0.0
        left = wait_for(lambda: _children(forker.process.pid) - {spare}, 30, "the next spare")
        forker.close()
        assert forker.process.wait(10) == 0
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in left), 30, "the spare to go with its Forker")


def _children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    found = set()
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry))
    return found


def _only(found: set[int], gone: int) -> set[int]:
    """``found`` if it is one process and ``gone`` has ended, else nothing."""
    return found if len(found) == 1 and not Path(f"/proc/{gone}").exists() else set()
