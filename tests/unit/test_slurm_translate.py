# One module past 400 lines on purpose: the pure half of the Slurm backend, beside test_slurm.py's live one.
"""Cluster jobs without a cluster: the spec -> sbatch translation, reading Slurm's output, and what it
means for a record. All pure functions, plus bash running the generated script the way slurmd would."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq_scheduler.jobs.config import Cluster
from gpuq_scheduler.jobs.errors import BadInput, StateDirError
from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Mode
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.slurm import commands as slurm
from gpuq_scheduler.jobs.slurm import sbatch
from gpuq_scheduler.jobs.slurm.clusters import read_exit
from gpuq_scheduler.jobs.slurm.records import ClusterArray, ClusterTable
from gpuq_scheduler.jobs.store.spool import ArrayPlan
from gpuq_scheduler.jobs.store.statedir import StateDir
from tests.conftest import REPORT, ROOT, make_env, read_reports

LAB = Cluster("lab", partition="gpu", account="ml", time=4 * 3600.0, sbatch_flags=("--qos=normal", "--gres=gpu:a100:2"))
BASH = shutil.which("bash") or "/bin/bash"


def _spec(*command: str, **options: Any) -> JobSpec:
    return JobSpec(command=command or ("train.py",), cwd="/work dir", env={"HOME": "/h"}, **options)


def _state(tmp_path: Path) -> StateDir:
    state = StateDir(tmp_path / "state dir 'quoted'")
    state.ensure()
    return state


def _options(batch: sbatch.Batch) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in batch.argv if arg.startswith("--") and "=" in arg)


# -- translation -----------------------------------------------------------------------------------


def test_a_job_becomes_sbatch_options_with_the_clusters_flags_last(tmp_path: Path) -> None:
    state = _state(tmp_path)
    spec = _spec("train.py", "--lr", "0.1", gpus=2, name="big run", time_limit=90.0, python="/venv/bin/python")
    batch = sbatch.translate(spec, LAB, job_id=17, state=state)
    options = _options(batch)
    assert batch.argv[:2] == ("sbatch", "--parsable")
    assert options["gres"] == "gpu:a100:2"  # the cluster's own --gres came last: sbatch lets it win
    assert batch.argv.index("--gres=gpu:2") < batch.argv.index("--gres=gpu:a100:2")
    assert options["time"] == "2"  # 90 s, in Slurm's whole minutes, rounded up
    assert options["job-name"] == "big run" and options["chdir"] == "/work dir" and options["export"] == "ALL"
    assert options["partition"] == "gpu" and options["account"] == "ml" and options["qos"] == "normal"
    assert options["output"] == str(state.log(17)) and options["open-mode"] == "append"
    assert "requeue" not in batch.argv and "array" not in options and "dependency" not in options
    assert "\n/venv/bin/python train.py --lr 0.1 &\n" in batch.script


def test_the_clusters_default_time_applies_when_the_job_gives_none(tmp_path: Path) -> None:
    assert _options(sbatch.translate(_spec("true"), LAB, job_id=1, state=_state(tmp_path)))["time"] == "240"
    assert "time" not in _options(sbatch.translate(_spec("true"), Cluster("bare"), job_id=1, state=_state(tmp_path)))


def test_host_limits_become_slurms_cpus_per_task_and_mem_rounded_up(tmp_path: Path) -> None:
    spec = _spec("true", cpus=2.5, ram=(32 << 30) + 1)
    options = _options(sbatch.translate(spec, Cluster("bare"), job_id=1, state=_state(tmp_path)))
    assert options["cpus-per-task"] == "3" and options["mem"] == f"{(32 << 10) + 1}M"
    plain = _options(sbatch.translate(_spec("true"), Cluster("bare"), job_id=1, state=_state(tmp_path)))
    assert "cpus-per-task" not in plain and "mem" not in plain


def test_arrays_dependencies_retries_and_a_lower_priority_translate(tmp_path: Path) -> None:
    spec = _spec("true", after=(3, 4), retries=2, priority=-5)
    batch = sbatch.translate(
        spec,
        Cluster("c"),
        job_id=9,
        state=_state(tmp_path),
        array=ArrayPlan(tuple(range(50)), 8),
        after=["101", "102_3"],
    )
    options = _options(batch)
    assert options["array"] == "0-49%8"
    assert options["dependency"] == "afterok:101:102_3" and options["kill-on-invalid-dep"] == "yes"
    assert "--requeue" in batch.argv and options["nice"] == "5"
    assert 'scontrol requeue "$gpuq_self"' in batch.script
    any_spec = _spec("true", after=(3,), after_any=True)
    any_batch = sbatch.translate(any_spec, Cluster("c"), job_id=9, state=_state(tmp_path), after=["101"])
    assert _options(any_batch)["dependency"] == "afterany:101"


def test_array_lists_compress_to_runs() -> None:
    assert sbatch.array_ranges((0, 1, 2, 3)) == "0-3"
    assert sbatch.array_ranges((1, 3, 4, 5, 9)) == "1,3-5,9"
    assert sbatch.array_ranges((0, 5, 10)) == "0,5,10"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mem_per_gpu": 4 << 30}, "--mem 4.0G shares a GPU by memory, which Slurm cannot do"),
        ({"oom_retry": True}, "use --retries N instead"),
        ({"notify": "mail me"}, "--mail-type=END"),
        ({"priority": 10}, "only admins can raise a job's priority"),
        ({"options": {"colour": "red"}}, "--colour: nothing translates it to Slurm yet, so it would be lost on"),
        # gpuq's %j is its own job id, not Slurm's: refused rather than named after the wrong id (issue 39)
        ({"options": {"output": "%A_%a.out"}}, "--output: nothing translates it to Slurm yet"),
    ],
)
def test_what_slurm_cannot_do_is_refused_in_one_line(options: dict[str, object], message: str) -> None:
    with pytest.raises(BadInput) as refused:
        sbatch.check(_spec("true", **options), LAB)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_torchrun_lets_torchrun_pick_its_port(tmp_path: Path) -> None:
    spec = _spec("train.py", gpus=4, mode=Mode.TORCHRUN, python="/venv/bin/python")
    script = sbatch.translate(spec, LAB, job_id=1, state=_state(tmp_path)).script
    assert "/venv/bin/python -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 4 train.py &" in script


def test_sbatch_gets_the_captured_environment_without_an_enclosing_jobs_slurm_variables() -> None:
    env = sbatch.sbatch_env({"PATH": "/bin", "SLURM_JOB_ID": "5", "SLURM_CONF": "/etc/slurm.conf", "SBATCH_QOS": "x"})
    assert env == {"PATH": "/bin", "SLURM_CONF": "/etc/slurm.conf", "SBATCH_QOS": "x"}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12), min_size=1, max_size=4))
def test_index_placeholders_become_the_task_id_whatever_the_words_hold(words: list[str]) -> None:
    words = [w + "{index}" if i % 2 else w for i, w in enumerate(words)]
    line = " ".join(sbatch.command_words(_spec(*[w or "x" for w in words])))
    out = subprocess.run(
        [BASH, "-c", f"printf '%s\\0' {line}"], env={"SLURM_ARRAY_TASK_ID": "7"}, capture_output=True, check=True
    ).stdout
    assert out.decode().split("\0")[:-1] == [(w or "x").replace("{index}", "7") for w in words]


# -- the batch script, run by bash as slurmd would run it ---------------------------------------------------


def _run_script(batch: sbatch.Batch, tmp_path: Path, **slurm_env: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "batch script"
    path.write_text(batch.script)
    env = {**make_env(tmp_path, fake=None), "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node7", **slurm_env}
    return subprocess.run([BASH, str(path)], env=env, cwd="/", capture_output=True, text=True, timeout=60)


def test_the_script_runs_the_job_in_its_cwd_and_writes_an_exit_file_gpuq_reads(tmp_path: Path) -> None:
    state = _state(tmp_path)
    report = tmp_path / "seen.jsonl"
    spec = JobSpec(command=(str(REPORT), str(report), "0", "3"), cwd=str(tmp_path), python=sys.executable, gpus=2)
    batch = sbatch.translate(spec, LAB, job_id=5, state=state)
    result = _run_script(batch, tmp_path, CUDA_VISIBLE_DEVICES="1,2")
    assert result.returncode == 3, result.stderr
    (seen,) = read_reports(report)
    assert seen["job"] == 5 and seen["cvd"] == "1,2" and seen["order"] == "PCI_BUS_ID" and seen["cwd"] == str(tmp_path)
    data = read_exit(state, 5)
    assert data is not None
    assert data["exit_code"] == 3 and data["signal"] is None and data["gpus"] == "1,2" and data["node"] == "node7"
    record = JobRecord(id=5, spec=spec, uid=0, user="u", state=JobState.RUNNING, submitted_at=0.0)
    ended = slurm.follow(record, None, data)
    assert ended is not None and ended.state is JobState.FAILED and ended.exit_code == 3 and ended.gpus == (1, 2)


def test_an_array_members_id_log_and_index_come_from_the_task_id(tmp_path: Path) -> None:
    state = _state(tmp_path)
    plan = ArrayPlan((1, 3, 4, 5, 9))  # members 21..25
    spec = JobSpec(
        command=("sh", "-c", 'echo "$GPUQ_JOB_ID $GPUQ_ARRAY_ID $GPUQ_ARRAY_INDEX {index}"'), cwd="/", gpus=0
    )
    batch = sbatch.translate(spec, LAB, job_id=20, state=state, array=plan)
    for member, index in zip(plan.member_ids(20), plan.indices, strict=True):
        result = _run_script(batch, tmp_path, SLURM_ARRAY_TASK_ID=str(index), SLURM_ARRAY_JOB_ID="70")
        assert result.returncode == 0, result.stderr
        assert Path(state.log(member)).read_text() == f"{member} 20 {index} {index}\n"
        assert read_exit(state, member) is not None
    assert _run_script(batch, tmp_path, SLURM_ARRAY_TASK_ID="2", SLURM_ARRAY_JOB_ID="70").returncode == 1


def test_a_cpu_job_sees_no_gpu_even_if_the_submitters_shell_had_some(tmp_path: Path) -> None:
    spec = JobSpec(command=("sh", "-c", 'echo "[$CUDA_VISIBLE_DEVICES]"'), cwd="/", gpus=0)
    state = _state(tmp_path)
    result = _run_script(sbatch.translate(spec, LAB, job_id=1, state=state), tmp_path, CUDA_VISIBLE_DEVICES="0")
    assert result.stdout == "[]\n"  # a single job's output goes where sbatch --output says: here, stdout
    data = read_exit(state, 1)
    assert data is not None and data["gpus"] == ""


def test_a_missing_cwd_on_the_node_fails_to_start_and_says_why(tmp_path: Path) -> None:
    state = _state(tmp_path)
    spec = JobSpec(command=("true",), cwd=str(tmp_path / "gone"))
    result = _run_script(sbatch.translate(spec, LAB, job_id=3, state=state), tmp_path)
    assert result.returncode == 1
    data = read_exit(state, 3)
    assert data is not None and "cannot enter the working directory" in data["spawn_error"]
    record = JobRecord(id=3, spec=spec, uid=0, user="u", state=JobState.RUNNING, submitted_at=0.0)
    ended = slurm.follow(record, None, data)
    assert ended is not None and ended.state is JobState.FAILED and ended.reason.startswith("could not start")


def test_the_script_is_valid_bash_for_every_kind_of_job(tmp_path: Path) -> None:
    state = _state(tmp_path)
    for spec, plan in [
        (_spec("true", retries=3, after=(1,)), None),
        (_spec("a b.py", "{index}", python="/p y/python", gpus=0), ArrayPlan((0, 2, 4), 2)),
        (_spec("train.py", mode=Mode.TORCHRUN, python="python", gpus=2, retries=1), ArrayPlan(tuple(range(100)))),
    ]:
        script = sbatch.translate(spec, LAB, job_id=7, state=state, array=plan).script
        check = subprocess.run([BASH, "-n"], input=script, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


# -- reading Slurm -----------------------------------------------------------------------------------------

SQUEUE = """\
3|3|N/A|CANCELLED|DependencyNeverSatisfied||2026-11-22T18:20:52|2026-11-22T18:20:52|0|0|
8|1|4|COMPLETED|None|gpuqbench|2026-11-22T18:20:54|2026-11-22T18:20:55|0|0|
1|1|5|PENDING|JobArrayTaskLimit||N/A|N/A|0|0|
2|2|N/A|FAILED|NonZeroExitCode|gpuqbench|2026-11-22T18:20:51|2026-11-22T18:20:52|768|0|
7|7|N/A|CANCELLED|None|gpuqbench|2026-11-22T18:23:40|2026-11-22T18:23:41|15|0|gpuqbench|
9|9|N/A|PENDING|BeginTime||2026-11-22T18:24:36|N/A|0|1|
"""


def test_squeue_lines_are_read_by_job_and_array_task() -> None:
    jobs = slurm.parse_squeue(SQUEUE)
    assert set(jobs) == {"3", "1_4", "1_5", "2", "7", "9"}
    assert jobs["1_4"].state == "COMPLETED" and jobs["1_4"].node == "gpuqbench" and jobs["1_4"].exit_code == 0
    assert jobs["1_5"].reason == "JobArrayTaskLimit" and jobs["1_5"].started_at is None
    assert (jobs["2"].exit_code, jobs["2"].signal) == (3, None)  # a raw wait status: 768 = exit code 3
    assert (jobs["7"].exit_code, jobs["7"].signal) == (None, 15)
    assert jobs["9"].restarts == 1 and jobs["9"].active
    assert jobs["2"].ended_at is not None and jobs["2"].started_at is not None


def test_sacct_lines_are_read_by_job_and_array_task() -> None:
    text = (
        "12|COMPLETED|0:0|2026-11-22T18:00:00|2026-11-22T18:00:05|n1\n13_2|CANCELLED by 1000|0:15|"
        "2026-11-22T18:00:00|2026-11-22T18:00:03|n2\n13_[3-9]|PENDING|0:0|Unknown|Unknown|None assigned\n"
        "14|FAILED|2:0|2026-11-22T18:00:00|2026-11-22T18:00:01|n1\n"
    )
    jobs = slurm.parse_sacct(text)
    assert set(jobs) == {"12", "13_2", "14"}
    assert jobs["13_2"].state == "CANCELLED" and jobs["13_2"].signal == 15 and jobs["13_2"].exit_code is None
    assert jobs["14"].exit_code == 2 and jobs["12"].node == "n1"


def _record(**changes: object) -> JobRecord:
    spec = JobSpec(command=("true",), cwd="/", retries=2, time_limit=600.0)
    base = JobRecord(
        id=4, spec=spec, uid=0, user="u", state=JobState.PENDING, submitted_at=100.0, cluster="lab", external_id="55"
    )
    return base.replace(**changes)


@pytest.mark.parametrize(
    ("seen", "state", "reason"),
    [
        (slurm.SlurmJob("55", "PENDING", "Resources"), JobState.PENDING, "waiting in Slurm: Resources"),
        (
            slurm.SlurmJob("55", "PENDING", "BeginTime", restarts=1),
            JobState.PENDING,
            "attempt 2 of 3, waiting in Slurm: BeginTime",
        ),
        (slurm.SlurmJob("55", "RUNNING", node="n1", started_at=200.0), JobState.RUNNING, ""),
        (slurm.SlurmJob("55", "COMPLETING", node="n1", started_at=200.0), JobState.RUNNING, ""),
        (
            slurm.SlurmJob("55", "COMPLETED", node="n1", started_at=200.0, ended_at=210.0, exit_code=0),
            JobState.SUCCEEDED,
            "",
        ),
        (
            slurm.SlurmJob("55", "FAILED", "NonZeroExitCode", "n1", 200.0, 210.0, exit_code=3),
            JobState.FAILED,
            "Slurm: NonZeroExitCode (exit code 3)",
        ),
        (
            slurm.SlurmJob("55", "CANCELLED", node="n1", started_at=200.0, signal=15),
            JobState.CANCELLED,
            "cancelled by Slurm (scancel outside gpuq, or an admin)",
        ),
        (
            slurm.SlurmJob("55", "CANCELLED", "DependencyNeverSatisfied"),
            JobState.CANCELLED,
            "not run: a dependency did not succeed",
        ),
        (
            slurm.SlurmJob("55", "TIMEOUT", "TimeLimit", "n1", 200.0, 900.0, exit_code=143),
            JobState.TIMEOUT,
            "time limit of 600s reached",
        ),
        (slurm.SlurmJob("55", "NODE_FAIL", node="n9", started_at=200.0), JobState.LOST, "Slurm: NODE_FAIL on node n9"),
        (
            slurm.SlurmJob("55", "OUT_OF_MEMORY", node="n1", started_at=200.0),
            JobState.FAILED,
            "out of host memory (Slurm OUT_OF_MEMORY): ask for more with --mem in sbatch_flags",
        ),
    ],
)
def test_what_slurm_says_becomes_the_records_state(seen: slurm.SlurmJob, state: JobState, reason: str) -> None:
    followed = slurm.follow(_record(), seen, None)
    assert followed is not None
    assert followed.state is state and followed.reason == reason
    assert followed.attempt == seen.restarts + 1
    if state.finished and state is not JobState.CANCELLED:
        assert followed.ended_at is not None and followed.started_at == 200.0 and followed.node == seen.node


def test_the_exit_file_wins_and_a_signal_is_read_with_slurms_state() -> None:
    term = {
        "exit_code": None,
        "signal": 15,
        "reason": "signal",
        "gpus": "0",
        "node": "n1",
        "attempt": 1,
        "started_at": 200.0,
        "ended_at": 260.0,
    }
    timed_out = slurm.follow(_record(), slurm.SlurmJob("55", "TIMEOUT"), term)
    assert timed_out is not None and timed_out.state is JobState.TIMEOUT and timed_out.gpus == (0,)
    cancelled = slurm.follow(_record(), slurm.SlurmJob("55", "COMPLETING"), term, cancel_by="alice")
    assert cancelled is not None and cancelled.state is JobState.CANCELLED and cancelled.reason == "cancelled by alice"
    killed = slurm.follow(_record(), None, term)
    assert killed is not None and killed.state is JobState.FAILED and killed.signal == 15
    done = slurm.follow(_record(), slurm.SlurmJob("55", "RUNNING"), {**term, "signal": None, "exit_code": 0})
    assert done is not None and done.state is JobState.SUCCEEDED and done.ended_at == 260.0


def test_an_exit_file_from_an_earlier_attempt_is_ignored() -> None:
    first = {"exit_code": None, "signal": 15, "reason": "signal", "attempt": 1}  # preempted, then requeued
    again = slurm.follow(_record(), slurm.SlurmJob("55", "RUNNING", restarts=1, node="n2"), first)
    assert again is not None and again.state is JobState.RUNNING and again.attempt == 2


def test_a_job_nobody_knows_is_left_to_the_caller() -> None:
    assert slurm.follow(_record(), None, None) is None


# -- records --------------------------------------------------------------------------------------------


def test_local_records_say_they_ran_here_in_status_json() -> None:
    data = _record(cluster=None, external_id=None).to_json()
    assert data["cluster"] is None and data["external_id"] is None and data["node"] is None
    assert _record(node="n1").to_json()["cluster"] == "lab"


def test_cluster_records_round_trip_through_their_table_without_environments(tmp_path: Path) -> None:
    table = ClusterTable(tmp_path / "clusters.db")
    assert table.records() == [] and not (tmp_path / "clusters.db").exists()  # reading creates nothing
    spec = JobSpec(command=("a b",), cwd="/", env={"TOKEN": "secret"}, after=(1,), retries=2)
    members = [_record(id=i, spec=spec, array_id=10, array_index=i - 11, external_id=f"70_{i - 11}") for i in (11, 12)]
    table.insert(members, ClusterArray(10, "lab", "70", 0, "u", "a b", 2, 1, 100.0))
    assert table.members(10) == [m.replace(spec=_no_env(spec)) for m in members]
    assert "secret" not in (tmp_path / "clusters.db").read_bytes().decode(errors="replace")
    ended = members[0].replace(state=JobState.SUCCEEDED, exit_code=0, ended_at=5.0, gpus=(1,), node="n1")
    table.update([ended])
    table.update([members[0].replace(state=JobState.LOST)])  # a second word on an ending is ignored
    assert table.get(11) == ended.replace(spec=_no_env(spec))
    assert [r.id for r in table.records(active_only=True)] == [12]
    assert table.arrays()[10].external_id == "70"
    table.close()
    again = ClusterTable(tmp_path / "clusters.db")
    again.insert([_record(id=30)])  # a second client finds the file and uses it
    assert [r.id for r in again.records()] == [11, 12, 30]


def test_a_cluster_table_from_a_newer_gpuq_is_refused_with_advice(tmp_path: Path) -> None:
    path = tmp_path / "clusters.db"
    ClusterTable(path).insert([_record()])
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(StateDirError, match=r"written by a newer gpuq \(version 99\); upgrade gpuq to read it"):
        ClusterTable(path).records()


def _no_env(spec: JobSpec) -> JobSpec:
    return JobSpec.from_json({**spec.to_json(), "env": {}})


def test_gpuq_status_without_cluster_jobs_runs_no_slurm_command_and_imports_no_cluster_code(tmp_path: Path) -> None:
    marker = tmp_path / "slurm was called"
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for name in ("squeue", "sacct", "sbatch", "scontrol"):
        (fake_bin / name).write_text(f"#!/bin/sh\ntouch '{marker}'\n")
        (fake_bin / name).chmod(0o755)
    env = make_env(tmp_path / "home")
    env["PATH"] = f"{fake_bin}{os.pathsep}{env['PATH']}"
    code = (
        "import sys; from gpuq_scheduler.launcher.cli.app import main\n"
        "try: main(['status', '--all'])\nexcept SystemExit: pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpuq_scheduler.jobs.slurm') or m == 'sqlite3'))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "['sqlite3']"  # sqlite3 reads jobs.db, as before
    assert not marker.exists()
    submit_code = (
        "import sys; import gpuq_scheduler.launcher.cli.app\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpuq_scheduler.jobs.')))"
    )
    loaded = subprocess.run([sys.executable, "-c", submit_code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert "jobs.slurm.clusters" not in loaded.stdout and "jobs.slurm.commands" not in loaded.stdout


def test_the_report_counts_cluster_jobs_but_draws_them_on_no_local_gpu() -> None:
    from gpuq_scheduler.launcher.views.report import build_report

    spec = JobSpec(command=("true",), cwd="/", gpus=2)
    done = {"state": JobState.SUCCEEDED, "started_at": 0.0, "ended_at": 3600.0, "gpus": (0, 1)}
    local = JobRecord(id=1, spec=spec, uid=0, user="u", submitted_at=0.0, **done)
    remote = local.replace(id=2, cluster="lab", external_id="9", gpus=(5, 6))
    report = build_report([local, remote], gpu_count=2, now=3600.0, since=3600.0)
    assert report.counts == {JobState.SUCCEEDED: 2} and report.gpu_hours == 4.0
    assert report.gpu_count == 2 and {segment.job_id for segment in report.segments} == {1}
