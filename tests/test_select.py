"""Choosing jobs by name, state and user instead of listing ids (issue #39, friction 7), on a real daemon with
fake GPUs: `gpuq status`, `cancel`, `hold`, `release`, `suspend` and `resume` with --name, --state, --user,
`gpuq status --me` and `gpuq cancel --all`. Another user's jobs: tests/test_select_shared.py."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from gpuq_scheduler.jobs.units import format_duration, format_energy, format_gpu_hours, format_size
from tests.conftest import Gpuq, fake_cuda_queue, wait_for

COUNTER = Path(__file__).parent / "fixtures" / "fake_counter.py"


def _states(gpuq: Gpuq) -> dict[int, str]:
    return {job["id"]: job["state"] for job in gpuq.status()}


def _listed(text: str) -> list[int]:
    """The ids of a status table's rows."""
    return [int(line.split()[0]) for line in text.splitlines()[1:]]


def test_cancel_all_is_told_of_the_option_and_cancel_dash_all_stops_every_job_of_ones_own(gpuq: Gpuq) -> None:
    """`gpuq cancel all` said "'all' is not a valid integer", and nothing cancelled all of one's jobs."""
    jobs = [gpuq.submit("--gpus", "1", "sleep", "300") for _ in range(3)]
    waiting = gpuq.submit("--gpus", "4", "sleep", "300")
    wait_for(lambda: all(_states(gpuq)[j] == "running" for j in jobs), 60, "three jobs to run")
    typo = gpuq.run("cancel", "all", check=False)
    assert typo.returncode == 2 and typo.stdout == ""
    assert typo.stderr.splitlines() == [
        "gpuq: `gpuq cancel all`: ids are numbers; to cancel all your jobs, type `gpuq cancel --all`"
    ]
    assert set(_states(gpuq).values()) == {"running", "pending"}  # nothing changed
    done = gpuq.run("cancel", "--all")
    assert done.stdout == f"cancelling 4 job(s) chosen by --all: {', '.join(map(str, [*jobs, waiting]))}\n"
    wait_for(lambda: set(_states(gpuq).values()) == {"cancelled"}, 60, "every job to be cancelled")
    again = gpuq.run("cancel", "--all")
    assert again.stdout == "you have no active job; nothing to cancel\n"


def test_status_and_cancel_choose_jobs_by_name_and_state(gpuq: Gpuq) -> None:
    seeds = [gpuq.submit("--name", f"seed-{i}", "sleep", "300") for i in range(3)]
    big = gpuq.submit("--name", "pretrain", "--gpus", "4", "sleep", "300")
    wait_for(lambda: all(_states(gpuq)[j] == "running" for j in seeds), 60, "the seeds to run")
    assert _listed(gpuq.run("status", "--name", "seed-*").stdout) == seeds
    assert _listed(gpuq.run("status", "--state", "pending").stdout) == [big]
    assert _listed(gpuq.run("status", "--state", "PENDING,running").stdout) == [*seeds, big]
    assert _listed(gpuq.run("status", "--me").stdout) == [*seeds, big]
    me = pwd.getpwuid(os.getuid()).pw_name  # the fixture's jobs are this process's user's
    assert _listed(gpuq.run("status", "--user", me, "--name", "pre*").stdout) == [big]
    assert gpuq.run("status", "--name", "nothing*").stdout.startswith("no job matches --name 'nothing*'")

    pending = gpuq.run("cancel", "--state", "pending")
    assert pending.stdout == f"cancelling 1 job(s) chosen by --state pending: {big}\n"
    gpuq.wait_state(big, "cancelled")
    assert all(_states(gpuq)[j] == "running" for j in seeds)
    named = gpuq.run("cancel", "--name", "seed-[01]")
    assert named.stdout == f"cancelling 2 job(s) chosen by --name 'seed-[01]': {seeds[0]}, {seeds[1]}\n"
    wait_for(lambda: [_states(gpuq)[j] for j in seeds] == ["cancelled", "cancelled", "running"], 60, "two cancelled")
    none = gpuq.run("cancel", "--name", "seed-0")  # cancelled already: no active job of that name
    assert none.returncode == 0 and none.stdout == "no active job of yours matches --name 'seed-0'; nothing to cancel\n"
    ended = gpuq.run("status", "--state", "cancelled").stdout
    assert _listed(ended) == [seeds[0], seeds[1], big]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["cancel", "--state", "bogus"], "--state 'bogus': not a job state; give one of pending, running, suspended"),
        (["cancel", "--state", "failed"], "--state 'failed': a failed job cannot be chosen here"),
        (["cancel", "--user", "gqx-nobody-here"], "--user 'gqx-nobody-here': no such user on this machine"),
        (["status", "--user", "gqx-nobody-here"], "--user 'gqx-nobody-here': no such user on this machine"),
        (["status", "--state", "done"], "--state 'done': not a job state"),
        (["cancel"], "`gpuq cancel` needs job ids, or jobs chosen with --name GLOB, --state STATE or --user NAME"),
        (["hold"], "`gpuq hold` needs job ids, or jobs chosen with"),
        (["release", "all"], "to release all your jobs, type `gpuq release --user "),
        (["suspend"], "`gpuq suspend` needs job ids, or jobs chosen with"),
        (["hold", "--state", "running"], "--state 'running': a running job cannot be chosen here; give one of pending"),
    ],
)
def test_a_bad_selection_is_one_line_exit_2_and_changes_nothing(gpuq: Gpuq, args: list[str], says: str) -> None:
    job = gpuq.submit("--name", "keep", "sleep", "300")
    gpuq.wait_state(job, "running")
    result = gpuq.run(*args, check=False)
    assert result.returncode == 2 and result.stdout == "", result
    assert len(result.stderr.splitlines()) == 1 and says in result.stderr, result.stderr
    assert _states(gpuq) == {job: "running"} and not gpuq.job(job)["held"]


def test_hold_and_release_choose_pending_jobs_by_name(one_gpu: Gpuq) -> None:
    first = one_gpu.submit("--name", "first", "sleep", "300")
    one_gpu.wait_state(first, "running")
    evals = [one_gpu.submit("--name", f"eval-{i}", "true") for i in range(2)]
    train = one_gpu.submit("--name", "train", "true")
    held = one_gpu.run("hold", "--name", "eval-*")
    assert held.stdout == f"held 2 pending job(s) chosen by --name 'eval-*': {evals[0]}, {evals[1]}\n"
    wait_for(lambda: all(one_gpu.job(j)["held"] for j in evals), 30, "the evals to be held")
    assert not one_gpu.job(train)["held"]
    again = one_gpu.run("release", "--name", "train")  # not held: nothing to release
    assert again.stdout == "no held job of yours matches --name 'train'; nothing to release\n"
    released = one_gpu.run("release", "--name", "eval-1")
    assert released.stdout == f"released 1 pending job(s) chosen by --name 'eval-1': {evals[1]}\n"
    wait_for(lambda: not one_gpu.job(evals[1])["held"], 30, "eval-1 to be released")
    assert one_gpu.job(evals[0])["held"]


def test_suspend_and_resume_choose_jobs_by_name(tmp_path: Path) -> None:
    queue = fake_cuda_queue(tmp_path, "2x80GiB", GPUQ_FAKE_HOST_MEMORY="256GiB", GPUQ_FAKE_CHECKPOINT_SECONDS="0")
    shutil.copy(COUNTER, queue.cwd / "fake_counter.py")
    try:
        counts = [queue.cwd / f"counts{i}" for i in range(2)]
        jobs = [
            queue.submit("--name", f"sweep-{i}", "fake_counter.py", "4", str(c), "100000") for i, c in enumerate(counts)
        ]
        for job, count in zip(jobs, counts, strict=True):
            wait_for(lambda job=job, count=count: count.exists() and queue.job(job)["peak_mem"], 30, "a count")
        suspended = queue.run("suspend", "--name", "sweep-1")
        assert suspended.stdout == f"suspending job {jobs[1]}\n1 job(s) chosen by --name 'sweep-1': {jobs[1]}\n"
        queue.wait_state(jobs[1], "suspended")
        assert queue.job(jobs[0])["state"] == "running"
        resumed = queue.run("resume", "--name", "sweep-*")  # of the two, only the suspended one resumes
        assert resumed.stdout == f"resuming job {jobs[1]}\n1 job(s) chosen by --name 'sweep-*': {jobs[1]}\n"
        queue.wait_state(jobs[1], "running")
        queue.run("cancel", "--name", "sweep-*")
        for job in jobs:
            queue.wait_state(job, "cancelled")
    finally:
        queue.cleanup()


def test_status_format_picks_columns_as_sacct_does_and_the_config_sets_the_default(tmp_path: Path) -> None:
    from gpuq_scheduler.launcher.views import columns  # here: a module gpuq had not before issue #39

    queue = fake_cuda_queue(tmp_path, "1x80GiB", GPUQ_CONFIG=str(tmp_path / "config.toml"))
    try:
        job = queue.submit("--mem", "4G", "--name", "held-memory", "fake_cuda.py", "2", "3")
        record = queue.wait_state(job, "succeeded", "failed")
        assert record["state"] == "succeeded" and record["peak_mem"] and record["gpu_energy_j"], record
        listing = queue.run("status", "--all", "--format", "id,name,state,gpus,runtime,peak_mem,gpu_hours,energy")
        header, row = listing.stdout.splitlines()
        assert header.split() == ["ID", "NAME", "STATE", "GPUS", "RUNTIME", "PEAK", "MEM", "GPU-HOURS", "ENERGY"]
        assert row.split() == [
            str(job),
            "held-memory",
            "succeeded",
            "1",
            format_duration(record["ended_at"] - record["started_at"]),
            *format_size(record["peak_mem"]).split(),
            format_gpu_hours(record["gpu_hours"]),
            *format_energy(record["gpu_energy_j"]).split(),
        ]

        unknown = queue.run("status", "--format", "id,gpu_ids", check=False)
        assert unknown.returncode == 2 and unknown.stdout == ""
        assert unknown.stderr.splitlines() == [
            "gpuq: --format: no column 'gpu_ids'; the columns are " + ",".join(columns.COLUMNS)
        ]
        assert "peak_mem,gpu_hours,energy" in unknown.stderr

        (tmp_path / "config.toml").write_text('[status]\nformat = "id, state, on"\n')
        default = queue.run("status", "--all").stdout.splitlines()
        assert default[0].split() == ["ID", "STATE", "ON"] and default[1].split() == [str(job), "succeeded", "0"]
        assert queue.run("status", "--all", "--format", "name").stdout.splitlines()[0] == "NAME"  # the flag wins
        (tmp_path / "config.toml").write_text('[status]\nformat = "id,colour"\n')
        wrong = queue.run("status", check=False)
        assert wrong.returncode == 2 and len(wrong.stderr.splitlines()) == 1
        assert f"{tmp_path / 'config.toml'}: status.format: no column 'colour'" in wrong.stderr
    finally:
        queue.cleanup()
