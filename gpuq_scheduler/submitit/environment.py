"""submitit's ``JobEnvironment`` inside a gpuq job: who the job is, read from what gpuq (or Slurm) set."""

from __future__ import annotations

import os
import socket


class JobEnvironment:
    """A gpuq job is one task on one node: ranks are 0 and counts 1. ``job_id`` is gpuq's id."""

    num_tasks = 1
    num_nodes = 1
    node = 0
    global_rank = 0
    local_rank = 0

    def __init__(self) -> None:
        if "GPUQ_JOB_ID" not in os.environ:
            raise RuntimeError("JobEnvironment() is read inside a job: this process is not a gpuq job")
        self.job_id = os.environ["GPUQ_JOB_ID"]
        self.array_job_id = os.environ.get("GPUQ_ARRAY_ID")
        self.array_task_id = os.environ.get("GPUQ_ARRAY_INDEX")
        self.cluster = "slurm" if "SLURM_JOB_ID" in os.environ else "local"
        self.hostname = socket.gethostname()

    def __repr__(self) -> str:
        return f"JobEnvironment(job_id={self.job_id}, hostname={self.hostname}, cluster={self.cluster})"
