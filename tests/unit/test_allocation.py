"""jobs.allocation: the environment gpuq gives a job, read back from inside the job (what needs torch is in
tests/test_allocation_torch.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq_scheduler.jobs.allocation import Allocation, current

GIB = 1 << 30

GPUQ_ENV = {
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "CUDA_VISIBLE_DEVICES": "2,3",
    "GPUQ_JOB_ID": "17",
    "GPUQ_JOB_NAME": "seed3",
    "GPUQ_GPUS": "2,3",
    "GPUQ_GPU_UUIDS": "GPU-aaa,GPU-bbb",
    "GPUQ_MEM_PER_GPU": "21474836480",
    "GPUQ_MODE": "dataparallel",
    "GPUQ_HOME": "/tmp/gpuq-state",
}


def test_from_env_reads_everything_gpuq_sets() -> None:
    allocation = Allocation.from_env(GPUQ_ENV)

    assert allocation == Allocation(
        job_id=17,
        name="seed3",
        gpus=(2, 3),
        gpu_uuids=("GPU-aaa", "GPU-bbb"),
        mem_per_gpu=20 * GIB,
        mode="dataparallel",
    )
    assert allocation.under_gpuq
    assert not allocation.under_torchrun


def test_outside_gpuq_nothing_is_allocated() -> None:
    allocation = Allocation.from_env({})

    assert allocation == Allocation(None, None, (), (), None, "single")
    assert not allocation.under_gpuq


def test_outside_gpuq_gpus_come_from_cuda_visible_devices() -> None:
    assert Allocation.from_env({"CUDA_VISIBLE_DEVICES": "1,0"}).gpus == (1, 0)
    assert Allocation.from_env({"CUDA_VISIBLE_DEVICES": " 4 "}).gpus == (4,)


@pytest.mark.parametrize("visible", ["", "GPU-8d1f0a2c-aaaa", "-1", "NoDevFiles"])
def test_cuda_visible_devices_without_indices_gives_no_gpus(visible: str) -> None:
    assert Allocation.from_env({"CUDA_VISIBLE_DEVICES": visible}).gpus == ()


def test_cuda_visible_devices_stops_at_the_first_invalid_entry_like_cuda() -> None:
    assert Allocation.from_env({"CUDA_VISIBLE_DEVICES": "0,1,-1,2"}).gpus == (0, 1)


@given(st.lists(st.integers(min_value=0, max_value=4095), max_size=16))
def test_any_list_of_indices_reads_back(indices: list[int]) -> None:
    visible = ",".join(map(str, indices))

    assert Allocation.from_env({"CUDA_VISIBLE_DEVICES": visible}).gpus == tuple(indices)
    assert Allocation.from_env({"GPUQ_GPUS": visible}).gpus == tuple(indices)


def test_gpuq_gpus_wins_over_cuda_visible_devices() -> None:
    env = {"GPUQ_JOB_ID": "3", "GPUQ_GPUS": "5", "CUDA_VISIBLE_DEVICES": "0,1"}

    assert Allocation.from_env(env).gpus == (5,)


def test_cpu_job_has_no_gpus_and_no_memory_cap() -> None:
    env = {**GPUQ_ENV, "CUDA_VISIBLE_DEVICES": "", "GPUQ_GPUS": "", "GPUQ_GPU_UUIDS": "", "GPUQ_MEM_PER_GPU": ""}
    allocation = Allocation.from_env(env)

    assert allocation.gpus == ()
    assert allocation.gpu_uuids == ()
    assert allocation.mem_per_gpu is None
    assert allocation.cap_memory() is None


def test_whole_gpus_have_no_memory_cap() -> None:
    env = {k: v for k, v in GPUQ_ENV.items() if k != "GPUQ_MEM_PER_GPU"}

    assert Allocation.from_env(env).mem_per_gpu is None
    assert Allocation.from_env(env).cap_memory() is None


def test_fake_gpus_may_have_no_uuids() -> None:
    assert Allocation.from_env({**GPUQ_ENV, "GPUQ_GPU_UUIDS": ""}).gpu_uuids == ()


def test_torchrun_is_recognised_by_gpuq_mode_or_by_local_rank() -> None:
    under_gpuq = Allocation.from_env({**GPUQ_ENV, "GPUQ_MODE": "torchrun", "LOCAL_RANK": "1"})
    plain_torchrun = Allocation.from_env({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2"})

    assert (under_gpuq.mode, under_gpuq.local_rank, under_gpuq.under_torchrun) == ("torchrun", 1, True)
    assert (plain_torchrun.mode, plain_torchrun.local_rank, plain_torchrun.under_torchrun) == ("torchrun", 0, True)


@pytest.mark.parametrize(
    ("name", "value"),
    [("GPUQ_JOB_ID", "seventeen"), ("GPUQ_GPUS", "2,x"), ("GPUQ_MEM_PER_GPU", "20G"), ("GPUQ_MEM_PER_GPU", "0")],
)
def test_malformed_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        Allocation.from_env({**GPUQ_ENV, name: value})


def test_allocation_is_frozen() -> None:
    allocation = Allocation.from_env(GPUQ_ENV)

    with pytest.raises(dataclasses.FrozenInstanceError):
        allocation.job_id = 18  # type: ignore[misc]


def test_current_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in GPUQ_ENV.items():
        monkeypatch.setenv(name, value)

    assert current() == Allocation.from_env(GPUQ_ENV)
