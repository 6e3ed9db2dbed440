"""The overnight ensemble example, end to end through a real daemon on fake GPUs (training on the CPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuq_scheduler.jobs.store.statedir import StateDir
from tests.conftest import ROOT, Gpuq, make_env


def test_ensemble_queues_members_waits_and_votes(gpuq: Gpuq) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "ensemble.py"),
            "--members",
            "3",
            "--epochs",
            "4",
            "--mem",
            "2G",
            "--out",
            str(gpuq.cwd / "out dir"),
        ],
        env=gpuq.env,
        cwd=gpuq.cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # It says which queue it used, and a line as each member ended (its output is a pipe here, not a terminal).
    assert f"queue: your personal queue, {gpuq.home} (from $GPUQ_HOME)" in result.stdout.splitlines()
    progress = re.findall(r"^\[(\d)/3\] seed (\d) \(job (\d+)\) succeeded after", result.stdout, re.MULTILINE)
    assert [n for n, *_ in progress] == ["1", "2", "3"] and sorted(s for _, s, _ in progress) == ["0", "1", "2"]
    assert result.stdout.index("[3/3]") < result.stdout.index("ensemble (majority vote)")
    members = re.findall(r"member seed +(\d+) +job +(\d+) +gpu (\d) +accuracy (0\.\d+)", result.stdout)
    assert sorted(int(seed) for seed, *_ in members) == [0, 1, 2]
    assert all(float(accuracy) > 0.5 for *_, accuracy in members)
    ensemble = float(re.search(r"ensemble \(majority vote\) accuracy: (0\.\d+)", result.stdout).group(1))  # type: ignore[union-attr]
    assert ensemble > 0.8
    records = {job["id"]: job for job in gpuq.status()}
    for _, job_id, gpu, _ in members:
        record = records[int(job_id)]
        assert record["state"] == "succeeded" and record["gpus"] == [int(gpu)] and record["mem_per_gpu"] == 2 << 30


def test_the_function_sweep_example_trains_each_learning_rate_as_a_job_and_picks_the_best(gpuq: Gpuq) -> None:
    """examples/sweep_functions.py as docs/reference.md runs it, from another directory, on fake GPUs (--mem auto)."""
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "sweep_functions.py"),
            "--epochs",
            "3",
            "--mem",
            "auto",
            "--throttle",
            "3",
        ],
        env=gpuq.env,
        cwd=gpuq.cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    runs = re.findall(r"job (\d+): lr ([\d.e-]+) accuracy (0\.\d+) on (\w+)", result.stdout)
    assert sorted(float(lr) for _, lr, _, _ in runs) == [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
    best = max(runs, key=lambda run: float(run[2]))
    assert f"best learning rate: {best[1]} (test accuracy {best[2]})" in result.stdout and float(best[2]) > 0.8
    records = {job["id"]: job for job in gpuq.status()}
    members = [records[int(job_id)] for job_id, *_ in runs]
    assert {r["state"] for r in members} == {"succeeded"} and {r["name"] for r in members} == {"lr-sweep"}
    assert len({r["array_id"] for r in members}) == 1 and all(r["mem_auto"] for r in members)


@pytest.mark.skipif(os.geteuid() != 0, reason="a shared queue's tree belongs to root (CI runs as root)")
def test_the_ensemble_says_when_it_uses_a_shared_queue_set_up_on_the_machine(tmp_path: Path) -> None:
    """It used a shared queue set up on the machine without a word: it names the queue, and whose it is."""
    home = tmp_path / "shared queue"
    StateDir(home).ensure_shared()
    said = subprocess.run(
        [sys.executable, "-c", "import ensemble; print(ensemble.which_queue())"],
        env={**make_env(home), "PYTHONPATH": str(ROOT / "examples")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert said.stdout.strip() == f"the shared queue set up on this machine, {home} (from $GPUQ_HOME)", said.stderr
