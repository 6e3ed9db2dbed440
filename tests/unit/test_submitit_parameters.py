"""submitit's parameters read as gpuq's options (gpuq_scheduler.submitit.parameters), pure: plain values in,
options and notes out. The scripts that use them run in test_submitit.py and test_submitit_slurm.py."""

from __future__ import annotations

from typing import Any

import pytest

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.submitit.parameters import GENERIC, GPUQ, LOCAL, SLURM, UnknownParameter, read

SAMPLES: dict[str, Any] = {
    "name": "x",
    "job_name": "x",
    "timeout_min": 5,
    "time": 5,
    "mem_gb": 4,
    "mem": "4G",
    "nodes": 1,
    "cpus_per_task": 2,
    "gpus_per_node": 1,
    "num_gpus": 1,
    "tasks_per_node": 1,
    "ntasks_per_node": 1,
    "stderr_to_stdout": False,
    "array_parallelism": 3,
    "visible_gpus": (2, 3),
    "setup": ["true"],
}
DEFAULT = read({}, "local")


def _every_name() -> list[str]:
    slurm = [
        f"slurm_{arg}"
        for arg in [*SLURM, "job_name", "time", "ntasks_per_node", "num_gpus", "mem", "array_parallelism", *GENERIC]
    ]
    return [*GENERIC, *slurm, *(f"local_{arg}" for arg in [*LOCAL, *GENERIC]), *(f"debug_{arg}" for arg in GENERIC)]


@pytest.mark.parametrize("where", ["local", "slurm"])
@pytest.mark.parametrize("key", _every_name())
def test_no_parameter_is_dropped_in_silence(key: str, where: str) -> None:
    """Each name submitit takes either changes what gpuq is asked for, or comes back with why it does not."""
    value = SAMPLES.get(key.partition("_")[2] if key not in GENERIC else key, "something")
    reading = read({key: value}, where)
    if key.endswith(("nodes", "tasks_per_node")) and (key in GENERIC or key.startswith(where)):
        assert reading == DEFAULT  # 1: what every gpuq job is (above 1 is refused, below)
        return
    assert reading.options != DEFAULT.options or reading.throttle is not None or key in reading.unused
    if key in reading.unused:
        assert reading.unused[key] and reading.options == DEFAULT.options and reading.throttle is None


def test_generic_names_are_gpuq_options_and_a_prefixed_one_overrides_where_the_jobs_go() -> None:
    given = {
        "name": "t",
        "timeout_min": 90,
        "gpus_per_node": 2,
        "cpus_per_task": 8,
        "mem_gb": 1.5,
        "slurm_timeout_min": 10,
        "local_gpus_per_node": 1,
        "slurm_array_parallelism": 4,
    }
    assert read(given, "local").options == {"gpus": 1, "name": "t", "time_limit": 5400.0, "cpus": "8", "ram": 3 << 29}
    there = read(given, "slurm")
    assert there.options["gpus"] == 2 and there.options["time_limit"] == 600.0 and there.throttle == 4
    assert "local_gpus_per_node" in there.unused
    assert read({"slurm_time": 30, "slurm_mem": "16GB", "slurm_job_name": "j"}, "slurm").options == {
        "gpus": 0,
        "time_limit": 1800.0,
        "ram": "16G",
        "name": "j",
    }
    assert read({"slurm_mem": 16000}, "slurm").options["ram"] == "16000M"  # Slurm's bare number: megabytes
    assert read({"gpus_per_node": 2, "local_visible_gpus": [5, 1, 7]}, "local").options["gpu_ids"] == [5, 1]
    assert read({"gpuq_mem": "20G", "gpuq_gpus": 3, "gpus_per_node": 1}, "local").options == {"gpus": 3, "mem": "20G"}
    assert read({"timeout_min": None}, "local") == DEFAULT  # None: not set, as in submitit
    assert {f"gpuq_{option}" for option in GPUQ} >= {"gpuq_mem", "gpuq_priority", "gpuq_preemptible", "gpuq_after"}


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        ({"gpus": 1}, UnknownParameter, "update_parameters: unknown parameter(s) gpus: use submitit's generic names"),
        ({"slurm_gpus": 1}, UnknownParameter, "unknown parameter(s) slurm_gpus:"),
        ({"chronos_conda_file": "x"}, UnknownParameter, "unknown parameter(s) chronos_conda_file:"),
        ({"local_partition": "x"}, UnknownParameter, "unknown parameter(s) local_partition:"),
        ({"gpuq_on": "lab"}, UnknownParameter, "unknown parameter(s) gpuq_on:"),  # the cluster is the executor's
        ({"tasks_per_node": 2}, BadInput, "tasks_per_node=2: gpuq runs the function once per job"),
        ({"slurm_ntasks_per_node": 8}, BadInput, "tasks_per_node=8:"),
        ({"nodes": 2}, BadInput, "nodes=2: gpuq runs a job on one machine"),
        ({"timeout_min": 0}, BadInput, "timeout_min=0: give a positive number"),
        ({"gpus_per_node": 1.5}, BadInput, "gpus_per_node=1.5: give a whole number, at least 0"),
        ({"gpus_per_node": True}, BadInput, "gpus_per_node=True: give a whole number"),
        ({"slurm_array_parallelism": 0}, BadInput, "slurm_array_parallelism=0: give a whole number, at least 1"),
        ({"gpus_per_node": 3, "local_visible_gpus": (1,)}, BadInput, "3 GPUs asked for (gpus_per_node), only 1"),
        ({"name": 7}, BadInput, "name=7: give the job's name as a string"),
    ],
)
def test_what_would_run_wrongly_or_is_unknown_is_refused_in_one_line(
    given: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        read(given, "local" if "slurm_ntasks_per_node" not in given else "slurm")
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert isinstance(raised.value, BadInput)
