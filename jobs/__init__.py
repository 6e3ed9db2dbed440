"""What a job is and where it is written; the Python API for submitting and waiting.

This package never imports NVML, psutil or click: it is the light path ``gpuq submit`` takes.
The API names load on first use (PEP 562), so ``import jobs.errors`` costs no more than that module.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~3 ms to import, and `import jobs.errors` runs this file first
if TYPE_CHECKING:
    from typing import Any

_EXPORTS = {
    "submit": "jobs.api",
    "array": "jobs.api",
    "wait": "jobs.api",
    "status": "jobs.api",
    "cancel": "jobs.api",
    "GpuqError": "jobs.errors",
    "JobRecord": "jobs.model",
    "JobSpec": "jobs.model",
    "JobState": "jobs.model",
    "Mode": "jobs.model",
    "Outcome": "jobs.model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'jobs' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
