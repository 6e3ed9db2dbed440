"""The fence each packed job runs behind, and the MPS control daemons that make one.

A job that shares its GPUs (``--mem``) is held to its share: on a GPU with MPS (``gpus.mps``) it runs as
a client of its user's MPS server on that GPU with ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` at its reservation
(its share plus placement's overhead: the limit counts the CUDA context, ~0.5 GiB measured on H100), so
the driver refuses it memory past that; elsewhere, cooperatively: PyTorch's allocator reads
``per_process_memory_fraction`` from ``PYTORCH_CUDA_ALLOC_CONF`` (share over the GPU's total; the context
is not counted), and ``GPUQ_MEM_PER_GPU`` is there for ``current().cap_memory()``. Whole-GPU and CPU jobs
run without a fence. A multi-GPU packed job is fenced cooperatively: an MPS server here serves one GPU.

Control daemons are one per (GPU, user) (``daemon.controls``), so packed jobs of several users share a GPU,
each behind its own user's server. A packed job placed on a GPU whose control daemon for its user is not
up yet stays pending on that GPU, its memory reserved, "waiting for its MPS fence on GPU 0", while the
control daemon starts beside the pass; it starts once that one is up, or, if it failed to start, with the
cooperative fence. A control daemon is quit once its last job has ended (after the tick's commit), and
at start-up those an earlier daemon left with no packed job running are quit.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, MutableMapping
from typing import Protocol

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.accounts import Account
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.launcher.daemon.controls import Controls, Phase
from gpuq_scheduler.launcher.daemon.lives import Lives
from gpuq_scheduler.launcher.gpus.mps import Fence, Key
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot
from gpuq_scheduler.launcher.policy.placement import Holding

log = logging.getLogger("gpuq.fences")


MPS, COOPERATIVE, NONE = Fence.MPS, Fence.COOPERATIVE, Fence.NONE


class Fencing(Protocol):
    """What the fences ask of the daemon's state (which has each of these): the fence packed jobs get and MPS's
    control daemons, the packed jobs each serves, the placed jobs waiting for theirs and those that took the
    cooperative fence instead, the pending jobs (a waiting job still is one), and what waits for the commit."""

    @property
    def fence(self) -> Fence: ...

    @property
    def controls(self) -> Controls | None: ...

    @property
    def mps_jobs(self) -> dict[Key, set[int]]: ...

    @property
    def fence_waits(self) -> MutableMapping[int, tuple[tuple[int, ...], tuple[str, ...]]]: ...

    @property
    def fence_fallback(self) -> set[int]: ...

    @property
    def pending(self) -> Mapping[int, JobRecord]: ...

    @property
    def after_commit(self) -> list[Callable[[], None]]: ...


def kind(scheduler: Fencing, record: JobRecord) -> Fence:
    """The fence a job gets: none for whole GPUs and CPU jobs; MPS for a one-GPU share where it works."""
    spec = record.spec
    if spec.mem_per_gpu is None or not spec.gpus or scheduler.fence is Fence.NONE:
        return Fence.NONE
    if scheduler.controls is not None and spec.gpus == 1 and scheduler.fence is Fence.MPS:
        return Fence.MPS
    return Fence.COOPERATIVE


def key(record: JobRecord, uuid: str) -> Key:
    return Key(uuid, record.uid)


def environment(
    scheduler: Fencing,
    record: JobRecord,
    gpus: tuple[int, ...],
    uuids: tuple[str, ...],
    *,
    account: Account | None,
    overhead: int,
    snapshot: list[GpuSnapshot],
) -> dict[str, str] | None:
    """What a job's environment gets for its fence; None while the control daemon of its MPS fence is not up
    yet (it is being started: the job waits for it). ``account``: the job's owner's, which a shared queue's
    control daemon runs as (None: the daemon's own); ``overhead``: placement's, on top of the job's share;
    ``snapshot``: the GPUs as last seen (their sizes)."""
    fence = kind(scheduler, record)
    share = record.spec.mem_per_gpu
    if fence is Fence.NONE or share is None:
        return {}
    if fence is Fence.MPS:
        assert scheduler.controls is not None
        server = key(record, uuids[0])
        phase = scheduler.controls.phase(server)
        if phase is Phase.UP:
            scheduler.mps_jobs.setdefault(server, set()).add(record.id)
            limit = share + overhead
            return {**scheduler.controls.mps.client_env(server, limit), "GPUQ_FENCE": Fence.MPS.value}
        if record.id not in scheduler.fence_fallback:
            scheduler.controls.start(server, account)  # a start that failed lately stays failed: no wait
            if scheduler.controls.phase(server) is not Phase.FAILED:
                return None
        log.warning("job %d on GPU %s: the cooperative fence (%s)", record.id, gpus[0], scheduler.controls.why(server))
    totals = [g.total for g in snapshot if g.index in gpus] or [share]
    fraction = min(1.0, share / min(totals))
    theirs = record.spec.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    kept = [o for o in theirs.split(",") if o.strip() and not o.strip().startswith("per_process_memory_fraction")]
    conf = ",".join([*kept, f"per_process_memory_fraction:{fraction:.4f}"])
    return {"PYTORCH_CUDA_ALLOC_CONF": conf, "GPUQ_FENCE": Fence.COOPERATIVE.value}


def wait(scheduler: Fencing, record: JobRecord, gpus: tuple[int, ...], uuids: tuple[str, ...]) -> None:
    """A placed job waits for its control daemon, pending on the GPU it was given (its memory reserved): it
    stays pending, as every job does until it starts."""
    scheduler.fence_waits[record.id] = (gpus, uuids)


def waiting_reason(scheduler: Fencing, job_id: int) -> str:
    gpus, _ = scheduler.fence_waits[job_id]
    return f"waiting for its MPS fence on GPU {gpus[0]}"


def holdings(scheduler: Fencing) -> list[Holding]:
    """The memory of jobs that wait for their fence, for placement: reserved on their GPUs as if running."""
    return [
        Holding(job_id, gpus, scheduler.pending[job_id].spec.mem_per_gpu, None)
        for job_id, (gpus, _) in scheduler.fence_waits.items()
        if job_id in scheduler.pending
    ]


def step(scheduler: Fencing, *, shared: bool) -> list[tuple[JobRecord, tuple[int, ...], tuple[str, ...]]]:
    """Between passes: collect control commands that ended, retry failed quits, and hand back the jobs that
    waited for a control daemon now up (or failed to start: they take the cooperative fence) to launch.
    ``shared``: a shared queue's, whose control daemons run as their users."""
    if scheduler.controls is None:
        return []
    settled = set(scheduler.controls.poll())
    ready = []
    for job_id, (gpus, uuids) in list(scheduler.fence_waits.items()):
        record = scheduler.pending.get(job_id)
        if record is None:  # cancelled (or ended otherwise) while it waited
            del scheduler.fence_waits[job_id]
            continue
        server = key(record, uuids[0])
        phase = scheduler.controls.phase(server)
        if phase is Phase.UP:
            del scheduler.fence_waits[job_id]
            ready.append((record, gpus, uuids))
        elif phase is Phase.FAILED or server in settled:  # it did not start: the cooperative fence
            scheduler.fence_fallback.add(job_id)
            del scheduler.fence_waits[job_id]
            ready.append((record, gpus, uuids))
        elif phase is None:  # the one it waited for quit meanwhile: start another
            scheduler.controls.start(server, accounts.account(record.uid) if shared else None)
    return ready


def ended(scheduler: Fencing, job_id: int) -> None:
    """A job is gone: quit its control daemon once no packed job is left there (after the commit)."""
    scheduler.fence_fallback.discard(job_id)
    for server in _leave(scheduler, job_id):
        scheduler.after_commit.append(functools.partial(_quit_if_idle, scheduler, server))


def forget(scheduler: Fencing, job_id: int) -> None:
    """A launch rolled back: the job is no client; a control daemon started for it alone is quit now."""
    for server in _leave(scheduler, job_id):
        _quit_if_idle(scheduler, server)


def _leave(scheduler: Fencing, job_id: int) -> list[Key]:
    """Take the job off the control daemons it is a client of: those left with no client."""
    empty = []
    for server, jobs in list(scheduler.mps_jobs.items()):
        if job_id in jobs:
            jobs.discard(job_id)
            if not jobs:
                del scheduler.mps_jobs[server]
                empty.append(server)
    return empty


def close(scheduler: Fencing) -> None:
    """The daemon stops: quit every control daemon no running job is a client of (those that serve running
    jobs stay with them; the next daemon adopts them)."""
    if scheduler.controls is not None:
        scheduler.controls.close(serving=scheduler.mps_jobs)


def _quit_if_idle(scheduler: Fencing, server: Key) -> None:
    waiting = any(
        key(record, uuids[0]) == server
        for job_id, (_, uuids) in scheduler.fence_waits.items()
        if (record := scheduler.pending.get(job_id))
    )
    if server not in scheduler.mps_jobs and not waiting and scheduler.controls is not None:
        scheduler.controls.quit(server)


def adopt(scheduler: Fencing, lives: Lives, *, shared: bool) -> None:
    """At start-up: running packed jobs keep their control daemon, and so do those suspended in place (frozen,
    their context on its server: ``daemon.suspension.inplace``); any other left behind is quit. ``shared``: a
    shared queue's, whose control daemons run as their users."""
    if scheduler.controls is None:
        return
    found = set(scheduler.controls.mps.running())
    for job in [*lives.running.values(), *lives.suspended.values()]:
        record = job.record
        if kind(scheduler, record) is Fence.MPS and record.gpu_uuids and key(record, record.gpu_uuids[0]) in found:
            scheduler.mps_jobs.setdefault(key(record, record.gpu_uuids[0]), set()).add(record.id)
    for server in found:
        account = accounts.account(server.uid) if shared else None
        scheduler.controls.adopt(server, account, serving=server in scheduler.mps_jobs)
