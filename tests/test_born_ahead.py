"""A job staged behind a running one is born in its cgroup while that job runs, and only execs at its turn
(launcher.supervisor.ahead, intocgroup.Born): the clone, the dearest part of a contained start, is off the moment
between one job's end and the next one's start. Whatever becomes of the staged job, that process runs it once
or ends with nothing run, and its cgroup goes with it.

Real daemon, real shims, one fake GPU, on a cgroup v2 hierarchy gpuq can write to (CI: root).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq_scheduler.launcher.supervisor import spawncg
from tests.conftest import Gpuq, make_env, wait_for
from tests.test_containment import alive, containment, needs_cgroup2, script
from tests.test_handoff import staged_behind


@pytest.fixture
def one_gpu(tmp_path: Path) -> Iterator[Gpuq]:
    """conftest's queue of one fake GPU, its jobs cloned even where the C library could spawn them into their
    cgroups (``spawncg``): there a waiter is born ahead only for a job of another user, and these tests are of
    the waiter."""
    home, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    client = Gpuq(home, make_env(home, fake="1x80GiB", GPUQ_SPAWN="clone"), work)
    yield client
    client.cleanup()


# The staged job: writes the pid it runs as (the shell execs nothing before it), then ends.
WRITES_ITS_PID = 'echo $$ > "$1"'


def born(queue: Gpuq, job_id: int) -> int:
    """The one process waiting in job ``job_id``'s cgroup: its waiter (a staged job's), not yet the job."""
    procs = Path(group(queue), f"job-{job_id}", "cgroup.procs")

    def waiting() -> list[int]:
        try:
            return [int(word) for word in procs.read_text().split()]
        except OSError:
            return []

    wait_for(lambda: len(waiting()) == 1, 10, f"job {job_id}'s process born ahead")
    (pid,) = waiting()
    # Cloned there, it is a copy of its shim until it execs the waiter.
    wait_for(lambda: b"gpuq: waiting for its turn" in Path(f"/proc/{pid}/cmdline").read_bytes(), 10, "its waiter")
    return pid


def group(queue: Gpuq) -> str:
    return containment(queue).split(" at ", 1)[1].split(";")[0]


def staged(queue: Gpuq) -> tuple[int, int]:
    """A running job that ends once the test lets it go (``let_go``: "still running" holds by construction,
    not because the test was quick), and, staged behind it, one that writes its pid to staged.pid."""
    first = queue.submit("sh", "-c", "while [ ! -e go ]; do sleep 0.05; done")
    queue.wait_state(first, "running")
    return first, submit_staged(queue, first, "sh", "-c", WRITES_ITS_PID, "job", str(queue.cwd / "staged.pid"))


def let_go(queue: Gpuq) -> None:
    """End the job ahead that ``staged`` started."""
    (queue.cwd / "go").touch()


def submit_staged(queue: Gpuq, ahead: int, *argv: str) -> int:
    """Submit ``argv``, to be staged behind job ``ahead`` (running), and wait until its shim has made its
    cgroup."""
    path = Path(group(queue), f"job-{ahead + 1}")
    job_id = queue.submit(*argv)
    assert job_id == ahead + 1
    staged_behind(queue, job_id, ahead)
    wait_for(lambda: inode(path) is not None, 10, f"job {job_id}'s cgroup made when it was staged")
    return job_id


def inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


@needs_cgroup2
def test_a_staged_job_runs_as_the_process_born_for_it_while_the_job_ahead_ran(one_gpu: Gpuq) -> None:
    first, second = staged(one_gpu)
    waiting = born(one_gpu, second)
    assert one_gpu.job(first)["state"] == "running"
    let_go(one_gpu)
    one_gpu.wait_state(second, "succeeded")
    assert int((one_gpu.cwd / "staged.pid").read_text()) == waiting  # that process, exec'd at its turn
    assert not Path(group(one_gpu), f"job-{second}").exists()


@needs_cgroup2
def test_a_staged_job_taken_back_leaves_no_process_and_no_cgroup(one_gpu: Gpuq) -> None:
    first, second = staged(one_gpu)
    waiting = born(one_gpu, second)
    one_gpu.run("cancel", str(second))
    assert one_gpu.wait_state(second, "cancelled")["started_at"] is None
    wait_for(lambda: not alive(waiting), 10, "the process born ahead to end")
    assert not Path(group(one_gpu), f"job-{second}").exists()
    assert not (one_gpu.cwd / "staged.pid").exists()
    let_go(one_gpu)
    assert one_gpu.wait_state(first, "succeeded")["state"] == "succeeded"


@needs_cgroup2
def test_a_staged_job_whose_process_was_killed_before_its_turn_starts_afresh(one_gpu: Gpuq) -> None:
    first, second = staged(one_gpu)
    waiting = born(one_gpu, second)
    os.kill(waiting, signal.SIGKILL)  # before its turn: the job ahead runs until let go
    let_go(one_gpu)
    record = one_gpu.wait_state(second, "succeeded", "failed")
    assert record["state"] == "succeeded", record
    ran_as = int((one_gpu.cwd / "staged.pid").read_text())
    assert ran_as != waiting
    assert one_gpu.job(first)["state"] == "succeeded"


# The job ahead: a setsid child that outlives it, then some CPU of its own.
LEAVES_ONE_BEHIND = f"""setsid sh -c 'echo $$ > straggler.pid; exec sleep 60' &
{sys.executable} -c "import time
while time.process_time() < 0.3:
    pass"
sleep 2
"""
# The job staged behind it: whether that child is still there (a zombie has ended: its memory and files are
# let go) as it starts.
LOOKS_FOR_IT = """state=$(awk '{print $3}' /proc/$(cat straggler.pid)/stat 2>/dev/null)
if [ -n "$state" ] && [ "$state" != Z ]; then echo alive; else echo gone; fi > seen
"""


@needs_cgroup2
def test_a_job_handed_off_has_ended_whole_and_been_accounted_when_its_successor_starts(one_gpu: Gpuq) -> None:
    """Its straggler ended and counted, its CPU time recorded, its cgroup gone after (removed once the
    successor started, not before)."""
    first = one_gpu.submit(script(one_gpu, "leaves.sh", LEAVES_ONE_BEHIND))
    one_gpu.wait_state(first, "running")
    second = submit_staged(one_gpu, first, script(one_gpu, "looks.sh", LOOKS_FOR_IT))
    born(one_gpu, second)
    assert one_gpu.wait_state(second, "succeeded")["state"] == "succeeded"
    assert (one_gpu.cwd / "seen").read_text().strip() == "gone"
    ended = one_gpu.job(first)
    assert ended["state"] == "succeeded" and ended["reason"] == "1 process outlived the job and was ended", ended
    assert ended["cpu_seconds"] >= 0.3, ended
    assert not Path(group(one_gpu), f"job-{first}").exists()
    assert not Path(group(one_gpu), f"job-{second}").exists()


@needs_cgroup2
@pytest.mark.skipif(not spawncg.usable(), reason="this C library cannot spawn into a cgroup (glibc 2.39 and later can)")
def test_where_the_c_library_spawns_into_a_cgroup_a_staged_jobs_cgroup_is_made_ahead_and_empty(
    tmp_path: Path,
) -> None:
    """No waiter: the staged job's cgroup is made while the job ahead runs, with nothing in it, and the job is
    spawned into it at its turn, running as its own process (not one born before)."""
    home, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    queue = Gpuq(home, make_env(home, fake="1x80GiB"), work)
    try:
        first, second = staged(queue)
        cgroup = Path(group(queue), f"job-{second}")
        wait_for(cgroup.exists, 10, f"job {second}'s cgroup made ahead")
        assert queue.job(first)["state"] == "running" and (cgroup / "cgroup.procs").read_text() == ""
        let_go(queue)
        queue.wait_state(second, "succeeded")
        assert (queue.cwd / "staged.pid").read_text().strip().isdigit()
        wait_for(lambda: not cgroup.exists(), 10, "its cgroup to go")
    finally:
        queue.cleanup()
