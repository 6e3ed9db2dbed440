"""The successor hand-off: a job that comes next on a busy GPU is staged behind the job running there, and
that job's shim starts it the moment the first ends. Whatever happens meanwhile (a cancel, a hold, a pause, a
more urgent job, the daemon or the shim killed), each job runs once, never on a GPU that is not free.

Real daemon, real shims, one fake GPU, so that every job after the first is a candidate.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import Gpuq, make_env, wait_for

STAMP = 'echo "$GPUQ_JOB_ID $(date +%s.%N)" >> "$1"; sleep "$2"; echo "$GPUQ_JOB_ID $(date +%s.%N)" >> "$1"'


def stamped(gpuq: Gpuq, seconds: float, *options: str) -> int:
    """A job that appends its id and the time to stamps.txt when it starts and when it ends."""
    return gpuq.submit(*options, "sh", "-c", STAMP, "job", str(gpuq.cwd / "stamps.txt"), str(seconds))


def passes_went_by(gpuq: Gpuq, after: int) -> None:
    """Two of the daemon's passes began since this call (each took in a job that waits on ``after``), so the
    first of them ran whole: whatever a pass would do now, it has done. The event itself, not a sleep that
    a slow machine outlasts."""
    for _ in range(2):
        gpuq.wait_state(gpuq.submit("--gpus", "0", "--after", str(after), "true"), "pending")


def stamps(gpuq: Gpuq) -> dict[int, list[float]]:
    found: dict[int, list[float]] = {}
    path = gpuq.cwd / "stamps.txt"
    for line in path.read_text().splitlines() if path.exists() else []:
        job, at = line.split()
        found.setdefault(int(job), []).append(float(at))
    return found


def events(gpuq: Gpuq, kind: str) -> list[dict[str, Any]]:
    lines = (gpuq.home / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == kind]


def staged_behind(gpuq: Gpuq, job_id: int, ahead: int) -> None:
    """Wait until `gpuq status` says ``job_id`` goes next on the GPU of ``ahead``."""
    wait_for(lambda: f"when job {ahead} ends" in gpuq.job(job_id).get("reason", ""), 10, f"job {job_id} staged")


def test_jobs_queued_behind_a_running_one_start_from_its_shim_once_each_in_order(one_gpu: Gpuq) -> None:
    gpuq = one_gpu
    gpuq.run("pause")
    ids = [stamped(gpuq, 0.4) for _ in range(5)]
    gpuq.run("unpause")
    for job_id in ids:
        gpuq.wait_state(job_id, "succeeded")
    runs = stamps(gpuq)
    assert all(len(runs[job_id]) == 2 for job_id in ids), runs  # one start and one end each: ran once
    for before, after in itertools.pairwise(ids):
        assert runs[after][0] >= runs[before][1], "a job started before the one ahead of it on the GPU ended"
    handed = {e["job"]: e["after"] for e in events(gpuq, "started") if "after" in e}
    assert handed == {after: before for before, after in itertools.pairwise(ids)}
    for job_id in ids[1:]:
        shown = gpuq.job(job_id)
        assert shown["gpus"] == [0] and shown["started_at"] is not None


def test_successors_that_end_before_their_hand_off_is_recorded_are_recorded_ended(one_gpu: Gpuq) -> None:
    """The daemon records a hand-off a few ms after it (once the burst settles): an instant job has ended by
    then, and its exit file must survive the hand-off's records."""
    gpuq = one_gpu
    gpuq.run("pause")
    ids = [stamped(gpuq, 0.3), *(stamped(gpuq, 0) for _ in range(4))]
    gpuq.run("unpause")
    for job_id in ids:
        gpuq.wait_state(job_id, "succeeded", timeout=20)
    assert any("after" in e for e in events(gpuq, "started")), "no job was handed off"


def test_a_cancelled_staged_job_never_runs_and_the_queue_goes_on(one_gpu: Gpuq) -> None:
    gpuq = one_gpu
    first = stamped(gpuq, 1.5)
    staged = stamped(gpuq, 0)
    later = stamped(gpuq, 0)
    staged_behind(gpuq, staged, first)
    gpuq.run("cancel", str(staged))
    assert gpuq.wait_state(staged, "cancelled")["started_at"] is None
    gpuq.wait_state(first, "succeeded")
    gpuq.wait_state(later, "succeeded")
    assert staged not in stamps(gpuq)
    # What its shim made for it ahead of its start (launcher.supervisor.ahead) went with it.
    assert not (gpuq.home / "logs" / f"{staged}.log").exists()
    assert not list((gpuq.home / "run").glob(".*.tmp"))


def test_a_staged_jobs_files_are_made_while_the_job_ahead_runs(one_gpu: Gpuq) -> None:
    """Its exit file and pid file too (as temp files to fill and rename in): creating a file is what costs
    most between one job's end and the next one's start."""
    gpuq = one_gpu
    first = gpuq.submit("sh", "-c", "while [ ! -e go ]; do sleep 0.05; done")  # runs until let go below
    staged = stamped(gpuq, 0)
    staged_behind(gpuq, staged, first)
    run = gpuq.home / "run"
    made = lambda: [name for name in (f"{staged}.exit", f"{staged}.pid") if list(run.glob(f".{name}.*.tmp"))]  # noqa: E731
    wait_for(lambda: len(made()) == 2, 10, f"the temp files of job {staged}'s exit and pid files")
    assert gpuq.job(first)["state"] == "running"
    (gpuq.cwd / "go").touch()
    assert gpuq.wait_state(staged, "succeeded")["state"] == "succeeded"
    assert not list(run.glob(".*.tmp"))


def test_holding_a_staged_job_keeps_it_from_starting_until_released(one_gpu: Gpuq) -> None:
    gpuq = one_gpu
    first = stamped(gpuq, 1.5)
    staged = stamped(gpuq, 0)
    staged_behind(gpuq, staged, first)
    gpuq.run("hold", str(staged))
    gpuq.wait_state(first, "succeeded")
    passes_went_by(gpuq, staged)
    shown = gpuq.job(staged)
    assert shown["state"] == "pending" and shown["held"], shown
    assert staged not in stamps(gpuq)
    gpuq.run("release", str(staged))
    gpuq.wait_state(staged, "succeeded")
    assert len(stamps(gpuq)[staged]) == 2


@pytest.mark.parametrize("stop, go", [(["pause"], ["unpause"]), (["drain", "0"], ["undrain", "0"])])
def test_a_paused_queue_or_a_drained_gpu_takes_a_staged_job_back(one_gpu: Gpuq, stop: list[str], go: list[str]) -> None:
    gpuq = one_gpu
    first = stamped(gpuq, 1.5)
    staged = stamped(gpuq, 0)
    staged_behind(gpuq, staged, first)
    gpuq.run(*stop)
    gpuq.wait_state(first, "succeeded")
    passes_went_by(gpuq, staged)
    assert gpuq.job(staged)["state"] == "pending"
    gpuq.run(*go)
    gpuq.wait_state(staged, "succeeded")
    assert len(stamps(gpuq)[staged]) == 2


def test_a_more_urgent_job_goes_before_a_staged_one(one_gpu: Gpuq) -> None:
    gpuq = one_gpu
    first = stamped(gpuq, 1.5)
    staged = stamped(gpuq, 0.2)
    staged_behind(gpuq, staged, first)
    urgent = stamped(gpuq, 0.2, "--priority", "5")
    gpuq.wait_state(staged, "succeeded")
    gpuq.wait_state(urgent, "succeeded")
    runs = stamps(gpuq)
    assert runs[first][1] <= runs[urgent][0] < runs[urgent][1] <= runs[staged][0]


def test_a_daemon_killed_while_a_job_is_staged_runs_it_exactly_once(one_gpu: Gpuq) -> None:
    gpuq = one_gpu
    first = stamped(gpuq, 2)
    staged = stamped(gpuq, 0)
    staged_behind(gpuq, staged, first)
    gpuq.kill_daemon()
    gpuq.run("daemon", "start")
    gpuq.wait_state(first, "succeeded")
    gpuq.wait_state(staged, "succeeded")
    runs = stamps(gpuq)
    assert len(runs[staged]) == 2 and runs[staged][0] >= runs[first][1], runs
    assert [e["job"] for e in events(gpuq, "started")].count(staged) == 1
    assert not list((gpuq.home / "run").glob("*.next")) and not list((gpuq.home / "run").glob(".*.tmp"))


def test_a_killed_shim_leaves_its_staged_job_to_run_once(one_gpu: Gpuq) -> None:
    gpuq = one_gpu
    first = stamped(gpuq, 30)
    staged = stamped(gpuq, 0)
    staged_behind(gpuq, staged, first)
    pid_file = gpuq.home / "run" / f"{first}.pid"
    job_pid = wait_for(lambda: pid_file.exists() and json.loads(pid_file.read_text())["pid"], 10, "the first job's pid")
    os.kill(psutil.Process(job_pid).ppid(), signal.SIGKILL)
    assert gpuq.wait_state(first, "lost")["state"] == "lost"
    gpuq.wait_state(staged, "succeeded")
    assert len(stamps(gpuq)[staged]) == 2


def test_a_staged_job_goes_to_a_gpu_that_frees_first_rather_than_wait(tmp_path: Path) -> None:
    home, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    gpuq = Gpuq(home, make_env(home, fake="2x80GiB"), work)
    try:
        gpuq.run("pause")
        long = stamped(gpuq, 600)  # far beyond the wait below: "still running" holds by construction
        short = stamped(gpuq, 2)
        staged = stamped(gpuq, 0)
        gpuq.run("unpause")
        staged_behind(gpuq, staged, long)  # both started in one pass: the lower id is first in line
        ran = gpuq.wait_state(staged, "succeeded", timeout=20)
        assert gpuq.job(long)["state"] == "running", "the staged job waited for the long job to end"
        assert ran["gpus"] == gpuq.job(short)["gpus"] and len(stamps(gpuq)[staged]) == 2
    finally:
        gpuq.cleanup()
