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
from pathlib import Path

import pytest

from gpuq_scheduler.launcher.daemon.outcomes import read_exit
from gpuq_scheduler.launcher.daemon.shims import Shim, Shims
from gpuq_scheduler.launcher.supervisor import containment, spawncg
from gpuq_scheduler.launcher.supervisor.processes import start_time
from gpuq_scheduler.launcher.supervisor.shim import Blank, Launch
from tests import test_born_ahead, test_intocgroup
from tests.conftest import Gpuq, make_env, wait_for
from tests.test_born_ahead import born, group
from tests.test_containment import MOUNT, alive, needs_cgroup2
from tests.test_handoff import staged_behind

one_gpu = test_born_ahead.one_gpu  # the fixture: a queue of one fake GPU whose jobs are cloned
cgroup = test_intocgroup.cgroup  # the fixture: a cgroup of the test's own, removed with what is in it

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
    log = queue.home / "logs" / f"{first + 1}.log"
    assert log.exists() and log.stat().st_size == 0  # opened ahead too: its creation is off the start
    submitted = time.clock_gettime(time.CLOCK_BOOTTIME)
    second = queue.submit("--", "sh", "-c", WRITES_ITS_PID + "; echo ran", "job", str(queue.cwd / "job.pid"))
    assert second == first + 1
    job = queue.wait_state(second, "succeeded")
    assert int((queue.cwd / "job.pid").read_text()) == waiting  # that process, told to go with its details
    assert job["exit_code"] == 0
    assert log.read_text() == "ran\n"  # into the log opened ahead
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
    assert not (queue.home / "logs" / f"{array}.log").exists()  # and its log, opened ahead, unused


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


SPAWNS = pytest.mark.skipif(
    not spawncg.usable(), reason="this C library cannot spawn into a cgroup (glibc 2.39 and later can)"
)
# Where jobs are cloned, a blank is a waiter; where the C library spawns into a cgroup, the spawn built.
KINDS = ("waiter", pytest.param("spawn", marks=SPAWNS))


@needs_cgroup2
@pytest.mark.parametrize("kind", KINDS)
def test_a_shim_whose_blank_is_gone_starts_its_job_afresh_and_serves_on(
    cgroup: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A blank's cgroup made afresh elsewhere (its job was staged behind a running job, then taken back) ends a
    waiter there, and is no longer the one a spawn was built for. Sent that job after all, its shim starts the
    job afresh, and lives on. (The shim once took SIGPIPE's default, and died of its write to the waiter that
    had ended; the daemon requeued the job as interrupted.)"""
    if kind == "waiter":
        monkeypatch.setenv("GPUQ_SPAWN", "clone")  # a waiter is given jobs only where jobs are cloned
    box = containment.Box("test/7", str(cgroup / "job-7"))  # in a queue's cgroup of its own
    containment.make(box)
    blank_inode = os.stat(str(box.cgroup)).st_ino
    shim = Shim()  # a fork of this process, as of the daemon
    try:
        assert shim.blank(Blank(7, box, blank_inode, spawned=kind == "spawn"))
        procs = Path(str(box.cgroup), "cgroup.procs")
        if kind == "waiter":
            wait_for(lambda: procs.read_text().split(), 10, "the blank to be born")
            (blank,) = (int(word) for word in procs.read_text().split())
            wchan = Path(f"/proc/{blank}/wchan")
            wait_for(lambda: "pipe_read" in wchan.read_text(), 10, "the blank to wait for its go")
        containment.make(box)  # as the shim the job was staged at makes it: a waiter is killed there
        if kind == "waiter":
            assert not alive(blank)
        run = tmp_path / "run"
        run.mkdir()
        job = f'stat -c %i "{MOUNT}$(sed -n "s/^0:://p" /proc/self/cgroup)" > "$0"'  # its cgroup v2
        launch = Launch(
            7, ["sh", "-c", job, str(tmp_path / "job.inode")], {"PATH": os.defpath}, str(tmp_path),
            str(tmp_path / "7.log"), str(run / "7.exit"), str(run / "7.pid"), tmp_path / "wake.fifo", None, 1.0,
            box=box,
        )  # fmt: skip
        shim.start(launch)
        wait_for(lambda: read_exit(launch.exit_file), 10, "the job's exit file")
        ended = read_exit(launch.exit_file)
        assert ended is not None and ended.started and ended.exit_code == 0 and ended.spawn_error is None
        ran_in = int((tmp_path / "job.inode").read_text())
        assert ran_in != blank_inode  # in its cgroup made afresh
        assert shim.alive()  # and idle again: it serves the next job
    finally:
        shim.abandon()
        wait_for(lambda: not alive(shim.pid), 10, "the shim to exit")
        with contextlib.suppress(ChildProcessError):
            os.waitpid(shim.pid, 0)


@needs_cgroup2
@SPAWNS
def test_where_the_c_library_spawns_into_a_cgroup_an_idle_start_takes_the_cgroup_made_before_its_submit(
    tmp_path: Path,
) -> None:
    """No waiter there: the daemon makes the next job's cgroup while nothing waits, empty, and an idle shim builds
    the C library's spawn into it; the job submitted then runs in that very cgroup."""
    home, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    queue = Gpuq(home, make_env(home, fake="1x80GiB"), work)
    try:
        first = queue.submit("true")
        queue.wait_state(first, "succeeded")
        cgroup = Path(group(queue), f"job-{first + 1}")
        wait_for(cgroup.exists, 10, f"job {first + 1}'s cgroup made before its submit")
        made = cgroup.stat().st_ino
        assert (cgroup / "cgroup.procs").read_text() == ""
        job = f'stat -c %i "{MOUNT}$(sed -n "s/^0:://p" /proc/self/cgroup)" > "$0"'  # its cgroup v2
        second = queue.submit("--", "sh", "-c", job, str(work / "job.inode"))
        assert second == first + 1
        queue.wait_state(second, "succeeded")
        assert int((work / "job.inode").read_text()) == made
        wait_for(lambda: Path(group(queue), f"job-{second + 1}").exists(), 10, "the next job's cgroup")
        assert not cgroup.exists()
    finally:
        queue.cleanup()


@needs_cgroup2
@pytest.mark.parametrize("how", ["placed", "staged"])
def test_a_blank_let_go_never_takes_the_log_of_its_job_once_that_job_went_to_a_shim(
    cgroup: Path, tmp_path: Path, how: str
) -> None:
    """The daemon removes a blank's unused log when its guess missed, but once the job it was made for is sent to
    a shim (placed on an idle GPU, or staged behind a running job), that path is the job's log: a job that wrote
    nothing and ended before the daemon tidied (a quiet moment) keeps it. Real shims, forked by the daemon's
    pool as the daemon does."""
    shims = Shims()
    log = tmp_path / "7.log"
    try:
        shims.keep(2)
        shims.blank(7, containment.Box("m", str(cgroup / "job-7")), spawned=False, log=str(log))
        assert shims.blank_for == 7
        if how == "placed":
            shims.unblank()  # the guess looked missed (a job waited), then job 7 was placed after all
            shims.take(7)
        else:
            ahead = shims.take(6)  # job 6 runs (as far as the pool knows), and job 7 is staged behind it
            staged = Launch(7, ["true"], {}, "/", str(log), "", "", tmp_path / "wake", None, 1.0)
            assert shims.stage(6, staged)
            assert shims.blank_for is None and ahead.alive()
        log.touch()  # the job's shim opens it; the job writes nothing, and ends
        shims.tidy(sent=set())
        assert log.exists()
    finally:
        shims.close(set())
