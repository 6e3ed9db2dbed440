"""The daemon learning each kind of job's memory (``--mem auto``): resolve a pending job's reservation
before placement, file a probe, let a probe's peak count once it has settled, and learn from every job
that ends. The arithmetic is ``policy.memory``'s; this step keeps its inputs and writes what it learns. It
takes what it reads and writes (the learned peaks and probes, the job table, the policy, the live jobs), not
the daemon's whole state.
"""

from __future__ import annotations

import dataclasses

from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.launcher.daemon.lives import Lives
from gpuq_scheduler.launcher.daemon.owned import MemAuto
from gpuq_scheduler.launcher.gpus.mps import Fence
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot
from gpuq_scheduler.launcher.policy import memory
from gpuq_scheduler.launcher.policy.placement import Policy


def keys(record: JobRecord) -> list[str]:
    """Where ``record``'s peak is filed and looked up: its name and command count for its own user only."""
    spec = record.spec
    return memory.kinds(like=spec.like, array_id=record.array_id, name=spec.name, kind=spec.kind, owner=record.uid)


def resolve(
    mem: MemAuto, table: JobTable, policy: Policy, snapshot: list[GpuSnapshot], fence: Fence, record: JobRecord
) -> JobRecord | str:
    """A pending ``--mem auto`` job with the reservation it would get now (on the GPUs of ``snapshot``, under
    ``fence``), or why it waits for a probe."""
    biggest = max((g.total for g in snapshot if not g.lost), default=None)
    kinds = keys(record)
    spec = record.spec
    if spec.like is not None and f"job:{spec.like}" not in mem.learned:
        model = table.get(spec.like)  # --like: that job's recorded peak, looked up once
        if model is not None and model.peak_mem:
            mem.learned[f"job:{spec.like}"] = memory.Peak(model.peak_mem, model.id)
    found = memory.estimate(
        record.id,
        kinds,
        mem.learned,
        mem.probes,
        margin=policy.auto_margin,
        overhead=policy.overhead,
        probe_mem=policy.auto_probe_mem,
        biggest_gpu=biggest,
        first=_first_share(policy, snapshot, fence),
    )
    if isinstance(found, memory.Wait):
        return found.reason
    if found.probe:  # the others of its kind wait for this one's peak (filed now: they come later this pass)
        for key in kinds:
            mem.probes.setdefault(key, record.id)
    if spec.mem_per_gpu == found.mem and spec.mem_from == found.note:
        return record
    return record.replace(spec=dataclasses.replace(spec, mem_per_gpu=found.mem, mem_from=found.note))


def _first_share(policy: Policy, snapshot: list[GpuSnapshot], fence: Fence) -> int | None:
    """The fenced first share of a kind with no history (``policy.memory.first_share``), on the smallest GPU
    so that it fits on any; None (a probe runs first) where no fence would hold it, where a probe's size is
    configured, or where ``GPUQ_AUTO_FIRST=probe``."""
    if policy.auto_first is None or policy.auto_probe_mem is not None or fence is Fence.NONE:
        return None
    if policy.auto_first:
        return policy.auto_first
    smallest = min((g.total for g in snapshot if not g.lost), default=None)
    return None if smallest is None else memory.first_share(smallest - policy.margin, policy.overhead)


def launched(table: JobTable, record: JobRecord) -> None:
    """An auto job starts: record the reservation it got and where it came from, for `gpuq show`."""
    table.update_spec(record.id, record.spec)


def settle(mem: MemAuto, table: JobTable, policy: Policy, lives: Lives, now: float, peaks: dict[int, int]) -> None:
    """Count the peaks sampled just now. A probe whose peak has held still for ``auto_steady`` seconds, or
    that has run ``auto_settle`` seconds (``policy.memory.counts``), teaches its kinds, and from then on
    holds only its own learned share, so its GPU takes packed jobs beside it: an array waits seconds for its
    probe, not a whole run. Its later samples keep teaching, so a member that outgrew the early figure comes
    back with the probe's peak when that is more than twice its share. (The probe itself started with no
    fence; a probe that grows later is the one job of its kind that can still crowd its neighbours.)"""
    probes = set(mem.probes.values())
    for job_id, held in peaks.items():  # sampled from the running jobs
        running = lives.running[job_id]
        if held > running.peak and job_id in probes:
            running.grew_at = now
        running.peak = max(running.peak, held)
    for job_id in probes:
        job = lives.running.get(job_id)
        peak = job.peak if job is not None else 0
        if job is None or peak <= 0:
            continue
        ran = now - (job.record.started_at or now)
        still = now - job.grew_at if job.grew_at is not None else None
        if not memory.counts(ran, still, settle=policy.auto_settle, steady=policy.auto_steady):
            continue
        _teach(mem, table, keys(job.record), memory.Peak(peak, job_id, running=True))
        spec = job.record.spec
        if spec.mem_per_gpu is None and spec.mem_auto:
            found = memory.estimate(
                job_id,
                keys(job.record),
                mem.learned,
                {},
                margin=policy.auto_margin,
                overhead=policy.overhead,
            )
            if isinstance(found, memory.Estimate) and found.mem is not None:
                note = f"a probe; since it settled, {found.note}"
                job.record = job.record.replace(spec=dataclasses.replace(spec, mem_per_gpu=found.mem, mem_from=note))
                table.update_spec(job_id, job.record.spec)


def ended(mem: MemAuto, table: JobTable, lives: Lives, record: JobRecord, outcome: Outcome) -> None:
    """Learn from a job that ended: its peak, or, stopped out of memory at a share, twice that share. A
    victim of another job's memory teaches nothing: its run says nothing of its own need."""
    job = lives.running.get(record.id)  # it ran: still on its GPUs until it is forgotten
    peak = (job.peak if job is not None else 0) or (record.peak_mem or 0)
    share = record.spec.mem_per_gpu
    if outcome.cause.not_its_fault:
        return
    if outcome.cause in (Cause.OOM_PAST_SHARE, Cause.OOM) and share is not None and record.spec.gpus:
        _teach(mem, table, keys(record), memory.Peak(2 * share, record.id, raised=True))
    elif peak > 0 and outcome.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.TIMEOUT):
        _teach(mem, table, keys(record), memory.Peak(peak, record.id))


def _teach(mem: MemAuto, table: JobTable, keys: list[str], seen: memory.Peak) -> None:
    changed = memory.learn(mem.learned, keys, seen)
    if not changed:
        return
    mem.learned.update(changed)
    durable = {key: (peak.bytes, peak.job_id, peak.raised) for key, peak in changed.items() if not peak.running}
    if durable:
        table.set_learned(durable)
