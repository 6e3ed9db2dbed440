"""While nothing waits, an idle shim holds a *blank* for the id the queue gives next: a waiter born in that
job's cgroup before the job is submitted (launcher.daemon.blanks, ahead.blank). Submitted to the idle queue,
the job then runs as that process; a guess that misses ends the blank and removes its cgroup, and nothing of
a blank outlives its daemon.

Real daemon, real shims, one fake GPU, jobs cloned (``GPUQ_SPAWN=clone``: blanks are made only where jobs are
cloned), on a cgroup v2 hierarchy gpuq can write to (CI: root).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq_scheduler.launcher.daemon.outcomes import read_exit
from gpuq_scheduler.launcher.daemon.shims import Shim
from gpuq_scheduler.launcher.supervisor import containment
from gpuq_scheduler.launcher.supervisor.processes import start_time
from gpuq_scheduler.launcher.supervisor.shim import Blank, Launch
from tests import test_born_ahead
from tests.conftest import Gpuq, wait_for
from tests.test_born_ahead import born, group
from tests.test_containment import MOUNT, alive, needs_cgroup2
from tests.test_handoff import staged_behind

one_gpu = test_born_ahead.one_gpu  # the fixture: a queue of one fake GPU whose jobs are cloned

WRITES_ITS_PID = 'echo $$ > "$1"'


def cgroups(queue: Gpuq) -> set[str]:
    return {path.name for path in Path(group(queue)).glob("job-*")}


def idle_with_blank(queue: Gpuq) -> tuple[int, int]:
    """A job run to its end on the idle queue (it starts the daemon), and the blank then born for the next id."""
    first = queue.submit("true")
    queue.wait_state(first, "succeeded")
    return first, born(queue, first + 1)


def no_waiters_left(pids: list[int]) -> bool:
    return not any(alive(pid) for pid in pids)


@needs_cgroup2
def test_a_job_submitted_to_an_idle_queue_runs_as_the_blank_born_for_it(one_gpu: Gpuq) -> None:
    queue = one_gpu
    first, waiting = idle_with_blank(queue)
    birth = start_time(waiting)  # seconds since boot
    submitted = time.clock_gettime(time.CLOCK_BOOTTIME)
    second = queue.submit("--", "sh", "-c", WRITES_ITS_PID, "job", str(queue.cwd / "job.pid"))
    assert second == first + 1
    job = queue.wait_state(second, "succeeded")
    assert int((queue.cwd / "job.pid").read_text()) == waiting  # that process, told to go with its details
    assert job["exit_code"] == 0
    assert birth is not None and birth < submitted  # born before the submit, not at it
    # The next blank is born for the id after it; the job's own cgroup went with it.
    born(queue, second + 1)
    assert f"job-{second}" not in cgroups(queue)


@needs_cgroup2
def test_a_blank_whose_guess_missed_ends_and_its_cgroup_goes(one_gpu: Gpuq) -> None:
    queue = one_gpu
    first, missed = idle_with_blank(queue)
    array = queue.submit("--array", "0-1", "--", "sh", "-c", 'echo $$ >> "$1"', "job", str(queue.cwd / "jobs.pid"))
    # The array took that id, and its members the ones after: no job has it, so the blank and its cgroup go.
    assert array == first + 1
    wait_for(lambda: no_waiters_left([missed]), 10, "the blank to end")
    members = [job["id"] for job in queue.status() if job.get("array_id") == array]
    assert members and array not in members
    for member in members:
        queue.wait_state(member, "succeeded")
    assert missed not in [int(word) for word in (queue.cwd / "jobs.pid").read_text().split()]
    wait_for(lambda: f"job-{array}" not in cgroups(queue), 10, "the missed blank's cgroup to go")


@needs_cgroup2
def test_a_blank_whose_job_is_staged_behind_a_running_one_ends_there_and_the_job_runs(one_gpu: Gpuq) -> None:
    queue = one_gpu
    first = queue.submit("true")
    queue.wait_state(first, "succeeded")
    holder = queue.submit("sleep", "30")  # takes the blank for its id, and the GPU
    queue.wait_state(holder, "running")
    next_blank = born(queue, holder + 1)  # nothing waits: a blank for the next id
    staged = queue.submit("--", "sh", "-c", WRITES_ITS_PID, "job", str(queue.cwd / "job.pid"))
    assert staged == holder + 1
    # Staged behind the running job, it is born ahead by that job's shim in its cgroup made afresh, which
    # ends the blank born for it elsewhere.
    staged_behind(queue, staged, holder)
    wait_for(lambda: no_waiters_left([next_blank]), 10, "the blank to end")
    ahead = born(queue, staged)
    assert ahead != next_blank
    queue.run("cancel", str(holder))
    queue.wait_state(staged, "succeeded")
    assert int((queue.cwd / "job.pid").read_text()) == ahead


@needs_cgroup2
def test_nothing_of_a_blank_outlives_its_daemon(one_gpu: Gpuq) -> None:
    queue = one_gpu
    _, waiting = idle_with_blank(queue)
    where = Path(group(queue))
    queue.run("daemon", "stop")
    wait_for(lambda: no_waiters_left([waiting]), 10, "the blank to end with its daemon")
    assert not where.exists()  # its cgroup, and then the queue's, removed


@needs_cgroup2
def test_a_blank_left_by_a_killed_daemon_ends_and_the_next_daemon_runs_the_job(one_gpu: Gpuq) -> None:
    queue = one_gpu
    _, waiting = idle_with_blank(queue)
    queue.kill_daemon()
    wait_for(lambda: no_waiters_left([waiting]), 10, "the blank to end once its shim is told nothing more")
    second = queue.submit("--", "sh", "-c", WRITES_ITS_PID, "job", str(queue.cwd / "job.pid"))  # a new daemon
    queue.wait_state(second, "succeeded")
    assert int((queue.cwd / "job.pid").read_text()) != waiting


@pytest.fixture
def queue_cgroup() -> Iterator[Path]:
    """A queue's cgroup of its own, as a daemon makes it, removed with what is left in it."""
    assert MOUNT is not None
    path = Path(MOUNT) / f"gpuq-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    for below in sorted(path.glob("job-*")):
        containment.end(containment.Box("test", str(below)), -1)
    path.rmdir()


@needs_cgroup2
def test_a_shim_whose_blank_died_starts_its_job_afresh_and_serves_on(
    queue_cgroup: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blank ends when its job's cgroup is made afresh elsewhere (the job was staged behind a running job,
    then taken back). Sent that job after all, its shim finds the blank gone when it tells it to go: it starts
    the job afresh, and lives on. (The shim once took SIGPIPE's default, and died of that write; the daemon
    requeued the job as interrupted.)"""
    monkeypatch.setenv("GPUQ_SPAWN", "clone")  # blanks are given jobs only where jobs are cloned
    box = containment.Box("test/7", str(queue_cgroup / "job-7"))
    containment.make(box)
    shim = Shim()  # a fork of this process, as of the daemon
    try:
        assert shim.blank(Blank(7, box, os.stat(str(box.cgroup)).st_ino))
        procs = Path(str(box.cgroup), "cgroup.procs")
        wait_for(lambda: procs.read_text().split(), 10, "the blank to be born")
        (blank,) = (int(word) for word in procs.read_text().split())
        wchan = Path(f"/proc/{blank}/wchan")
        wait_for(lambda: "pipe_read" in wchan.read_text(), 10, "the blank to wait for its go")
        containment.make(box)  # as the shim the job was staged at makes it: the blank is killed there
        assert not alive(blank)
        run = tmp_path / "run"
        run.mkdir()
        launch = Launch(
            7, ["sh", "-c", 'echo $$ > "$0"', str(tmp_path / "job.pid")], {"PATH": os.defpath}, str(tmp_path),
            str(tmp_path / "7.log"), str(run / "7.exit"), str(run / "7.pid"), tmp_path / "wake.fifo", None, 1.0,
            box=box,
        )  # fmt: skip
        shim.start(launch)
        wait_for(lambda: read_exit(launch.exit_file), 10, "the job's exit file")
        ended = read_exit(launch.exit_file)
        assert ended is not None and ended.started and ended.exit_code == 0 and ended.spawn_error is None
        assert int((tmp_path / "job.pid").read_text()) != blank
        assert shim.alive()  # and idle again: it serves the next job
    finally:
        shim.abandon()
        wait_for(lambda: not alive(shim.pid), 10, "the shim to exit")
        with contextlib.suppress(ChildProcessError):
            os.waitpid(shim.pid, 0)
