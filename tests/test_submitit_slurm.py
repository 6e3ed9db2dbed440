"""The same submitit script here and on a real Slurm (#43): run unchanged, once into the workstation's queue
(fake GPUs) and once with GPUQ_ON=lab, which sends every job through gpuq's Slurm backend to a private
slurmctld + slurmd (tests/slurm_local.py); nothing of Slurm is faked. Needs root and Slurm, as test_slurm.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Gpuq
from tests.slurm_local import LocalSlurm
from tests.test_slurm import FAST, WHY_NOT, _client

pytestmark = pytest.mark.skipif(WHY_NOT is not None and not os.environ.get("CI"), reason=WHY_NOT or "")

SCRIPT = """\
import json, os, sys
import gpuq_scheduler.submitit as submitit


def add(a, b):
    return a + b


def where(x):
    return x * 10, os.environ.get("SLURM_JOB_ID"), os.environ.get("CUDA_VISIBLE_DEVICES")


class Summer(submitit.helpers.Checkpointable):
    def __call__(self, n):
        return sum(range(n)), submitit.JobEnvironment().cluster


executor = submitit.AutoExecutor(folder="log_test/%j")
executor.update_parameters(timeout_min=5, gpus_per_node=1, slurm_partition="dev", slurm_array_parallelism=2)
job = executor.submit(add, 5, 7)
mapped = executor.map_array(where, [1, 2, 3])
with executor.batch():
    batched = [executor.submit(add, i, 100) for i in range(2)]
failing = executor.submit(lambda: 1 / 0)
summed = executor.submit(Summer(), 10)
every = [job, *mapped, *batched, failing, summed]
ended = [j.job_id for j in submitit.helpers.as_completed(every, timeout=240)]
print(json.dumps({
    "cluster": executor.cluster, "add": job.result(), "mapped": [j.result() for j in mapped],
    "batched": [j.result() for j in batched], "failing": repr(failing.exception()), "summed": summed.result(),
    "states": [j.state for j in every], "ids": [j.job_id for j in every], "ended": ended,
}))
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    if WHY_NOT is not None:
        pytest.fail(f"CI runs the Slurm tests, but {WHY_NOT}")
    with LocalSlurm(gpus=4, extra_conf=FAST, node="submitit", partition="submitit") as instance:
        yield instance


@pytest.fixture
def gpuq(tmp_path: Path, slurm: LocalSlurm) -> Iterator[Gpuq]:
    yield from _client(tmp_path, slurm)


def _run(gpuq: Gpuq, **env: str) -> tuple[dict[str, Any], str]:
    (gpuq.cwd / "script.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "script.py"],
        cwd=gpuq.cwd,
        env={**gpuq.env, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_same_submitit_script_runs_here_and_on_slurm(gpuq: Gpuq) -> None:
    here, said_here = _run(gpuq)
    there, said_there = _run(gpuq, GPUQ_ON="lab")
    for found in (here, there):
        assert found["add"] == 12 and found["batched"] == [100, 101]
        assert [m[0] for m in found["mapped"]] == [10, 20, 30] and all(m[2] for m in found["mapped"])  # a GPU each
        assert found["failing"] == "ZeroDivisionError('division by zero')"
        assert sorted(found["ended"]) == sorted(found["ids"])
        assert found["states"] == ["COMPLETED"] * 6 + ["FAILED", "COMPLETED"]
    assert here["cluster"] == "local" and there["cluster"] == "slurm"
    assert here["summed"] == [45, "local"] and there["summed"] == [45, "slurm"]
    assert not any(m[1] for m in here["mapped"]) and all(m[1] for m in there["mapped"])  # ran as Slurm jobs there
    records = {r["id"]: r for r in gpuq.status()}
    assert {records[int(i)]["cluster"] for i in here["ids"]} == {None}
    assert {records[int(i)]["cluster"] for i in there["ids"]} == {"lab"}
    assert records[int(there["ids"][0])]["time_limit"] == 300.0
    summed = gpuq.job(int(here["ids"][-1]))
    assert summed["state"] == "succeeded"
    # What slurm_partition does is said where it does nothing, in the words of each place.
    assert "slurm_partition does nothing here: it is the slurm executor's, and these jobs go to this workstation's" in (
        said_here
    )
    assert (
        "slurm_partition does nothing here: set it in the cluster's config: [clusters.lab] partition, account or "
        "sbatch_flags" in said_there
    )


def test_a_cluster_the_config_does_not_have_is_refused_before_anything_is_sent(gpuq: Gpuq) -> None:
    def refused(cluster: str) -> str:
        (gpuq.cwd / "script.py").write_text(
            f"import gpuq_scheduler.submitit as submitit\nsubmitit.AutoExecutor(folder='logs', cluster={cluster!r})\n"
        )
        done = subprocess.run([sys.executable, "script.py"], cwd=gpuq.cwd, env=gpuq.env, capture_output=True, text=True)
        assert done.returncode == 1
        return done.stderr.strip().splitlines()[-1]

    assert refused("elsewhere").startswith(
        "gpuq_scheduler.jobs.config.ConfigError: no cluster named 'elsewhere' (known: broken, lab)"
    )
    assert refused("slurm") == (  # submitit's name for Slurm, where the config has two clusters and no GPUQ_ON
        "gpuq_scheduler.jobs.errors.BadInput: cluster='slurm': name the cluster (cluster='NAME' or GPUQ_ON=NAME) "
        "among those of your config: broken, lab"
    )
    assert gpuq.status() == []


def test_the_executor_can_name_the_cluster_itself(gpuq: Gpuq) -> None:
    (gpuq.cwd / "script.py").write_text(
        "import json, os\nimport gpuq_scheduler.submitit as submitit\n"
        "executor = submitit.AutoExecutor(folder='logs', cluster='lab')\n"
        "job = executor.submit(lambda: os.environ.get('SLURM_JOB_ID'))\n"
        "print(json.dumps([executor.cluster, executor.on, job.job_id, job.result(timeout=120)]))\n"
    )
    done = subprocess.run([sys.executable, "script.py"], cwd=gpuq.cwd, env=gpuq.env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    cluster, on, job_id, slurm_id = json.loads(done.stdout)
    assert (cluster, on) == ("slurm", "lab") and slurm_id == gpuq.job(int(job_id))["external_id"]
