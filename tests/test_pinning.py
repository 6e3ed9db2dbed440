"""`gpuq submit --gpu-ids 2,3` (issue #39): a job pinned to given GPUs runs on them or waits for them and says
so; GPUs that do not exist are refused by the client where it knows the inventory, and by the daemon; `--on`
refuses it, as Slurm picks a node's GPUs itself. Real daemons on fake GPUs."""

from __future__ import annotations

import json
import time

import pytest

from gpuq_scheduler.jobs.config import Cluster
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.slurm import sbatch
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.statedir import StateDir
from tests.conftest import Gpuq

DONE = ("succeeded", "failed", "cancelled", "timeout", "lost")


def test_a_pinned_job_runs_on_the_gpus_it_named_and_the_next_waits_for_them(gpuq: Gpuq) -> None:
    pair = gpuq.submit("--gpu-ids", "3,2", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; sleep 300")
    running = gpuq.wait_state(pair, "running")
    assert running["gpus"] == [2, 3] and running["gpus_requested"] == 2
    assert "gpus requested    2 (these: --gpu-ids 2,3)" in gpuq.run("show", str(pair)).stdout
    later = gpuq.submit("--gpu-ids", "3", "true")
    free = gpuq.submit("true")  # GPUs 0 and 1 are free: it is not held back by the job waiting for GPU 3
    assert gpuq.wait_state(free, *DONE)["state"] == "succeeded"
    waiting = gpuq.job(later)
    assert waiting["state"] == "pending" and waiting["reason"].startswith("waiting for GPU 3 to itself"), waiting
    assert "waiting for GPU 3 to itself" in gpuq.run("status").stdout
    gpuq.run("cancel", str(pair))
    ended = gpuq.wait_state(later, *DONE)
    assert ended["state"] == "succeeded" and ended["gpus"] == [3]
    with open(gpuq.job(pair)["log"]) as log:
        assert log.readline().strip() == "2,3"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpu-ids", "4"], "--gpu-ids 4: no GPU 4 here; GPUs are numbered 0 to 3 (`gpuq gpus` lists them)"),
        (["--gpu-ids", "1,x"], "--gpu-ids '1,x': GPU numbers separated by commas, like 2,3"),
        (["--gpu-ids", "-1"], "--gpu-ids '-1': GPU numbers separated by commas"),
        (["--gpus", "3", "--gpu-ids", "0,1"], "--gpus 3 --gpu-ids 0,1: the job runs on the 2 GPU(s) listed"),
    ],
)
def test_gpu_ids_that_do_not_exist_are_refused_in_one_line_and_nothing_is_queued(
    gpuq: Gpuq, args: list[str], says: str
) -> None:
    first = gpuq.submit("true")  # the daemon has seen the GPUs: the quick path checks against them
    gpuq.wait_state(first, *DONE)
    for entry in ("gpuq_scheduler.launcher.cli.entry", "gpuq_scheduler.launcher.cli.app"):  # quick and click
        gpuq.entry = entry
        result = gpuq.run("submit", *args, "true", check=False)
        assert result.returncode == 2 and result.stdout == "", result
        assert result.stderr.splitlines() == [f"gpuq: {says}"] or (
            len(result.stderr.splitlines()) == 1 and says in result.stderr
        ), result.stderr
    assert [job["id"] for job in gpuq.status()] == [first]


def test_the_daemon_refuses_gpu_ids_that_do_not_exist_in_a_request_the_client_did_not_check(gpuq: Gpuq) -> None:
    first = gpuq.submit("true")
    gpuq.wait_state(first, *DONE)
    spec = JobSpec(command=("true",), cwd=str(gpuq.cwd), options={"gpu_ids": [9]}).to_json()
    job = outbox.post_submit(StateDir(gpuq.home), spec, submitted_at=time.time())
    outbox.poke(StateDir(gpuq.home))
    ended = gpuq.wait_state(job, *DONE)
    assert ended["state"] == "failed" and "--gpu-ids 9: no GPU 9 here" in ended["reason"], ended
    assert json.loads(gpuq.run("show", "--json", str(job)).stdout)["gpus"] == []


def test_on_a_cluster_gpu_ids_are_refused_as_slurm_picks_the_gpus() -> None:
    spec = JobSpec(command=("true",), cwd="/", gpus=2, options={"gpu_ids": [2, 3]})
    with pytest.raises(BadInput, match=r"--gpu-ids 2,3 names GPUs of this machine; on cluster lab Slurm chooses"):
        sbatch.check(spec, Cluster("lab"))
