"""Packed jobs suspended in place (#40): a client of gpuq's MPS server whose PyTorch memory the fast path
released keeps only its CUDA context on its GPU, frozen in its cgroup, while its neighbours run on. Another
job whose fast release left no more than its context may keep it so too (``context_room``).

The driver cannot checkpoint an MPS client (its lock answers 801), so only a job the fast path can take is
suspended there: a ``--preemptible`` one, whose processes answer gpuq's request (``fastpath`` beside this);
the helper takes the driver's 801 for such a process as "keep its context" (``suspender.suspend``). Its share
is free for others meanwhile: a suspended job holds nothing placement counts. So it cannot wait, as a job
the driver checkpointed does, until no running job holds its GPU (its neighbours always do): it resumes once
its share fits again beside what runs there now, as placement would place it on that GPU (``fits``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol

from gpuq_scheduler.jobs.fastsuspend import SUSPEND_SIGNAL, Path
from gpuq_scheduler.jobs.units import format_size
from gpuq_scheduler.launcher.daemon.lives import Running
from gpuq_scheduler.launcher.daemon.suspension import fastpath
from gpuq_scheduler.launcher.daemon.watching import sight
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot
from gpuq_scheduler.launcher.policy.placement import Holding, Policy, Request, place


class Daemon(sight.Seeing, Protocol):
    """What a suspend in place reads of the daemon's state (``SchedulerState`` is one): what tells our jobs'
    processes from others' (``sight.Seeing``), the last look at the GPUs, placement's policy."""

    @property
    def last_snapshot(self) -> list[GpuSnapshot]: ...

    @property
    def policy(self) -> Policy: ...


def is_client(scheduler: Daemon, job_id: int) -> bool:
    """Whether the job runs (or is suspended) as a client of one of gpuq's MPS servers."""
    return any(job_id in jobs for jobs in scheduler.mps_jobs.values())


def refusal(scheduler: Daemon, job: Running) -> str:
    """Why this job, if an MPS client, cannot be suspended in place ("" if it may be tried: the helper still
    asks its processes, and one that has not imported torch is left running, its reason saying so)."""
    if not is_client(scheduler, job.record.id):
        return ""
    if not job.record.spec.preemptible:
        return (
            "it runs as a client of an MPS server, which the driver cannot checkpoint; only a --preemptible "
            "PyTorch job is suspended in place there (submit it with --preemptible)"
        )
    if not any(fastpath.catches(pid, SUSPEND_SIGNAL) for pid in job.pids):
        return (
            "it runs as a client of an MPS server, which the driver cannot checkpoint, and no process of it "
            "answers the fast path's request (a PyTorch program started by Python takes it)"
        )
    return ""


def fits(scheduler: Daemon, job: Running, claims: Sequence[Holding]) -> bool:
    """Whether the suspended job's share fits again on its GPU beside ``claims`` (placement's holdings: the
    running jobs' reservations, places kept), as placement would start it there now. What its own frozen
    context holds is its own, not a stranger's: counted within its reservation, not beside it."""
    record = job.record
    own: dict[int, int] = {}
    for gpu in scheduler.last_snapshot:
        own[gpu.index] = sum(used for pid, used in (gpu.processes or {}).items() if pid in job.pids)
    views = [
        dataclasses.replace(view, external=max(0, view.external - own.get(view.index, 0)))
        for view in sight.views(scheduler, scheduler.last_snapshot)
        if view.index in record.gpus
    ]
    if len(views) != len(record.gpus):
        return False  # its GPU is not seen (lost): it cannot resume there
    others = [claim for claim in claims if claim.job_id != record.id]  # its own kept place is its room
    request = Request(record.id, len(record.gpus), record.spec.mem_per_gpu, only=record.gpus)
    return bool(place([request], views, others, time.time(), scheduler.policy).decisions)


def waits(scheduler: Daemon, job: Running, claims: Sequence[Holding]) -> str:
    """What the suspended job waits for to resume, in its reason ("" if its share fits now)."""
    share = format_size(job.record.spec.mem_per_gpu)
    return "" if fits(scheduler, job, claims) else f"its {share} share to fit on GPU(s)"


def context_room(scheduler: Daemon, job: Running) -> int:
    """Bytes a job that is no MPS client may leave on its GPUs, frozen, when its fast release left no more
    (``Path.CONTEXT_KEPT``: its context, a gigabyte at most, whose driver's checkpoint and restore cost seconds).
    What it leaves is outside use to placement while it is suspended (its pids are no running job's), and a
    whole-GPU job starts only beside negligible outside use: so it may leave what keeps each of its GPUs
    within that, a whole-GPU job (the one that preempted it, say) still placed there. 0: none (its context
    goes with the driver's checkpoint)."""
    if is_client(scheduler, job.record.id):
        return 0  # the driver cannot take its context anyway: in place (``suspender.suspend``)
    views = [view for view in sight.views(scheduler, scheduler.last_snapshot) if view.index in job.record.gpus]
    if len(views) != len(job.record.gpus):
        return 0  # a GPU of its not seen: nothing to judge by
    return max(0, min(scheduler.policy.negligible - view.external for view in views))


def moved(path: dict[str, Any]) -> int | None:
    """What a suspend in place put in host memory (its context stays on its GPU): what the fast path moved;
    None for another path (the whole of what the job held)."""
    kept = (Path.IN_PLACE.value, Path.CONTEXT_KEPT.value)
    return int(path.get("fast_bytes") or 0) if path.get("path") in kept else None
