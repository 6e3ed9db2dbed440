"""What a job is and where it is written; the Python API for submitting and waiting.

This package never imports NVML, psutil or click: it is the light path ``gpuq submit`` takes.
"""

from jobs.api import cancel, status, submit, wait
from jobs.errors import GpuqError
from jobs.model import JobRecord, JobSpec, JobState, Mode, Outcome

__all__ = ["GpuqError", "JobRecord", "JobSpec", "JobState", "Mode", "Outcome", "cancel", "status", "submit", "wait"]
