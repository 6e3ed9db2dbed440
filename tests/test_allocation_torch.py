"""jobs.allocation with torch: the device and model wrapping a job is given, and the memory cap on a real GPU
(the rest of jobs.allocation, which needs no torch, is tests/unit/test_allocation.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gpuq_scheduler.jobs.allocation import Allocation
from tests.conftest import ROOT
from tests.unit.test_allocation import GIB, GPUQ_ENV

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


def test_device_is_cpu_when_cuda_is_disabled() -> None:
    assert Allocation.from_env(GPUQ_ENV).device(disable_cuda=True) == torch.device("cpu")


@needs_no_gpu
def test_without_cuda_everything_runs_on_the_cpu() -> None:
    single = Allocation.from_env(GPUQ_ENV)
    rank_one = Allocation.from_env({**GPUQ_ENV, "GPUQ_MODE": "torchrun", "LOCAL_RANK": "1"})

    assert single.device() == torch.device("cpu")
    assert rank_one.device() == torch.device("cpu")
    assert single.cap_memory() is None


def test_wrap_on_the_cpu_moves_the_model_and_does_not_wrap_it() -> None:
    model = torch.nn.Linear(4, 2)

    wrapped = Allocation.from_env(GPUQ_ENV).wrap(model, disable_cuda=True)

    assert isinstance(wrapped, torch.nn.Linear)
    assert all(p.device.type == "cpu" for p in wrapped.parameters())
    assert wrapped(torch.ones(3, 4)).shape == (3, 2)


@pytest.mark.gpu
@needs_gpu
def test_device_is_the_first_visible_gpu() -> None:
    assert Allocation.from_env(GPUQ_ENV).device() == torch.device("cuda", 0)


@pytest.mark.gpu
@needs_gpu
def test_torchrun_device_follows_local_rank() -> None:
    rank = torch.cuda.device_count() - 1
    allocation = Allocation.from_env({**GPUQ_ENV, "GPUQ_MODE": "torchrun", "LOCAL_RANK": str(rank)})

    assert allocation.device() == torch.device("cuda", rank)


@pytest.mark.gpu
@needs_gpu
def test_wrap_uses_dataparallel_only_with_several_gpus_and_not_under_torchrun() -> None:
    """In a fresh interpreter: the model it wraps goes to the GPU, and a CUDA context made in pytest's own
    process would stay on GPU 0 for the session, as use outside gpuq to every later GPU test's daemon (it took
    the room test_suspend_gpu's jobs leave their context in)."""
    code = f"""
        import torch
        from gpuq_scheduler.jobs.allocation import Allocation
        env = {GPUQ_ENV!r}
        several = torch.cuda.device_count() > 1
        dataparallel = Allocation.from_env(env).wrap(torch.nn.Linear(4, 2))
        torchrun = Allocation.from_env({{**env, "GPUQ_MODE": "torchrun", "LOCAL_RANK": "0"}})
        assert isinstance(dataparallel, torch.nn.DataParallel) == several
        assert next(dataparallel.parameters()).device == torch.device("cuda", 0)
        assert isinstance(torchrun.wrap(torch.nn.Linear(4, 2)), torch.nn.Linear)
        print("wrapped")
    """
    result = run_isolated(code, {})

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "wrapped"


def run_isolated(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter: a memory cap lasts as long as the process that set it."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.gpu
@needs_gpu
def test_cap_memory_makes_an_allocation_past_mem_raise_out_of_memory() -> None:
    code = """
        import torch
        from gpuq_scheduler.jobs.allocation import current
        fraction = current().cap_memory()
        total = torch.cuda.get_device_properties(0).total_memory
        assert fraction is not None and abs(fraction - (1 << 30) / total) < 1e-9, fraction
        small = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")  # within the cap
        try:
            torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            print("capped")
    """
    result = run_isolated(code, {"GPUQ_JOB_ID": "1", "GPUQ_MODE": "single", "GPUQ_MEM_PER_GPU": str(GIB)})

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "capped"


@pytest.mark.gpu
@needs_gpu
def test_cap_memory_never_exceeds_the_whole_gpu() -> None:
    code = """
        from gpuq_scheduler.jobs.allocation import current
        print(current().cap_memory())
    """
    result = run_isolated(code, {"GPUQ_JOB_ID": "1", "GPUQ_MEM_PER_GPU": str(1 << 50)})

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1.0"
