"""A newcomer's first hour (issue 27): the card's own commands do what they say, with a real daemon on
fake GPUs, and nothing that did not run is recorded as succeeded."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from gpuq_scheduler.jobs.hold import start_ticks
from tests.conftest import Gpuq, wait_for

SHOW_ARGV = "import os, sys; print(sys.argv, os.environ.get('CUDA_VISIBLE_DEVICES'))\n"


def _log(gpuq: Gpuq, job_id: int) -> str:
    path = Path(gpuq.job(job_id)["log"])
    return path.read_text() if path.exists() else ""


def test_the_headline_submit_gives_the_job_two_gpus_and_only_its_own_argv(gpuq: Gpuq) -> None:
    (gpuq.cwd / "train.py").write_text(SHOW_ARGV)
    first = int(gpuq.run("submit", "train.py", "--gpus", "2").stdout.split()[-1])
    second = gpuq.submit("train.py", "--gpus", "2", "--", "--lr", "0.1", "--gpus", "4")
    for job_id in (first, second):
        gpuq.wait_state(job_id, "succeeded")
    assert _log(gpuq, first) == "['train.py'] 0,1\n"
    assert _log(gpuq, second).startswith("['train.py', '--lr', '0.1', '--gpus', '4'] ")
    assert gpuq.job(second)["gpus_requested"] == 2


def test_gpuq_run_takes_its_options_after_the_command_too(gpuq: Gpuq) -> None:
    done = gpuq.run("run", "sh", "-c", 'echo "seen $CUDA_VISIBLE_DEVICES $0"', "--gpus", "2", "--", "arg")
    assert "seen 0,1 arg\n" in done.stdout


def test_a_python_job_is_named_after_its_script_and_status_shows_gpu_indices_apart_from_counts(gpuq: Gpuq) -> None:
    """`gpuq submit python train.py` was named `python`; GPUS showed `0` for a job on GPU 0."""
    (gpuq.cwd / "train.py").write_text("import time; time.sleep(60)\n")
    job_id = gpuq.submit("--gpus", "1", "python", "train.py")
    cpu_id = gpuq.submit("--gpus", "0", "sleep", "60")
    gpuq.wait_state(job_id, "running")
    gpuq.wait_state(cpu_id, "running")
    assert gpuq.job(job_id)["name"] == "train.py"
    rows = [line.split() for line in gpuq.run("status").stdout.splitlines()]
    header = rows[0]
    assert header[:6] == ["ID", "NAME", "USER", "STATE", "GPUS", "ON"]
    by_id = {row[0]: dict(zip(header, row, strict=False)) for row in rows[1:]}
    assert (by_id[str(job_id)]["NAME"], by_id[str(job_id)]["GPUS"], by_id[str(job_id)]["ON"]) == ("train.py", "1", "0")
    assert (by_id[str(cpu_id)]["GPUS"], by_id[str(cpu_id)]["ON"]) == ("0", "-")


def _gpuq_run_in_background(gpuq: Gpuq, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", gpuq.entry, "run", *args],
        env=gpuq.env,
        cwd=gpuq.cwd,
        text=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_a_gpuq_run_killed_while_its_job_waits_withdraws_the_job_and_nothing_is_recorded_succeeded(
    one_gpu: Gpuq,
) -> None:
    """It stayed pending, then 'ran' in 0.0 s when the GPU freed: log {"gone": true}, succeeded, exit 0."""
    blocker = one_gpu.submit("sleep", "600")
    one_gpu.wait_state(blocker, "running")
    client = _gpuq_run_in_background(one_gpu, "true")
    one_gpu.wait_state(blocker + 1, "pending")
    client.kill()  # a kill -9: it withdraws nothing itself
    client.wait(timeout=30)
    job = one_gpu.wait_state(blocker + 1, "cancelled", "succeeded", "failed")
    assert job["state"] == "cancelled" and job["reason"].startswith("withdrawn: its client"), job
    one_gpu.run("cancel", str(blocker))
    one_gpu.wait_state(blocker, "cancelled")
    assert one_gpu.job(blocker + 1)["started_at"] is None


def test_a_gpuq_run_whose_terminal_hangs_up_while_its_job_waits_withdraws_it(one_gpu: Gpuq) -> None:
    blocker = one_gpu.submit("sleep", "600")
    one_gpu.wait_state(blocker, "running")
    client = _gpuq_run_in_background(one_gpu, "true")
    one_gpu.wait_state(blocker + 1, "pending")
    client.send_signal(signal.SIGHUP)
    _, err = client.communicate(timeout=60)
    assert client.returncode == 128 + signal.SIGHUP and f"gpuq: withdrew job {blocker + 1}" in err
    assert one_gpu.wait_state(blocker + 1, "cancelled")["started_at"] is None


def test_a_placeholder_started_after_its_client_died_ends_as_a_hangup_not_a_success(tmp_path: Path) -> None:
    gone = subprocess.Popen(["sleep", "60"])
    ticks = start_ticks(gone.pid)
    assert ticks is not None
    gone.kill()
    gone.wait()
    hold = subprocess.run(
        [sys.executable, "-m", "gpuq_scheduler.jobs.hold", "--client", str(gone.pid), ticks],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert hold.returncode == -signal.SIGHUP, hold


def test_a_job_that_exits_0_when_gpuq_stops_it_is_recorded_as_stopped_not_succeeded(gpuq: Gpuq) -> None:
    graceful = "trap 'echo stopping; exit 0' TERM; echo started; while :; do sleep 0.1; done"
    cancelled = gpuq.submit("--gpus", "0", "sh", "-c", graceful)
    timed = gpuq.submit("--gpus", "0", "--time", "3s", "sh", "-c", graceful)
    wait_for(lambda: "started" in _log(gpuq, cancelled), what="the job to start")
    gpuq.run("cancel", str(cancelled))
    assert gpuq.wait_state(cancelled, "cancelled", "succeeded")["state"] == "cancelled"
    assert gpuq.wait_state(timed, "timeout", "succeeded")["state"] == "timeout"


def test_gpuq_says_at_the_end_of_a_jobs_log_that_it_stopped_it(gpuq: Gpuq) -> None:
    """A cancelled or timed-out job's log ended with the job's last words, nothing saying gpuq stopped it."""
    cancelled = gpuq.submit("--gpus", "0", "sh", "-c", "echo started; sleep 600")
    timed = gpuq.submit("--gpus", "0", "--time", "2s", "sleep", "600")
    done = gpuq.submit("--gpus", "0", "echo", "fine")
    wait_for(lambda: "started" in _log(gpuq, cancelled), what="the job to start")
    gpuq.run("cancel", str(cancelled))
    gpuq.wait_state(cancelled, "cancelled")
    gpuq.wait_state(timed, "timeout")
    gpuq.wait_state(done, "succeeded")
    user = gpuq.job(cancelled)["user"]
    last = wait_for(lambda: _log(gpuq, cancelled).splitlines()[-1:] != ["started"] and _log(gpuq, cancelled))
    assert re.fullmatch(rf"started\ngpuq: job {cancelled} cancelled by {user} at \d\d:\d\d:\d\d\n", last), last
    said = wait_for(lambda: _log(gpuq, timed))
    assert re.fullmatch(rf"gpuq: job {timed} stopped at \d\d:\d\d:\d\d: time limit of 2s reached\n", said), said
    assert _log(gpuq, done) == "fine\n"


def test_gpuq_wait_off_a_terminal_ends_with_a_line_saying_how_the_jobs_ended(gpuq: Gpuq) -> None:
    ok = gpuq.submit("--gpus", "0", "true")
    bad = gpuq.submit("--gpus", "0", "sh", "-c", "exit 3")
    waited = gpuq.run("wait", str(ok), check=False)
    assert waited.returncode == 0 and waited.stderr == "gpuq: 1 succeeded\n"
    waited = gpuq.run("wait", str(ok), str(bad), check=False)
    assert waited.returncode == 1
    assert waited.stderr.splitlines()[-1] == f"gpuq: 1 succeeded, 1 failed: job {bad} failed: exit code 3"


def test_gpuq_run_off_a_terminal_says_that_it_waits_and_how_its_job_ended(one_gpu: Gpuq) -> None:
    blocker = one_gpu.submit("sleep", "600")
    one_gpu.wait_state(blocker, "running")
    client = _gpuq_run_in_background(one_gpu, "sh", "-c", "exit 4")
    one_gpu.wait_state(blocker + 1, "pending")
    wait_for(lambda: one_gpu.job(blocker + 1)["reason"], what="a reason to wait")
    one_gpu.run("cancel", str(blocker))
    _, err = client.communicate(timeout=60)
    assert client.returncode == 4
    lines = err.splitlines()
    assert lines[0].startswith(f"gpuq: job {blocker + 1} waits (1 in line): "), err
    assert lines[1].startswith(f"gpuq: job {blocker + 1} starts (GPUs 0) after "), err
    assert lines[-1] == f"gpuq: job {blocker + 1} failed: exit code 4", err


def test_an_array_sweeps_over_named_values_and_their_product(gpuq: Gpuq) -> None:
    """--array took only indices: a sweep over learning rates needed an index table in the user's script."""
    (gpuq.cwd / "train.py").write_text("import sys; print(sys.argv[1:])\n")
    done = gpuq.run(
        "submit",
        "--gpus",
        "0",
        "--array",
        "lr=1e-4,1e-3",
        "train.py",
        "--lr",
        "{lr}",
        "--seed",
        "{seed}",
        "--array",
        "seed=1,2,3%2",
        "--json",
    )
    submitted = json.loads(done.stdout)
    array_id, members = submitted["id"], submitted["jobs"]
    assert len(members) == 6
    gpuq.run("wait", str(array_id))
    shown = [gpuq.job(member) for member in members]
    assert [job["values"] for job in shown] == [
        {"lr": lr, "seed": seed} for lr in ("1e-4", "1e-3") for seed in ("1", "2", "3")
    ]
    assert _log(gpuq, members[1]) == "['--lr', '1e-4', '--seed', '2']\n"
    assert shown[1]["name"] == "train.py lr=1e-4 seed=2"
    assert re.search(r"\nvalues +lr=1e-4 seed=2\n", gpuq.run("show", str(members[1])).stdout)
    assert "train.py lr=1e-3 seed=3" in gpuq.run("status", "--expand").stdout


BAD_SWEEPS = [
    (["--array", "lr=1e-4,1e-3", "echo", "lr"], "write {lr} in the command where each member's value goes"),
    (["--array", "0-3", "--array", "lr=1,2", "echo", "{lr}"], "not both"),
    (["--array", "lr=1,1", "echo", "{lr}"], "a value is given twice"),
    (["--array", "lr=", "echo", "{lr}"], "give its values separated by commas"),
    (["--array", "l-r=1", "echo", "{l-r}"], "a name is letters, digits and _"),
    (
        [
            *("--array", "a=" + ",".join(map(str, range(100)))),
            *("--array", "b=" + ",".join(map(str, range(101)))),
            "echo",
            "{a}",
            "{b}",
        ],
        "more than 10000 combinations",
    ),
]


def test_a_bad_sweep_is_refused_in_one_line_and_queues_nothing(gpuq: Gpuq) -> None:
    for args, says in BAD_SWEEPS:
        refused = gpuq.run("submit", *args, check=False)
        assert refused.returncode == 2 and says in refused.stderr and len(refused.stderr.splitlines()) == 1, refused
    assert gpuq.status() == []


def test_an_arrays_id_is_taken_by_show_logs_status_cancel_and_wait(gpuq: Gpuq) -> None:
    """`gpuq status` listed array 3, but `gpuq show 3` and `gpuq logs 3` said "no job 3", `gpuq status 3` was
    refused, and a folded row with failures did not say why."""
    (gpuq.cwd / "train.py").write_text("import sys; print('index', sys.argv[1]); sys.exit(int(sys.argv[1]) == 1)\n")
    array_id = gpuq.submit("--gpus", "0", "--array", "0-2", "--name", "sweep", "train.py", "{index}")
    other = gpuq.submit("--gpus", "0", "true")
    waited = gpuq.run("wait", str(array_id), check=False)
    assert waited.returncode == 1 and waited.stderr.splitlines()[-1].startswith("gpuq: 2 succeeded, 1 failed: job ")
    failed = array_id + 2
    shown = gpuq.run("show", str(array_id)).stdout.splitlines()
    assert shown[0] == f"array {array_id}: sweep, 3 jobs: 2 succeeded, 1 failed"
    assert shown[2].split()[:3] == [str(failed), "1", "failed"] and shown[2].split()[-1] == "1"  # failures first
    assert [job["id"] for job in json.loads(gpuq.run("show", "--json", str(array_id)).stdout)["jobs"]] == [
        array_id + 1,
        array_id + 2,
        array_id + 3,
    ]
    logs = gpuq.run("logs", str(array_id)).stdout
    assert logs == "".join(f"==> job {array_id + 1 + i} (index {i}) <==\nindex {i}\n" for i in range(3))
    assert gpuq.run("logs", "-f", str(array_id)).stdout == logs
    for args in ([str(array_id)], ["-j", f"{array_id},{other}"]):
        listed = gpuq.run("status", *args).stdout.splitlines()
        assert len(listed) == 1 + len(args) and listed[1].startswith(f"{array_id} "), listed
        assert f"job {failed}: exit code 1" in listed[1]
    assert len(gpuq.run("status", "--expand", str(array_id)).stdout.splitlines()) == 4
    assert gpuq.run("cancel", str(array_id)).stdout == f"array {array_id} has already ended\n"
