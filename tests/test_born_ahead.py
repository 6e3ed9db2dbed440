"""A job staged behind a running one is born in its cgroup while that job runs, and only execs at its turn
(launcher.supervisor.ahead, intocgroup.Born): the clone, the dearest part of a contained start, is off the moment
between one job's end and the next one's start. Whatever becomes of the staged job, that process runs it once
or ends with nothing run, and its cgroup goes with it.

Real daemon, real shims, one fake GPU, on a cgroup v2 hierarchy gpuq can write to (CI: root).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.conftest import Gpuq, wait_for
from tests.test_containment import alive, containment, needs_cgroup2
from tests.test_handoff import staged_behind

# The staged job: writes the pid it runs as (the shell execs nothing before it), then ends.
WRITES_ITS_PID = 'echo $$ > "$1"'


def born(queue: Gpuq, job_id: int) -> int:
    """The one process waiting in staged job ``job_id``'s cgroup: its waiter, not yet the job."""
    procs = Path(group(queue), f"job-{job_id}", "cgroup.procs")

    def waiting() -> list[int]:
        try:
            return [int(word) for word in procs.read_text().split()]
        except OSError:
            return []

    wait_for(lambda: len(waiting()) == 1, 10, f"job {job_id}'s process born ahead")
    (pid,) = waiting()
    assert b"gpuq: waiting for its turn" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return pid


def group(queue: Gpuq) -> str:
    return containment(queue).split(" at ", 1)[1].split(";")[0]


def staged(queue: Gpuq) -> tuple[int, int]:
    """A running job and, staged behind it, one that writes its pid to staged.pid."""
    first = queue.submit("sleep", "2")
    queue.wait_state(first, "running")
    second = queue.submit("sh", "-c", WRITES_ITS_PID, "job", str(queue.cwd / "staged.pid"))
    staged_behind(queue, second, first)
    return first, second


@needs_cgroup2
def test_a_staged_job_runs_as_the_process_born_for_it_while_the_job_ahead_ran(one_gpu: Gpuq) -> None:
    first, second = staged(one_gpu)
    waiting = born(one_gpu, second)
    assert one_gpu.job(first)["state"] == "running"
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
    assert one_gpu.wait_state(first, "succeeded")["state"] == "succeeded"


@needs_cgroup2
def test_a_staged_job_whose_process_was_killed_before_its_turn_starts_afresh(one_gpu: Gpuq) -> None:
    first, second = staged(one_gpu)
    waiting = born(one_gpu, second)
    os.kill(waiting, signal.SIGKILL)
    record = one_gpu.wait_state(second, "succeeded", "failed")
    assert record["state"] == "succeeded", record
    ran_as = int((one_gpu.cwd / "staged.pid").read_text())
    assert ran_as != waiting
    assert one_gpu.job(first)["state"] == "succeeded"
