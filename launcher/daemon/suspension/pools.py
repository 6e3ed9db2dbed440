"""The fast path's pools (#40): a job keeps the pinned host memory of its last suspend where the host can
afford it, and gives it back when that stops holding.

A pool makes the job's next suspend copy at the link's speed (47 GB/s on the lent H200) instead of pinning
host memory afresh at the VM's 3-5 GB/s (a 100 GiB victim: its urgent job waited 22.8 s, 4.3 s with a pool;
docs/suspend.md), and costs its size in host memory while the job runs. ``GPUQ_FAST_POOL`` in the daemon's
environment: ``on`` keeps every pool, ``off`` none (given back at once); unset or ``auto``, the rule of
``hostroom.keeps``: a pool is kept while the host's available memory (the pools held already left out)
covers the margin a suspend leaves free plus what the other running preemptible jobs' suspends would take.

* At a resume (``keep_after_resume``): the job's processes are told whether to keep their buffers.
* Once a pass (``tend``): a pool whose rule no longer holds (memory taken by something else, another
  preemptible job grown) is given back: the job is told (``fastpath.give_back``), unpins beside its work and
  then says so in its pool file; the host checks count it as held until then.
* At a suspend whose copy would not fit otherwise (``make_room``): other jobs' pools, largest first; the
  suspend's helper waits for the room (``suspender.suspend``'s ``room_coming``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Protocol

from gpuq_scheduler.jobs.errors import DaemonError
from gpuq_scheduler.jobs.fastmove_fake import SCALE as FAKE_SCALE
from gpuq_scheduler.jobs.store.events import Event, PoolGivenBack
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.daemon.lives import Lives, Running
from gpuq_scheduler.launcher.daemon.owned import Suspensions
from gpuq_scheduler.launcher.daemon.suspension import fastpath
from gpuq_scheduler.launcher.daemon.suspension.hostmem import host_memory, margin
from gpuq_scheduler.launcher.gpus.fake import FakeGpus
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot, GpuSource
from gpuq_scheduler.launcher.policy import hostroom

log = logging.getLogger("gpuq.pools")

MODES = ("auto", "on", "off")
TOLD_AGAIN = 60.0  # seconds before a job told to give its pool back that still holds it is told again
GIB = 1 << 30


class Daemon(Protocol):
    """What the pools' rules read of the daemon's state (``SchedulerState`` is one): the jobs on their GPUs and
    those acting, the state directory (their fast directories), whether the GPUs are the fake inventory's, the
    last look at the GPUs, GPUQ_FAST_POOL."""

    @property
    def lives(self) -> Lives: ...

    @property
    def state(self) -> StateDir: ...

    @property
    def source(self) -> GpuSource: ...

    @property
    def last_snapshot(self) -> list[GpuSnapshot]: ...

    @property
    def suspensions(self) -> Suspensions: ...


def mode(environ: Mapping[str, str]) -> str:
    """``GPUQ_FAST_POOL``: auto (the default), on or off; DaemonError for anything else."""
    found = environ.get(fastpath.POOL_ENV) or "auto"
    if found not in MODES:
        raise DaemonError(f"{fastpath.POOL_ENV}={found[:40]!r}: set it to auto (the default), on or off")
    return found


def held(scheduler: Daemon, job: Running) -> int:
    """Bytes of pinned host memory the job's processes keep for their next suspend (``fastpath.pool_of``)."""
    fast = scheduler.state.fast_dir(job.record.id)
    if not job.record.spec.preemptible or not os.path.isdir(fast):
        return 0
    return fastpath.pool_of(fast, job.pids, FAKE_SCALE if _fake(scheduler) else 1)


def _fake(scheduler: Daemon) -> bool:
    return isinstance(scheduler.source, FakeGpus)


def gpu_state(scheduler: Daemon, job: Running) -> int:
    """Bytes the job holds on its GPUs: at the last sample, or, before one, what the last look at the GPUs
    lists for its processes."""
    if job.held:
        return sum(job.held.values())
    return sum(
        used
        for gpu in scheduler.last_snapshot
        if gpu.index in job.record.gpus
        for pid, used in (gpu.processes or {}).items()
        if pid in job.pids
    )


def _others_need(scheduler: Daemon, but: int, pools: Mapping[int, int]) -> int:
    """What the suspends of the running preemptible jobs other than ``but`` would take from host memory:
    their GPU state less their pools. A job being suspended or resumed counts as it stands: the host's
    available memory shows its copy so far."""
    acting = scheduler.lives.acting
    return sum(
        max(0, gpu_state(scheduler, job) - pools.get(job_id, 0))
        for job_id, job in scheduler.lives.running.items()
        if job_id != but and job_id not in acting and job.record.spec.preemptible
    )


def pooled(scheduler: Daemon) -> dict[int, int]:
    """The running jobs that keep a pool (not one being suspended or resumed), and its bytes."""
    acting = scheduler.lives.acting
    found = {job_id: held(scheduler, job) for job_id, job in scheduler.lives.running.items() if job_id not in acting}
    return {job_id: size for job_id, size in found.items() if size > 0}


def keep_after_resume(scheduler: Daemon, job: Running) -> bool:
    """Whether the job about to resume keeps its pinned host memory afterwards (held now: its copy)."""
    chosen = scheduler.suspensions.pool_mode
    if chosen != "auto":
        return chosen == "on"
    available, total = host_memory(_fake(scheduler))
    return hostroom.keeps(available, margin(total), _others_need(scheduler, job.record.id, pooled(scheduler)))


def reclaimable(scheduler: Daemon, but: set[int]) -> dict[int, int]:
    """The pools a suspend may have given back for its room (none with ``GPUQ_FAST_POOL=on``): those of the
    running jobs not in ``but``."""
    if scheduler.suspensions.pool_mode == "on":
        return {}
    return {job_id: size for job_id, size in pooled(scheduler).items() if job_id not in but}


def make_room(scheduler: Daemon, jobs: set[int], need: int, now: float, events: list[Event]) -> bool:
    """Before suspending ``jobs``, whose copies take ``need`` bytes: if that does not fit in host memory with
    the margin, tell the fewest other jobs to give their pools back that make it fit (pools already being
    given back count as room to come: preemption asks once for all its victims, then each victim's suspend
    again). Whether room is to come (each suspend's helper then waits for it)."""
    pools = reclaimable(scheduler, jobs)
    if not pools:
        return False
    available, total = host_memory(_fake(scheduler))
    spare = margin(total)
    told = {job: size for job, size in pools.items() if _told_at(scheduler, job) is not None}
    rest = {job: size for job, size in pools.items() if job not in told}
    chosen = hostroom.give_back(need, available + sum(told.values()), spare, rest) or []
    whose = ", ".join(map(str, sorted(jobs)))
    for other in chosen:
        _tell(scheduler, other, pools[other], f"job {whose}'s suspend needs the room", now, events)
    return bool(chosen) or (bool(told) and need + spare > available)


def tend(scheduler: Daemon, now: float, events: list[Event]) -> None:
    """Once a pass: give back each pool whose rule no longer holds (every pool with ``GPUQ_FAST_POOL=off``)."""
    for job_id, marks in scheduler.lives.marked():
        if job_id not in scheduler.lives.running:
            marks.pool_told = None  # suspended: its pool is its copy now
    chosen = scheduler.suspensions.pool_mode
    if chosen == "on" or not any(job.record.spec.preemptible for job in scheduler.lives.running.values()):
        return
    pools = pooled(scheduler)
    for job_id, marks in scheduler.lives.marked():
        if job_id not in pools:
            marks.pool_told = None  # given back
    if not pools:
        return
    available, total = host_memory(_fake(scheduler))
    spare = margin(total)
    for job_id, size in pools.items():
        if chosen == "off":
            _tell(scheduler, job_id, size, "GPUQ_FAST_POOL=off", now, events)
            continue
        others = _others_need(scheduler, job_id, pools)
        if not hostroom.keeps(available, spare, others):
            why = (
                f"the host's {available / GIB:.1f} GiB of available memory no longer cover the margin of "
                f"{spare / GIB:.1f} GiB and the other preemptible jobs' suspends ({others / GIB:.1f} GiB)"
            )
            _tell(scheduler, job_id, size, why, now, events)


def _told_at(scheduler: Daemon, job_id: int) -> float | None:
    """When the job was last told to give its pool back (monotonic), if it was and still keeps it."""
    marks = scheduler.lives.peek(job_id)
    return marks.pool_told if marks is not None else None


def _tell(scheduler: Daemon, job_id: int, size: int, why: str, now: float, events: list[Event]) -> None:
    """Tell the job to give its pool back, once (again only after TOLD_AGAIN seconds if it still holds it)."""
    told = _told_at(scheduler, job_id)
    if told is not None and time.monotonic() < told + TOLD_AGAIN:
        return
    job = scheduler.lives.running[job_id]
    pids = fastpath.give_back(scheduler.state.fast_dir(job_id), sorted(job.pids))
    scheduler.lives.marks(job_id).pool_told = time.monotonic()
    log.info("job %d told to give back its pool of %.1f GiB: %s", job_id, size / GIB, why)
    events.append(PoolGivenBack(now, job_id, size, why, tuple(pids)))
