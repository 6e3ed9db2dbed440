"""Shims are reused: one supervises job after job (no fork per job), and that must change nothing a job sees.

Real daemon, real shims, one fake GPU so that jobs run one after another. Each job prints its parent's pid,
which is its shim's.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil

from gpuq_scheduler.launcher.supervisor import processes
from tests.conftest import Gpuq, wait_for

PARENT = "echo shim=$PPID job=$GPUQ_JOB_ID gpus=$CUDA_VISIBLE_DEVICES"


def log(gpuq: Gpuq, job_id: int) -> str:
    return (gpuq.home / "logs" / f"{job_id}.log").read_text()


def shim_of(gpuq: Gpuq, job_id: int) -> int:
    line = log(gpuq, job_id).split()
    return int(line[0].removeprefix("shim="))


def idle_shims(gpuq: Gpuq) -> list[int]:
    """The daemon's children that supervise nothing now."""
    daemon = gpuq.daemon_pid()
    assert daemon is not None
    busy = set()
    for pid_file in (gpuq.home / "run").glob("*.pid"):
        try:  # a job just ended: its outcome is recorded a moment before its pid file goes
            busy.add(psutil.Process(json.loads(pid_file.read_text())["pid"]).ppid())
        except (psutil.NoSuchProcess, FileNotFoundError):
            continue
    return [c.pid for c in psutil.Process(daemon).children() if c.pid not in busy and c.status() != "zombie"]


def test_one_shim_runs_jobs_one_after_another_each_with_its_own_log_outcome_and_environment(one_gpu: Gpuq) -> None:
    gpuq = one_gpu
    first = gpuq.submit("sh", "-c", PARENT)
    failing = gpuq.submit("sh", "-c", PARENT + "; exit 3")
    timed_out = gpuq.submit("--time", "1s", "sh", "-c", PARENT + "; sleep 30")
    last = gpuq.submit("sh", "-c", PARENT)
    assert gpuq.wait_state(first, "succeeded")["exit_code"] == 0
    assert gpuq.wait_state(failing, "failed")["exit_code"] == 3
    assert gpuq.wait_state(timed_out, "timeout")
    assert gpuq.wait_state(last, "succeeded")["exit_code"] == 0

    ids = [first, failing, timed_out, last]
    for job_id in ids:
        words = log(gpuq, job_id).splitlines()[0].split()  # then a timed-out job's line from gpuq
        assert words[1:] == [f"job={job_id}", "gpus=0"]  # its own environment, not the previous job's
    shims = {shim_of(gpuq, job_id) for job_id in ids}
    assert len(shims) < len(ids), f"every job had its own shim {shims}: shims are not reused"
    # A job that ran past its time limit was stopped by a SIGTERM to its group: its shim goes on serving.
    assert shim_of(gpuq, last) == shim_of(gpuq, timed_out)


def test_a_reused_shim_cancels_the_job_it_runs_now(one_gpu: Gpuq) -> None:
    gpuq = one_gpu
    first = gpuq.submit("sh", "-c", PARENT)
    second = gpuq.submit("sh", "-c", PARENT + "; sleep 30")
    gpuq.wait_state(first, "succeeded")
    gpuq.wait_state(second, "running")
    wait_for(lambda: log(gpuq, second).strip(), 10, "the second job's first line")
    gpuq.run("cancel", str(second))
    record = gpuq.wait_state(second, "cancelled", timeout=20)
    assert record["state"] == "cancelled"
    assert shim_of(gpuq, second) == shim_of(gpuq, first)


def test_a_stray_sigterm_ends_an_idle_shim_and_the_next_job_still_runs(one_gpu: Gpuq) -> None:
    gpuq = one_gpu
    gpuq.run("pause")
    waiting = gpuq.submit("sh", "-c", PARENT)
    # While work waits, the daemon forks an idle shim ahead of need.
    idle = wait_for(lambda: idle_shims(gpuq), 10, "an idle shim")
    assert {psutil.Process(pid).name() for pid in idle} == {"gpuq-shim"}  # what top and `ps -e` show
    for pid in idle:
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not set(idle) & set(idle_shims(gpuq)), 10, "the idle shims to end")
    gpuq.run("unpause")
    assert gpuq.wait_state(waiting, "succeeded")["exit_code"] == 0
    assert shim_of(gpuq, waiting) not in idle


def test_jobs_submitted_one_at_a_time_to_an_idle_queue_reuse_the_shim_that_ran_the_last_one(one_gpu: Gpuq) -> None:
    # While each runs the daemon forks its spare (a shim that has never run a job: its memory still the daemon's
    # until it writes there, which a launch pays for). The shim that ran the last job is the one kept and used.
    gpuq = one_gpu
    shims = []
    for _ in range(3):
        job_id = gpuq.submit("sh", "-c", PARENT + "; sleep 0.3")  # long enough for the spare to be forked
        assert gpuq.wait_state(job_id, "succeeded")["exit_code"] == 0
        shims.append(shim_of(gpuq, job_id))
        wait_for(lambda: shims[-1] in idle_shims(gpuq) and len(idle_shims(gpuq)) == 2, 10, "the spare beside it")
    assert len(set(shims)) == 1, f"each job had another shim: {shims}"
    spares = idle_shims(gpuq)
    time.sleep(1.0)  # several of the daemon's settles: nothing more is forked, nothing let go
    assert idle_shims(gpuq) == spares


def test_a_shim_whose_daemon_died_finishes_its_job_then_exits(one_gpu: Gpuq) -> None:
    gpuq = one_gpu
    first = gpuq.submit("sh", "-c", PARENT)
    gpuq.wait_state(first, "succeeded")
    job = gpuq.submit("sh", "-c", PARENT + "; sleep 1")
    gpuq.wait_state(job, "running")
    shim = wait_for(lambda: log(gpuq, job).strip() and shim_of(gpuq, job), 10, "the job's first line")
    gpuq.kill_daemon()
    gpuq.run("daemon", "start")
    assert gpuq.wait_state(job, "succeeded")["exit_code"] == 0

    def gone() -> bool:
        try:
            return psutil.Process(shim).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, 10, f"shim {shim} to exit once its job ended and no daemon would give it another")


def test_a_cancel_for_a_job_that_already_ended_does_not_reach_the_next_job_of_its_shim(one_gpu: Gpuq) -> None:
    """The daemon may send a cancel for a job that has just ended and is not collected yet: the shim, idle by
    then, ignores it, and the next job it is given runs to its end."""
    gpuq = one_gpu
    jobs = []
    for _ in range(12):  # the race is narrow: cancel as close to each job's end as the client manages
        ended = gpuq.submit("sh", "-c", PARENT + "; sleep 0.3")
        following = gpuq.submit("sh", "-c", PARENT + "; sleep 0.3")
        gpuq.wait_state(ended, "running", "succeeded")  # on a busy machine a poll can miss its 0.3 s run
        wait_for(lambda job=ended: log(gpuq, job).strip(), 10, "the first job's line")
        time.sleep(0.29)
        gpuq.run("cancel", str(ended), check=False)
        jobs.append(following)
    for following in jobs:
        assert gpuq.wait_state(following, "succeeded", "cancelled", "failed")["state"] == "succeeded"


def test_a_job_starts_as_from_its_submitters_shell_and_one_that_cannot_says_why(one_gpu: Gpuq) -> None:
    """The shim starts jobs with posix_spawn (not Popen): the job's own PATH still finds its program, from its
    own directory, in a session of its own, with SIGPIPE at its default (Python ignores it, and an ignored
    signal would stay ignored in the job: `yes | head` would print "Broken pipe")."""
    gpuq = one_gpu
    tools = gpuq.cwd / "tools"
    tools.mkdir()
    (tools / "where").write_text('#!/bin/sh\necho "dir=$(pwd) session=$(cut -d" " -f6 /proc/$$/stat) pid=$$"\n')
    (tools / "where").chmod(0o755)
    for name in ("gone", "unrunnable"):  # each runnable when submitted (submit checks), not when started
        (tools / name).write_text("#!/bin/sh\necho never\n")
        (tools / name).chmod(0o755)
    gpuq.env["PATH"] = f"{tools}:{gpuq.env['PATH']}"
    gpuq.run("pause")
    where = gpuq.submit("where")
    piped = gpuq.submit("sh", "-c", "yes | head -n 1")
    missing = gpuq.submit("gone")
    denied = gpuq.submit("unrunnable")
    (tools / "gone").unlink()
    (tools / "unrunnable").chmod(0o644)
    gpuq.run("unpause")
    assert gpuq.wait_state(where, "succeeded")["exit_code"] == 0
    fields = dict(word.split("=") for word in log(gpuq, where).split())
    assert fields["dir"] == str(gpuq.cwd) and fields["session"] == fields["pid"], fields
    assert gpuq.wait_state(piped, "succeeded")["exit_code"] == 0
    assert log(gpuq, piped) == "y\n"
    assert gpuq.wait_state(missing, "failed")["reason"] == "could not start: gone: No such file or directory"
    assert gpuq.wait_state(denied, "failed")["reason"] == "could not start: unrunnable: Permission denied"


def test_the_start_time_a_shim_records_for_a_job_is_the_one_proc_shows(tmp_path: Path) -> None:
    """The shim records a job's start time (which, with its pid, names the process for a restarted daemon)
    from the clock around its spawn, reading /proc only when a clock tick fell between: it must be the
    value /proc/<pid>/stat shows, every time."""
    output = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        for _ in range(100):
            pid, start, reap = processes.spawn(["sleep", "5"], str(tmp_path), dict(os.environ), {}, output)
            try:
                assert start is not None and start == processes.start_time(pid)
            finally:
                os.kill(pid, signal.SIGKILL)
                assert reap() == -signal.SIGKILL
    finally:
        os.close(output)
