"""The fast path's pool kept where it pays (#40, ``launcher.daemon.suspension.pools``), with real daemons and real job
processes on the fake inventory: a --preemptible fake CUDA job that allocates as PyTorch would (its host copy
is real memory, scaled down: jobs/fastmove_fake.py) keeps its pinned host memory after a resume when the host
can afford it, and is told to give it back when another job's suspend needs the room; its resident memory
falls, and it runs on. The fake host's available memory (GPUQ_FAKE_HOST_MEMORY) leaves out what the fake
processes hold in host memory, as a real host's does."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import Gpuq, counted, fake_cuda_queue, wait_for

FIXTURES = Path(__file__).parent / "fixtures"
GiB = 1 << 30
MiB = 1 << 20


def _start(queue: Gpuq, name: str, gib: int, *more: str) -> tuple[int, int, Path]:
    """A counting fake CUDA job holding ``gib`` GiB on a GPU of its own: its id, its process, its counts."""
    counts = queue.cwd / f"counts-{name}"
    job = queue.submit(*more, "fake_counter.py", str(gib), str(counts), "1000000", *(["torch"] if more else []))
    wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, f"job {name} to count and be seen")
    pid = int(json.loads((queue.home / "run" / f"{job}.pid").read_text())["pid"])
    return job, pid, counts


def _pool_said(queue: Gpuq, job: int, pid: int) -> int:
    path = queue.home / "run" / f"{job}.fast" / f"{pid}.pool"
    return int(json.loads(path.read_text())["bytes"]) if path.exists() else 0


def _cycle(queue: Gpuq, job: int) -> dict[str, Any]:
    """Suspend and resume the job through gpuq; its ``resumed`` event."""
    resumes = len(queue.events(job, "resumed"))
    queue.run("suspend", str(job))
    queue.wait_state(job, "suspended", timeout=60)
    queue.run("resume", str(job))
    queue.wait_state(job, "running", timeout=60)
    return wait_for(lambda: (found := queue.events(job, "resumed"))[resumes:] and found[-1], 30, "its resume")


def _counts_on(counts: Path) -> None:
    at = len(counted(counts))
    wait_for(lambda: len(counted(counts)) > at + 5, 30, "the job to count on")


def test_a_pool_is_kept_by_default_where_the_host_can_afford_it_and_given_back_when_another_jobs_suspend_needs_it(
    tmp_path: Path,
) -> None:
    """Host 100 GiB (margin 5). A (--preemptible, 60 GiB) is suspended on the fast path and resumed: with 40
    GiB left, more than the margin and no other preemptible job, it keeps its 60 GiB pool. B (40.5 GiB with
    its context, not preemptible) would not fit in those 40 GiB: its suspend tells A to give its pool back,
    waits for the room, and goes through; A's resident memory falls and A counts on, never suspended."""
    queue = fake_cuda_queue(tmp_path, "2x80GiB", GPUQ_FAKE_HOST_MEMORY="100GiB")
    shutil.copy(FIXTURES / "fake_counter.py", queue.cwd / "fake_counter.py")
    try:
        a, a_pid, a_counts = _start(queue, "a", 60, "--preemptible")
        b, _, b_counts = _start(queue, "b", 40)
        resumed = _cycle(queue, a)
        assert resumed["pool"] == 60 * GiB  # kept: the host can afford it
        assert _pool_said(queue, a, a_pid) == 60 * GiB
        assert psutil.Process(a_pid).memory_info().rss > 60 * MiB  # the fake's copy, 1 KiB per MiB, held
        _counts_on(a_counts)
        queue.run("suspend", str(b))
        queue.wait_state(b, "suspended", timeout=60)
        told = wait_for(lambda: queue.events(a, "pool-given-back"), 30, "A told to give its pool back")
        assert (told[0]["bytes"], told[0]["why"]) == (60 * GiB, f"job {b}'s suspend needs the room")
        assert len(told) == 1
        wait_for(lambda: _pool_said(queue, a, a_pid) == 0, 30, "A to say its pool is given back")
        assert psutil.Process(a_pid).memory_info().rss < 40 * MiB
        assert queue.job(a)["state"] == "running" and not queue.events(a, "suspending")[1:]
        _counts_on(a_counts)
        suspended = queue.events(b, "suspended")[-1]
        assert told[0]["t"] <= suspended["t"] and suspended["path"] == "driver"  # told first, then B's copy
        queue.run("resume", str(b))
        queue.wait_state(b, "running", timeout=60)
        _counts_on(b_counts)
    finally:
        queue.cleanup()


@pytest.mark.parametrize("forced", ["", "on"])
def test_a_pool_is_given_back_once_another_preemptible_jobs_suspend_would_need_the_room_and_not_kept_after(
    tmp_path: Path, forced: str
) -> None:
    """Host 100 GiB. A keeps its 60 GiB pool (as above); then C (--preemptible, 40.5 GiB) starts: A's pool
    no longer leaves the room C's suspend would take, so A is told to give it back as soon as C's memory is
    seen, before anything asks; A's next resume keeps nothing. Forced on (GPUQ_FAST_POOL=on), A keeps its
    pool beside C all the same."""
    queue = fake_cuda_queue(tmp_path, "2x80GiB", GPUQ_FAKE_HOST_MEMORY="100GiB", GPUQ_FAST_POOL=forced)
    shutil.copy(FIXTURES / "fake_counter.py", queue.cwd / "fake_counter.py")
    try:
        a, a_pid, a_counts = _start(queue, "a", 60, "--preemptible")
        assert _cycle(queue, a)["pool"] == 60 * GiB
        c, _, _ = _start(queue, "c", 40, "--preemptible")
        if forced == "on":
            assert not queue.events(a, "pool-given-back") and _pool_said(queue, a, a_pid) == 60 * GiB
            return
        told = wait_for(lambda: queue.events(a, "pool-given-back"), 30, "A told to give its pool back")
        assert "no longer cover the margin of 5.0 GiB and the other preemptible jobs' suspends" in told[0]["why"]
        wait_for(lambda: _pool_said(queue, a, a_pid) == 0, 30, "A to say its pool is given back")
        _counts_on(a_counts)
        assert _cycle(queue, a)["pool"] == 0  # 39.5 GiB left: not enough beside C's 40.5 GiB
        assert _pool_said(queue, a, a_pid) == 0 and queue.job(c)["state"] == "running"
    finally:
        queue.cleanup()


def test_a_victim_whose_suspend_needs_another_jobs_pool_is_suspended_once_it_is_given_back_not_passed_over(
    tmp_path: Path,
) -> None:
    """Preemption by priority (GPUQ_PREEMPT_BY=priority), host 100 GiB. A (--preemptible --priority 10, 60 GiB)
    keeps its pool; B (priority 0, not --preemptible, 40.5 GiB) is the only job an urgent --preemptible
    --priority 10 job may take. B's copy fits only with A's pool given back: preemption tells A, B is suspended
    (not passed over as too big for the host), the urgent job starts on B's GPU and succeeds, and B resumes
    after it; A ran throughout."""
    queue = fake_cuda_queue(
        tmp_path,
        "2x80GiB",
        GPUQ_FAKE_HOST_MEMORY="100GiB",
        GPUQ_PREEMPT="on",
        GPUQ_PREEMPT_MIN_RUNTIME="1s",
        GPUQ_PREEMPT_BY="priority",
    )
    shutil.copy(FIXTURES / "fake_counter.py", queue.cwd / "fake_counter.py")
    try:
        a, a_pid, a_counts = _start(queue, "a", 60, "--preemptible", "--priority", "10")
        b, _, b_counts = _start(queue, "b", 40)
        assert _cycle(queue, a)["pool"] == 60 * GiB
        urgent = queue.submit("--preemptible", "--priority", "10", "fake_cuda.py", "30", "3")
        queue.wait_state(urgent, "succeeded", timeout=60)
        preempted = wait_for(lambda: queue.events(b, "preempted"), 30, "B's preemption in the journal")
        assert preempted[0]["for"] == urgent
        told = queue.events(a, "pool-given-back")
        assert [(e["bytes"], e["why"]) for e in told] == [(60 * GiB, f"job {b}'s suspend needs the room")]
        assert queue.job(urgent)["gpus"] == queue.job(b)["gpus"]
        queue.wait_state(b, "running", timeout=60)
        _counts_on(b_counts)
        assert len(queue.events(a, "suspending")) == 1 and queue.job(a)["state"] == "running"
        _counts_on(a_counts)
        assert _pool_said(queue, a, a_pid) == 0
    finally:
        queue.cleanup()


def test_a_fifo_a_job_leaves_as_its_pool_file_never_holds_the_daemon(tmp_path: Path) -> None:
    """The job's fast directory is its own, and the daemon reads each process's pool file there in every pass
    while a --preemptible job runs. A FIFO put there in place of the file (as a hostile teammate's job may)
    held the root daemon's pass forever in open(), and with it the whole queue: it is read only if it is a
    regular file, never waiting for a writer: another job still runs to its end."""
    queue = fake_cuda_queue(tmp_path, "2x80GiB", GPUQ_FAKE_HOST_MEMORY="100GiB")
    shutil.copy(FIXTURES / "fake_counter.py", queue.cwd / "fake_counter.py")
    try:
        a, a_pid, a_counts = _start(queue, "a", 4, "--preemptible")
        pool = queue.home / "run" / f"{a}.fast" / f"{a_pid}.pool"
        os.mkfifo(pool)  # what the job, whose directory it is, may do
        other = queue.submit("true")
        assert queue.wait_state(other, "succeeded", "failed", timeout=60)["state"] == "succeeded"
        _counts_on(a_counts)
        assert queue.job(a)["state"] == "running"
    finally:
        queue.cleanup()
