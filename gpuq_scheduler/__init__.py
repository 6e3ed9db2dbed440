"""gpuq's Python API: ``from gpuq_scheduler import submit, array, wait`` for commands, ``Executor`` for functions.

The import name is the distribution's (``gpuq-scheduler``): ``gpuq`` is taken on PyPI twice over (the
``gpuq`` GPU-query library and the ``gpuqu`` queue both install a top-level ``gpuq``), and the repository's
folders keep their names inside it: ``jobs/`` installs as ``gpuq_scheduler.jobs`` and ``launcher/`` as
``gpuq_scheduler.launcher`` (see ``[tool.setuptools.package-dir]``), so gpuq takes no generic top-level
name from anyone.

Every import of a module inside runs this file first, so it stays light: the API names load on first
use (PEP 562), and ``import gpuq_scheduler.jobs.errors`` costs no more than that module.
"""

from __future__ import annotations

import os as _os

# Run from a source checkout (its root on sys.path, as in `python -m gpuq_scheduler` there), the package's
# folders sit beside this one rather than inside it: look for the subpackages there too, as an install
# would find them. An installed copy has them inside and is left alone.
_here = _os.path.dirname(__file__)
if not _os.path.isdir(_os.path.join(_here, "jobs")) and _os.path.isfile(
    _os.path.join(_here, _os.pardir, "jobs", "__init__.py")
):
    __path__.append(_os.path.dirname(_here))

TYPE_CHECKING = False  # typing costs ~3 ms to import, and every gpuq import runs this file first
if TYPE_CHECKING:
    from typing import Any

    from gpuq_scheduler.jobs.allocation import Allocation, current
    from gpuq_scheduler.jobs.api import array, cancel, status, submit, wait
    from gpuq_scheduler.jobs.errors import GpuqError
    from gpuq_scheduler.jobs.functions.executor import Executor, Job, JobFailed, Resubmit, as_completed, wait_all
    from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Mode
    from gpuq_scheduler.jobs.outcome import JobState, Outcome

_EXPORTS = {
    "submit": "gpuq_scheduler.jobs.api",
    "array": "gpuq_scheduler.jobs.api",
    "wait": "gpuq_scheduler.jobs.api",
    "status": "gpuq_scheduler.jobs.api",
    "cancel": "gpuq_scheduler.jobs.api",
    "Executor": "gpuq_scheduler.jobs.functions.executor",  # Python functions as jobs, as submitit runs them
    "Job": "gpuq_scheduler.jobs.functions.executor",
    "JobFailed": "gpuq_scheduler.jobs.functions.executor",
    "Resubmit": "gpuq_scheduler.jobs.functions.executor",  # what a function's checkpoint() returns (docs/suspend.md)
    "as_completed": "gpuq_scheduler.jobs.functions.executor",
    "wait_all": "gpuq_scheduler.jobs.functions.executor",
    "current": "gpuq_scheduler.jobs.allocation",  # inside a job: the GPUs, device and memory gpuq gave it
    "Allocation": "gpuq_scheduler.jobs.allocation",
    "GpuqError": "gpuq_scheduler.jobs.errors",
    "JobRecord": "gpuq_scheduler.jobs.model",
    "JobSpec": "gpuq_scheduler.jobs.model",
    "JobState": "gpuq_scheduler.jobs.outcome",
    "Mode": "gpuq_scheduler.jobs.model",
    "Outcome": "gpuq_scheduler.jobs.outcome",
}

__all__ = [
    "Allocation",
    "Executor",
    "GpuqError",
    "Job",
    "JobFailed",
    "JobRecord",
    "JobSpec",
    "JobState",
    "Mode",
    "Outcome",
    "Resubmit",
    "array",
    "as_completed",
    "cancel",
    "current",
    "status",
    "submit",
    "wait",
    "wait_all",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gpuq_scheduler' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
