"""Code written for submitit runs through gpuq with one changed import::

    import gpuq_scheduler.submitit as submitit

    executor = submitit.AutoExecutor(folder="log_test")
    executor.update_parameters(timeout_min=10, gpus_per_node=1, slurm_partition="dev")
    job = executor.submit(add, 5, 7)        # a gpuq job on this workstation (GPUQ_ON=lab: on cluster lab)
    assert job.result() == 12

docs/usage.md (From submitit) maps every parameter and says what is not supported and why. The names load
on first use (PEP 562): a job that unpickles a ``helpers.Checkpointable`` loads ``helpers`` alone.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuq_scheduler.submitit import helpers
    from gpuq_scheduler.submitit.core import (
        AutoExecutor,
        IgnoredParameter,
        Job,
        JobPaths,
        LocalExecutor,
        UncompletedJobError,
    )
    from gpuq_scheduler.submitit.environment import JobEnvironment
    from gpuq_scheduler.submitit.helpers import DelayedSubmission
    from gpuq_scheduler.submitit.parameters import UnknownParameter

_EXPORTS = {
    "AutoExecutor": "gpuq_scheduler.submitit.core",
    "LocalExecutor": "gpuq_scheduler.submitit.core",
    "Job": "gpuq_scheduler.submitit.core",
    "JobPaths": "gpuq_scheduler.submitit.core",
    "IgnoredParameter": "gpuq_scheduler.submitit.core",
    "UncompletedJobError": "gpuq_scheduler.submitit.core",
    "DelayedSubmission": "gpuq_scheduler.submitit.helpers",
    "JobEnvironment": "gpuq_scheduler.submitit.environment",
    "UnknownParameter": "gpuq_scheduler.submitit.parameters",
}

__all__ = [
    "AutoExecutor",
    "DelayedSubmission",
    "IgnoredParameter",
    "Job",
    "JobEnvironment",
    "JobPaths",
    "LocalExecutor",
    "UncompletedJobError",
    "UnknownParameter",
    "helpers",
]


def __getattr__(name: str) -> Any:
    import importlib

    if name == "helpers":
        return importlib.import_module("gpuq_scheduler.submitit.helpers")
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gpuq_scheduler.submitit' has no attribute {name!r} (see docs/usage.md)")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
