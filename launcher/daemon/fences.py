"""The fence each packed job runs behind, and the MPS control daemons that make one.

A job that shares its GPUs (``--mem``) is held to its share: on a GPU with MPS (``gpus.mps``) it runs as
a client of that GPU's MPS server with ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` at its reservation (its share
plus placement's overhead: the limit counts the CUDA context, ~0.5 GiB measured on H100), so the driver
refuses it memory past that; elsewhere, cooperatively: PyTorch's allocator reads
``per_process_memory_fraction`` from ``PYTORCH_CUDA_ALLOC_CONF`` (share over the GPU's total; the context
is not counted), and ``GPUQ_MEM_PER_GPU`` is there for ``current().cap_memory()``. Whole-GPU and CPU jobs
run without a fence. A multi-GPU packed job is fenced cooperatively: an MPS server here serves one GPU.

The daemon starts a GPU's control daemon with the first packed job placed there and quits it once the
last one has ended (after the tick's commit), and at start-up quits those an earlier daemon left behind
with no packed job running.
"""

from __future__ import annotations

import functools
import logging

from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.launcher.daemon.state import SchedulerState

log = logging.getLogger("gpuq.fences")

MPS, COOPERATIVE, NONE = "mps", "cooperative", "none"


def kind(scheduler: SchedulerState, record: JobRecord) -> str:
    """The fence a job gets: none for whole GPUs and CPU jobs; MPS for a one-GPU share where it works."""
    spec = record.spec
    if spec.mem_per_gpu is None or not spec.gpus or scheduler.fence == NONE:
        return NONE
    if scheduler.mps is not None and spec.gpus == 1 and not scheduler.mps_broken:
        return MPS
    return COOPERATIVE


def environment(
    scheduler: SchedulerState, record: JobRecord, gpus: tuple[int, ...], uuids: tuple[str, ...]
) -> dict[str, str]:
    """What a job's environment gets for its fence (started MPS control daemon included)."""
    fence = kind(scheduler, record)
    share = record.spec.mem_per_gpu
    if fence == NONE or share is None:
        return {}
    if fence == MPS:
        assert scheduler.mps is not None
        uuid = uuids[0]
        if uuid not in scheduler.mps_jobs:
            problem = scheduler.mps.start(uuid)
            if problem is not None:
                log.warning("MPS on GPU %s: %s; packed jobs get the cooperative fence", gpus[0], problem)
                scheduler.mps_broken = problem
                return environment(scheduler, record, gpus, uuids)
            scheduler.mps_jobs[uuid] = set()
        scheduler.mps_jobs[uuid].add(record.id)
        limit = share + scheduler.policy.overhead
        return {**scheduler.mps.client_env(uuid, limit), "GPUQ_FENCE": MPS}
    totals = [g.total for g in scheduler.last_snapshot if g.index in gpus] or [share]
    fraction = min(1.0, share / min(totals))
    theirs = record.spec.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    kept = [o for o in theirs.split(",") if o.strip() and not o.strip().startswith("per_process_memory_fraction")]
    conf = ",".join([*kept, f"per_process_memory_fraction:{fraction:.4f}"])
    return {"PYTORCH_CUDA_ALLOC_CONF": conf, "GPUQ_FENCE": COOPERATIVE}


def ended(scheduler: SchedulerState, job_id: int) -> None:
    """A job is gone: quit its GPU's control daemon once no packed job is left there (after the commit)."""
    if scheduler.mps is None:
        return
    for uuid, jobs in list(scheduler.mps_jobs.items()):
        if job_id in jobs:
            jobs.discard(job_id)
            if not jobs:
                del scheduler.mps_jobs[uuid]
                scheduler.after_commit.append(functools.partial(_quit_if_idle, scheduler, uuid))


def forget(scheduler: SchedulerState, job_id: int) -> None:
    """A launch rolled back: the job is no client; a control daemon started for it alone is quit now."""
    for uuid, jobs in list(scheduler.mps_jobs.items()):
        if job_id in jobs:
            jobs.discard(job_id)
            if not jobs:
                del scheduler.mps_jobs[uuid]
                _quit_if_idle(scheduler, uuid)


def close(scheduler: SchedulerState) -> None:
    """The daemon stops: quit every control daemon no running job is a client of (those that serve running
    jobs stay with them; the next daemon adopts them)."""
    if scheduler.mps is not None:
        for uuid in scheduler.mps.running():
            if uuid not in scheduler.mps_jobs:
                scheduler.mps.stop(uuid)


def _quit_if_idle(scheduler: SchedulerState, uuid: str) -> None:
    if uuid not in scheduler.mps_jobs and scheduler.mps is not None:
        scheduler.mps.stop(uuid)


def adopt(scheduler: SchedulerState) -> None:
    """At start-up: running packed jobs keep their GPU's control daemon; any other left behind is quit."""
    if scheduler.mps is None:
        return
    for job in scheduler.running.values():
        if kind(scheduler, job.record) == MPS and job.record.gpu_uuids:
            scheduler.mps_jobs.setdefault(job.record.gpu_uuids[0], set()).add(job.record.id)
    for uuid in scheduler.mps.running():
        if uuid not in scheduler.mps_jobs:
            scheduler.mps.stop(uuid)


def owners(scheduler: SchedulerState) -> dict[int, str]:
    """GPU index -> the user whose MPS server runs there (one user per MPS server)."""
    users = {}
    for job in scheduler.running.values():
        record = job.record
        if record.gpus and record.gpu_uuids and record.id in scheduler.mps_jobs.get(record.gpu_uuids[0], ()):
            users[record.gpus[0]] = record.user
    return users
