"""Cluster jobs through a real Slurm: `gpuq submit --on lab` runs real sbatch against a private
slurmctld + slurmd (tests/slurm_local.py, 4 fake GPUs), slurmd runs the jobs, and gpuq reads back what
happened with squeue and the jobs' exit files. No Slurm command is faked.

Needs root and Debian's slurmctld, slurmd and slurm-client; skipped elsewhere, but under CI (which
installs them, .ci/run) a missing Slurm fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPORT, Gpuq, make_env, read_reports, wait_for
from tests.slurm_local import LocalSlurm, missing_commands


def _why_not() -> str | None:
    missing = missing_commands()
    if missing:
        return f"needs Slurm (no {', '.join(missing)}): apt-get install slurmctld slurmd slurm-client"
    if os.geteuid() != 0:
        return "needs root: a private slurmd runs jobs as their submitters, and its fake GPUs are mknod devices"
    return None


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(WHY_NOT is not None and not os.environ.get("CI"), reason=WHY_NOT or "")

# sched_interval=1: a requeued job (a retry) waits for the main scheduling pass, by default once a minute;
# cred_expire=5: Slurm holds a requeued job back that long (120 s by default) before it may start again.
FAST = ["SchedulerParameters=batch_sched_delay=0,sched_interval=1", "AuthInfo=cred_expire=5"]


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    if WHY_NOT is not None:
        pytest.fail(f"CI runs the Slurm tests, but {WHY_NOT}")
    with LocalSlurm(gpus=4, extra_conf=FAST) as instance:
        yield instance


@pytest.fixture
def gpuq(tmp_path: Path, slurm: LocalSlurm) -> Iterator[Gpuq]:
    yield from _client(tmp_path, slurm)


def _client(tmp_path: Path, slurm: LocalSlurm) -> Iterator[Gpuq]:
    home = tmp_path / "state dir 'quoted'"
    work = tmp_path / "work dir"
    work.mkdir()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[clusters.lab]\nbackend = "slurm"\npartition = "{slurm.partition}"\n\n'
        '[clusters.broken]\npartition = "no-such-partition"\n'
    )
    env = make_env(
        home, SLURM_CONF=str(slurm.conf), GPUQ_CONFIG=str(config), GPUQ_SYSTEM_CONFIG=str(tmp_path / "no system config")
    )
    client = Gpuq(home, env, work)
    yield client
    client.cleanup()
    slurm.run("scancel", f"--partition={slurm.partition}", check=False)


def _member_script(gpuq: Gpuq, report: Path, seconds: float) -> str:
    """A job that says who it is on stdout (its log), then reports what it saw like the local tests' jobs."""
    path = gpuq.cwd / "member.sh"
    path.write_text(
        '#!/bin/sh\necho "job $GPUQ_JOB_ID array $GPUQ_ARRAY_ID index $GPUQ_ARRAY_INDEX arg $1 attempt $GPUQ_ATTEMPT"\n'
        f"exec '{sys.executable}' '{REPORT}' '{report}' {seconds}\n"
    )
    path.chmod(0o755)
    return str(path)


def _by_id(gpuq: Gpuq) -> dict[int, dict[str, Any]]:
    return {record["id"]: record for record in gpuq.status()}


def _slurm_state(slurm: LocalSlurm, external_id: str) -> str:
    job, _, task = external_id.partition("_")
    lines = slurm.run("squeue", "-h", "-r", "-t", "all", "-j", job, "-O", "ArrayTaskID:|,State:|").splitlines()
    return {line.split("|")[0]: line.split("|")[1] for line in lines}.get(task or "N/A", "forgotten")


def test_a_two_gpu_job_runs_on_slurm_and_reports_like_a_local_job(gpuq: Gpuq, slurm: LocalSlurm) -> None:
    local = gpuq.submit("--gpus", "0", "true")  # on this machine's fake GPUs, through the local daemon
    report = gpuq.cwd / "seen.jsonl"
    started = time.monotonic()
    result = gpuq.run("submit", "--on", "lab", "--gpus", "2", "--name", "two", str(REPORT), str(report), "0.3")
    assert result.stdout.startswith("submitted job ") and result.stdout.strip().endswith(" to lab")
    job_id = int(result.stdout.split()[2])
    assert gpuq.run("wait", str(job_id), str(local)).returncode == 0
    took = time.monotonic() - started

    records = _by_id(gpuq)
    record = records[job_id]
    assert set(record) == set(records[local])  # the same `gpuq status --json` fields as a local job
    assert records[local]["cluster"] is None
    assert record["state"] == "succeeded" and record["exit_code"] == 0 and record["name"] == "two"
    assert record["cluster"] == "lab" and record["external_id"].isdigit() and record["node"] == slurm.node
    assert _slurm_state(slurm, record["external_id"]) == "COMPLETED"
    (seen,) = read_reports(report)
    assert seen["job"] == job_id and seen["cwd"] == str(gpuq.cwd) and seen["order"] == "PCI_BUS_ID"
    assert len(record["gpus"]) == 2 and seen["cvd"] == ",".join(map(str, record["gpus"]))  # Slurm's GRES choice
    assert record["submitted_at"] <= record["started_at"] <= record["ended_at"]
    assert "slurm job" in gpuq.run("show", str(job_id)).stdout
    assert f"lab:{record['external_id']}" in gpuq.run("status").stdout
    assert took < 30, f"a 0.3 s job took {took:.1f}s through Slurm"


def test_an_array_with_a_throttle_runs_each_member_under_its_own_id(gpuq: Gpuq, slurm: LocalSlurm) -> None:
    report = gpuq.cwd / "seen.jsonl"
    script = _member_script(gpuq, report, 0.6)
    out = json.loads(gpuq.run("submit", "--on", "lab", "--json", "--array", "0-5%2", script, "{index}").stdout)
    array_id, members = out["id"], out["jobs"]
    assert members == list(range(array_id + 1, array_id + 7))
    after = gpuq.submit("--on", "lab", "--after", str(array_id), "--gpus", "0", str(REPORT), str(report), "0")
    assert gpuq.run("wait", str(array_id), str(after)).returncode == 0

    records = _by_id(gpuq)
    slurm_array = records[members[0]]["external_id"].split("_")[0]
    for index, member in enumerate(members):
        record = records[member]
        assert record["state"] == "succeeded" and record["array_id"] == array_id and record["array_index"] == index
        assert record["external_id"] == f"{slurm_array}_{index}" and len(record["gpus"]) == 1
        log = gpuq.run("logs", str(member)).stdout
        assert log == f"job {member} array {array_id} index {index} arg {index} attempt 1\n"
    seen = {line["job"]: line for line in read_reports(report)}
    assert set(seen) == {*members, after}
    spans = [(seen[m]["start"], seen[m]["end"]) for m in members]
    most = max(sum(1 for s, e in spans if s <= moment < e) for moment, _ in spans)
    assert most == 2, f"the throttle of 2 was not honoured: {most} members ran at once"
    assert seen[after]["start"] >= max(end for _, end in spans)  # --after ARRAY waited for every member
    assert f"lab:{slurm_array}" in gpuq.run("status").stdout  # one folded line for the array


def test_a_dependency_chain_runs_in_order_and_a_failure_stops_what_needs_it(gpuq: Gpuq) -> None:
    report = gpuq.cwd / "seen.jsonl"
    first = gpuq.submit("--on", "lab", "--gpus", "0", str(REPORT), str(report), "0.4")
    second = gpuq.submit("--on", "lab", "--gpus", "0", "--after", str(first), str(REPORT), str(report), "0.2")
    third = gpuq.submit("--on", "lab", "--gpus", "0", "--after", str(second), str(REPORT), str(report), "0", "4")
    never = gpuq.submit("--on", "lab", "--gpus", "0", "--after", str(third), str(REPORT), str(report), "0")
    anyway = gpuq.submit(
        "--on", "lab", "--gpus", "0", "--after", str(third), "--after-any", str(REPORT), str(report), "0"
    )
    result = gpuq.run("wait", str(first), str(second), str(third), str(never), str(anyway), check=False)
    assert result.returncode == 1

    records = _by_id(gpuq)
    seen = {line["job"]: line for line in read_reports(report)}
    assert set(seen) == {first, second, third, anyway}
    assert seen[first]["end"] <= seen[second]["start"] and seen[second]["end"] <= seen[third]["start"]
    assert seen[third]["end"] <= seen[anyway]["start"]
    assert records[third]["state"] == "failed" and records[third]["exit_code"] == 4
    assert records[never]["state"] == "cancelled"
    assert records[never]["reason"] == f"not run: dependency {third} failed (exit code 4)"
    assert records[never]["started_at"] is None
    assert records[anyway]["state"] == "succeeded"


def test_cancel_stops_a_running_job_and_a_whole_pending_array(gpuq: Gpuq, slurm: LocalSlurm) -> None:
    marker = gpuq.cwd / "finished"
    # `&&`, not `;`: proctrack/linuxproc signals the job's processes one at a time, so `sleep` may die a moment
    # before `sh` does; the marker means the job ran to its end, which a cancelled job must not.
    running = gpuq.submit("--on", "lab", "sh", "-c", f"sleep 30 && touch '{marker}'")
    record = gpuq.wait_state(running, "running")
    assert record["node"] == slurm.node
    slurm.hold_partition()  # the array stays pending while we cancel it
    try:
        array = json.loads(gpuq.run("submit", "--on", "lab", "--json", "--array", "0-3", "true").stdout)
        assert gpuq.run("cancel", str(running), str(array["id"])).stdout.splitlines() == [
            f"cancelling job {running}",
            f"cancelling array {array['id']} (4 active job(s))",
        ]
    finally:
        slurm.release_partition()
    records = _by_id(gpuq)  # recorded at once, not when someone next looks
    for job_id in [running, *array["jobs"]]:
        assert records[job_id]["state"] == "cancelled" and records[job_id]["reason"] == "cancelled by root"
        assert _slurm_state(slurm, records[job_id]["external_id"]) == "CANCELLED"
    assert all(records[m]["started_at"] is None for m in array["jobs"])
    assert gpuq.run("cancel", str(running)).stdout == f"job {running} has already ended\n"
    assert gpuq.run("wait", str(running), check=False).returncode == 1
    time.sleep(1)
    assert not marker.exists()
    assert not (gpuq.home / "daemon.pid").exists()  # cluster jobs alone never start a local daemon


def test_a_failed_attempt_is_requeued_by_slurm_and_retried(gpuq: Gpuq) -> None:
    flaky = 'echo "attempt $GPUQ_ATTEMPT"; [ "$GPUQ_ATTEMPT" -ge 2 ] || exit 3'
    job_id = gpuq.submit("--on", "lab", "--gpus", "1", "--retries", "2", "sh", "-c", flaky)
    assert gpuq.run("wait", str(job_id), timeout=120).returncode == 0
    record = gpuq.job(job_id)
    assert record["state"] == "succeeded" and record["attempt"] == 2
    log = gpuq.run("logs", str(job_id)).stdout
    assert "attempt 1\ngpuq: attempt 1 of 3 ended with exit code 3; Slurm runs it again\n" in log
    assert log.endswith("attempt 2\n")


def _refused(gpuq: Gpuq, *args: str) -> str:
    before = [r["id"] for r in gpuq.status()] if gpuq.home.exists() else []
    result = gpuq.run(*args, check=False)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuq: "), result.stderr
    assert ([r["id"] for r in gpuq.status()] if gpuq.home.exists() else []) == before  # nothing recorded
    return lines[0]


def test_what_cannot_run_there_is_refused_in_one_line_and_nothing_is_recorded(gpuq: Gpuq) -> None:
    message = _refused(gpuq, "submit", "--on", "broken", "true")
    assert message == (
        "gpuq: sbatch refused the job on cluster broken: Batch job submission failed: Invalid partition name specified"
    )
    assert "Requested node configuration is not available" in _refused(
        gpuq, "submit", "--on", "lab", "--gpus", "9", "true"
    )
    assert "no cluster named 'elsewhere' (known: broken, lab)" in _refused(gpuq, "submit", "--on", "elsewhere", "true")
    assert "--mem 1.0G shares a GPU by memory" in _refused(gpuq, "submit", "--on", "lab", "--mem", "1G", "true")
    cluster_job = gpuq.submit("--on", "lab", "--gpus", "0", "sleep", "5")
    local_job = gpuq.submit("--gpus", "0", "sleep", "5")
    assert f"job {cluster_job} runs on cluster lab, and a job on this machine cannot wait for it" in _refused(
        gpuq, "submit", "--after", str(cluster_job), "true"
    )
    assert f"job {local_job} runs on this machine, and a job on cluster lab can only wait for jobs there" in _refused(
        gpuq, "submit", "--on", "lab", "--after", str(local_job), "true"
    )
    gpuq.env["PATH"] = str(Path(sys.executable).parent)  # python, but no Slurm commands
    assert _refused(gpuq, "submit", "--on", "lab", "/bin/true").startswith(
        "gpuq: sbatch not found: run this on a machine with Slurm's client commands"
    )


def test_the_python_api_sends_arrays_and_waits_for_them(gpuq: Gpuq, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuq_scheduler.jobs import api

    for key in ("SLURM_CONF", "GPUQ_CONFIG", "GPUQ_SYSTEM_CONFIG"):
        monkeypatch.setenv(key, gpuq.env[key])
    monkeypatch.chdir(gpuq.cwd)
    array_id, members = api.array(["sh", "-c", "exit {index}"], [0, 1], throttle=1, gpus=0, on="lab", home=gpuq.home)
    records = api.wait([array_id], home=gpuq.home, timeout=60)
    assert [(r.id, r.state.value, r.exit_code, r.cluster) for r in records] == [
        (members[0], "succeeded", 0, "lab"),
        (members[1], "failed", 1, "lab"),
    ]
    assert not (gpuq.home / "daemon.pid").exists()


def test_only_the_owner_or_root_cancels_a_cluster_job(gpuq: Gpuq, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuq_scheduler.jobs.api import readers
    from gpuq_scheduler.jobs.errors import NotPermitted
    from gpuq_scheduler.jobs.store.statedir import StateDir

    monkeypatch.setenv("SLURM_CONF", gpuq.env["SLURM_CONF"])
    job_id = gpuq.submit("--on", "lab", "--gpus", "0", "sleep", "30")
    with pytest.raises(NotPermitted, match=f"job {job_id} belongs to root; only root or an admin can cancel it"):
        readers(StateDir(gpuq.home)).cancel([job_id], uid=4242)
    assert gpuq.job(job_id)["state"] in ("pending", "running")


def test_an_ended_job_slurm_forgot_is_read_from_its_exit_file_or_recorded_lost(tmp_path: Path) -> None:
    """The test Slurm keeps no accounting (no slurmdbd), like many small clusters: once the controller
    forgets a job (MinJobAge, 2 s here), its exit file is all that is left."""
    if WHY_NOT is not None:
        pytest.fail(f"CI runs the Slurm tests, but {WHY_NOT}")
    with LocalSlurm(gpus=4, extra_conf=[*FAST, "MinJobAge=2"], node="forgetful", partition="forgetful") as slurm:
        gpuq = next(_client(tmp_path, slurm))
        kept = gpuq.submit("--on", "lab", "--gpus", "1", "true")
        gone = gpuq.submit("--on", "lab", "--gpus", "1", "true")  # nothing reads their records until below
        wait_for(lambda: not slurm.run("squeue", "-h", "-t", "all", "-o", "%i").strip(), 90, "Slurm to forget")
        assert (gpuq.home / "run" / f"{kept}.exit").exists()
        (gpuq.home / "run" / f"{gone}.exit").unlink()  # as if its node could not write to the state directory
        records = _by_id(gpuq)
        gpuq.cleanup()
    assert records[kept]["state"] == "succeeded" and len(records[kept]["gpus"]) == 1
    assert records[kept]["node"] == "forgetful" and not (gpuq.home / "run" / f"{kept}.exit").exists()
    assert records[gone]["state"] == "lost"
    assert records[gone]["reason"].startswith(f"Slurm no longer knows job {records[gone]['external_id']} ")
    assert "left no exit file" in records[gone]["reason"]


def test_a_lost_id_counter_never_hands_out_a_cluster_jobs_id_again(gpuq: Gpuq) -> None:
    first = gpuq.submit("--on", "lab", "--gpus", "0", "true")
    (gpuq.home / "next_id").unlink()  # rebuilt from jobs.db and the spool, which hold no cluster job
    second = gpuq.submit("--on", "lab", "--gpus", "0", "true")
    assert second > first
    assert gpuq.run("wait", str(first), str(second)).returncode == 0


def test_status_of_cluster_jobs_costs_one_squeue_call_per_cluster(gpuq: Gpuq, slurm: LocalSlurm) -> None:
    slurm.hold_partition()
    try:
        for _ in range(3):
            gpuq.submit("--on", "lab", "--gpus", "0", "true")
        log = gpuq.cwd / "calls"
        shim = gpuq.cwd / "bin"
        shim.mkdir()
        for name in ("squeue", "sacct", "scontrol"):
            real = subprocess.run(["which", name], capture_output=True, text=True, check=True).stdout.strip()
            (shim / name).write_text(f"#!/bin/sh\necho {name} >> '{log}'\nexec {real} \"$@\"\n")
            (shim / name).chmod(0o755)
        gpuq.env["PATH"] = f"{shim}{os.pathsep}{gpuq.env['PATH']}"
        states = [r["state"] for r in gpuq.status()]
        assert states == ["pending"] * 3
        assert log.read_text() == "squeue\n"
    finally:
        slurm.release_partition()


def test_functions_run_on_the_cluster_through_the_same_executor(gpuq: Gpuq) -> None:
    """Executor(on="lab"): the pickles sit in the state directory, which the nodes share (here: one
    machine), and slurmd's job runs them with the submitter's interpreter."""
    path = gpuq.cwd / "sweep.py"
    path.write_text(
        "import json, os\n"
        "from gpuq_scheduler import Executor\n"
        "def where(x):\n"
        "    return x * 10, os.environ.get('SLURM_JOB_ID'), os.environ.get('CUDA_VISIBLE_DEVICES')\n"
        "executor = Executor(gpus=1, on='lab')\n"
        "single = executor.submit(where, 1)\n"
        "many = executor.map_array(where, [2, 3, 4], throttle=2)\n"
        "failing = executor.submit(lambda: 1 / 0)\n"
        "print(json.dumps({'single': single.result(timeout=120), 'many': [j.result(timeout=120) for j in many],\n"
        "                  'failing': repr(failing.exception(timeout=120)), 'ids': [j.id for j in [single, *many]]}))\n"
    )
    done = subprocess.run(
        [sys.executable, str(path)], cwd=gpuq.cwd, env=gpuq.env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    value, slurm_id, visible = found["single"]
    assert value == 10 and slurm_id and visible  # ran as a Slurm job on a GPU Slurm gave it
    assert [m[0] for m in found["many"]] == [20, 30, 40]
    assert found["failing"] == "ZeroDivisionError('division by zero')"
    records = {r["id"]: r for r in gpuq.status()}
    assert all(records[i]["cluster"] == "lab" for i in found["ids"])


# -- interactive work on the cluster: srun --pty and salloc --------------------------------------------------


def test_gpuq_run_on_a_cluster_is_srun_with_the_jobs_shape_and_its_exit_code(gpuq: Gpuq) -> None:
    done = gpuq.run(
        "run",
        "--on",
        "lab",
        "--gpus",
        "2",
        "--time",
        "5m",
        "sh",
        "-c",
        'echo "gpus=$CUDA_VISIBLE_DEVICES job=$SLURM_JOB_ID name=$SLURM_JOB_NAME"; exit 4',
        check=False,
    )
    assert done.returncode == 4, done.stderr
    words = dict(word.split("=", 1) for word in done.stdout.split())
    assert len(words["gpus"].split(",")) == 2 and words["job"].isdigit() and words["name"] == "sh"
    refused = gpuq.run("run", "--on", "lab", "--mem", "8G", "true", check=False)
    assert refused.returncode == 2 and "whole GPUs" in refused.stderr


def test_gpuq_run_on_a_cluster_in_a_terminal_gets_a_pty_there(gpuq: Gpuq) -> None:
    from tests.test_interactive import Terminal

    term = Terminal(gpuq, "run", "--on", "lab", "--gpus", "1", sys.executable, "-i", "-q")
    term.expect(">>> ", timeout=60)
    term.type("import os, sys; print('TTY', sys.stdin.isatty(), 'JOB', os.environ['SLURM_JOB_ID'])\n")
    term.expect("TTY True JOB ")
    term.type("exit(5)\n")
    assert term.close() == 5


def test_gpuq_alloc_on_a_cluster_is_salloc_whose_shell_reaches_the_allocation(gpuq: Gpuq) -> None:
    from tests.test_interactive import Terminal

    term = Terminal(gpuq, "alloc", "--on", "lab", "--gpus", "1", env={**gpuq.env, "SHELL": "/bin/sh"})
    term.expect("Granted job allocation", timeout=60)
    term.type("srun sh -c 'echo ALLOC=$SLURM_JOB_ID GPUS=$CUDA_VISIBLE_DEVICES'; exit\n")
    screen = term.expect("GPUS=", timeout=60)
    assert term.close() == 0, screen
    refused = gpuq.run("alloc", "--on", "lab", "--no-shell", check=False)
    assert refused.returncode == 2 and "salloc --no-shell" in refused.stderr
