"""Packed jobs suspended in place (#40), with real daemons and real job processes on the fake inventory and its
fake MPS (launcher/gpus/fake_mps.py): a --preemptible packed job that allocates as PyTorch would gives its
memory back on the fast path (jobs/fastmove_fake.py), keeps its context on its GPU (the fake driver's lock of an
MPS client answers 801, as the real one does) and is frozen, while its neighbour on the same GPU counts on; its
share is free for another job meanwhile, and it resumes once its share fits again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tests.conftest import Gpuq, counted, fake_cuda_queue, wait_for

FIXTURES = Path(__file__).parent / "fixtures"
GiB = 1 << 30
CONTEXT = 512 << 20  # what a fake CUDA process holds for its context (tests/fixtures/fake_cuda.py)


def _queue(tmp_path: Path, **extra: str) -> Gpuq:
    """One 80 GiB GPU under the (fake) MPS fence."""
    queue = fake_cuda_queue(tmp_path, "1x80GiB", GPUQ_FAKE_MPS="1", GPUQ_FAKE_HOST_MEMORY="256GiB", **extra)
    shutil.copy(FIXTURES / "fake_counter.py", queue.cwd / "fake_counter.py")
    return queue


def _counter(queue: Gpuq, name: str, mem: str, holds: str, *more: str) -> tuple[int, Path]:
    """A packed counting job (``--mem mem``, holding ``holds`` GiB), seen counting and holding its memory."""
    counts = queue.cwd / name
    torch = ["torch"] if "--preemptible" in more else []
    job = queue.submit("--mem", mem, *more, "fake_counter.py", holds, str(counts), "1000000", *torch)
    wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, f"job {job} to count and be seen")
    return job, counts


def _moves_on(counts: Path) -> None:
    before = len(counted(counts))
    wait_for(lambda: len(counted(counts)) > before + 10, 30, f"{counts.name} to count on")


def _usage(tmp_path: Path, queue: Gpuq, job: int) -> dict[str, int]:
    pid = json.loads((queue.home / "run" / f"{job}.pid").read_text())["pid"]
    return dict(json.loads((tmp_path / "usage" / f"{pid}.json").read_text()))


def _suspended_in_place(tmp_path: Path, queue: Gpuq) -> tuple[int, Path, int, Path, dict[str, int]]:
    """A neighbour (--mem 20G) and a --preemptible packed job (--mem 40G) on the GPU; the latter suspended in
    place while the neighbour counts on. Returns both, and what the suspended one held before."""
    neighbour, theirs = _counter(queue, "neighbour", "20G", "18")
    job, counts = _counter(queue, "packed", "40G", "38", "--preemptible")
    whole = _usage(tmp_path, queue, job)
    assert queue.run("suspend", str(job)).stdout == f"suspending job {job}\n"
    queue.wait_state(job, "suspended", timeout=60)
    event = wait_for(lambda: (found := queue.events(job, "suspended")) and found[-1], 30, "the suspended event")
    assert (event["path"], event["fallback"], event["fast_bytes"]) == ("fast-in-place", None, 38 * GiB)
    assert event["bytes"] == 38 * GiB  # in host memory: what it moved; its context stayed on the GPU
    assert _usage(tmp_path, queue, job) == {"0": CONTEXT}  # only its context is left on its GPU
    stopped = counted(counts)
    _moves_on(theirs)  # its neighbour never noticed
    assert counted(counts) == stopped  # it makes no progress
    return job, counts, neighbour, theirs, whole


def test_a_packed_preemptible_job_is_suspended_in_place_its_share_used_by_another_and_resumed_once_it_fits(
    tmp_path: Path,
) -> None:
    queue = _queue(tmp_path)
    try:
        job, counts, neighbour, theirs, whole = _suspended_in_place(tmp_path, queue)
        listing = queue.run("status").stdout
        assert "suspended" in next(row for row in listing.splitlines() if row.split()[:1] == [str(job)])
        assert "in place: its context kept on the GPU" in queue.run("show", str(job)).stdout
        assert json.loads(queue.run("show", "--json", str(job)).stdout)["last_suspend_path"] == "fast-in-place"
        # Its share is free: a --mem 30G job fits beside the neighbour now (21 + 31 + 41 GiB would not).
        other, other_counts = _counter(queue, "other", "30G", "28")
        stopped = counted(counts)
        queue.run("resume", str(job))
        said = "waiting for its 40.0G share to fit on GPU(s) 0 to resume"
        waiting = wait_for(lambda: said in (shown := queue.job(job))["reason"] and shown, 30, "its reason")
        assert waiting["state"] == "suspended" and counted(counts) == stopped
        _moves_on(theirs)
        _moves_on(other_counts)
        queue.run("cancel", str(other))
        queue.wait_state(job, "running", timeout=60)
        _moves_on(counts)
        assert counted(counts)[: len(stopped) + 10] == list(range(1, len(stopped) + 11))  # on from where it was
        assert _usage(tmp_path, queue, job) == whole  # all it held is back
        assert queue.job(neighbour)["state"] == "running" and queue.job(neighbour)["suspended_for"] == 0
        seen = counted(theirs)
        assert seen == list(range(1, len(seen) + 1))
        for each in (job, neighbour):
            queue.run("cancel", str(each))
            queue.wait_state(each, "cancelled")
    finally:
        queue.cleanup()


def _control_daemons(queue: Gpuq) -> list[int]:
    """The pids of the fake MPS control daemons running under the queue's state directory."""
    alive = []
    for pid_file in (queue.home / "mps").rglob("control.pid"):
        pid = int(pid_file.read_text())
        if os.path.exists(f"/proc/{pid}"):
            alive.append(pid)
    return alive


def test_kill_9_of_the_daemon_while_a_packed_job_is_suspended_in_place_keeps_its_mps_server_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """The next daemon finds it suspended, keeps the control daemon its frozen context is a client of (it
    quit those with no running client before: the context would have lost its server), and resumes it."""
    queue = _queue(tmp_path)
    try:
        job, counts, neighbour, _, whole = _suspended_in_place(tmp_path, queue)
        servers = _control_daemons(queue)
        assert len(servers) == 1
        queue.run("cancel", str(neighbour))  # it alone is left a client of that server, suspended
        queue.wait_state(neighbour, "cancelled")
        stopped = counted(counts)
        queue.kill_daemon()
        queue.run("daemon", "start")
        other = queue.submit("--gpus", "0", "true")
        queue.wait_state(other, "succeeded")  # a pass or more of the new daemon went by
        assert _control_daemons(queue) == servers
        assert queue.job(job)["state"] == "suspended" and counted(counts) == stopped
        queue.run("resume", str(job))
        queue.wait_state(job, "running", timeout=60)
        _moves_on(counts)
        assert counted(counts)[: len(stopped) + 10] == list(range(1, len(stopped) + 11))
        assert _usage(tmp_path, queue, job) == whole
        queue.run("cancel", str(job))
        queue.wait_state(job, "cancelled")
        wait_for(lambda: not _control_daemons(queue), 30, "its control daemon to quit once it ended")
    finally:
        queue.cleanup()


def test_a_packed_job_the_fast_path_cannot_take_is_refused_in_one_line_and_runs_on(tmp_path: Path) -> None:
    """Not --preemptible: refused by `gpuq suspend` before anything is asked. --preemptible but not PyTorch:
    tried, and left running, its reason saying why (the driver's 801, and the job's own answer)."""
    queue = _queue(tmp_path)
    try:
        plain, _ = _counter(queue, "plain", "20G", "18")
        refused = queue.run("suspend", str(plain), check=False)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1
        assert "only a --preemptible PyTorch job is suspended in place there: submit it with --preemptible" in (
            refused.stderr
        )
        assert not list((queue.home / "spool").glob("control-*"))
        counts = queue.cwd / "no torch"
        job = queue.submit("--mem", "20G", "--preemptible", "fake_counter.py", "18", str(counts), "1000000")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count and be seen")
        queue.run("suspend", str(job))
        shown = wait_for(lambda: "not suspended" in (found := queue.job(job))["reason"] and found, 30, "a refusal")
        assert shown["state"] == "running" and shown["step"] is None
        assert shown["reason"] == (
            "not suspended: it runs as a client of an MPS server, which the driver cannot checkpoint, and the "
            "fast path does not apply: the process has not imported torch"
        )
        _moves_on(counts)
    finally:
        queue.cleanup()


def test_preemption_suspends_a_packed_preemptible_victim_in_place_instead_of_requeueing_it(tmp_path: Path) -> None:
    """An urgent packed job that fits only in the victim's share: the victim is suspended in place (not
    signalled and requeued, as packed victims were), the urgent job runs beside its neighbour, and once it ended
    the victim resumes by itself and counts on from where it stopped, in the same run."""
    queue = _queue(tmp_path, GPUQ_PREEMPT="on", GPUQ_PREEMPT_MIN_RUNTIME="1s")
    try:
        neighbour, theirs = _counter(queue, "neighbour", "20G", "18")
        job, counts = _counter(queue, "packed", "40G", "38", "--preemptible")
        urgent_counts = queue.cwd / "urgent"
        urgent = queue.submit("--priority", "10", "--mem", "30G", "fake_counter.py", "28", str(urgent_counts), "150")
        queue.wait_state(job, "suspended", timeout=60)
        stopped = counted(counts)
        assert queue.wait_state(urgent, "succeeded", "failed", timeout=60)["state"] == "succeeded"
        assert counted(urgent_counts) == list(range(1, 151))
        queue.wait_state(job, "running", timeout=60)
        _moves_on(counts)
        assert counted(counts)[: len(stopped) + 10] == list(range(1, len(stopped) + 11))
        shown = queue.job(job)
        assert shown["attempt"] == 1 and shown["suspended_for"] > 0  # the same run, never requeued
        preempted = queue.events(job, "preempted")
        assert [e["for"] for e in preempted] == [urgent] and "requeue" not in preempted[0]
        assert queue.events(job, "suspended")[-1]["path"] == "fast-in-place"
        assert not queue.events(job, "requeued") and not queue.events(neighbour, "preempted")
        seen = counted(theirs)
        assert seen == list(range(1, len(seen) + 1)) and queue.job(neighbour)["state"] == "running"
    finally:
        queue.cleanup()
