"""The daemon watching the GPUs: what placement sees of each, which processes are our jobs', each job's
peak memory, and stopping the jobs of a GPU that stays lost."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Set
from typing import Any, Protocol

from gpuq_scheduler.jobs import causes
from gpuq_scheduler.jobs.causes import OutOfMemory
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store import notices
from gpuq_scheduler.jobs.store.events import Event, GpuLost, IdleReleased
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.jobs.units import format_duration, format_size
from gpuq_scheduler.launcher.daemon import fences, learning
from gpuq_scheduler.launcher.daemon.controls import Controls
from gpuq_scheduler.launcher.daemon.lives import Lives, Running
from gpuq_scheduler.launcher.daemon.owned import MemAuto, Monitor
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.gpus.mps import Key, server_pids
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot, GpuSource
from gpuq_scheduler.launcher.policy import blame
from gpuq_scheduler.launcher.policy.placement import GpuView, Policy
from gpuq_scheduler.launcher.supervisor import containment, processes

log = logging.getLogger("gpuq.scheduler")

LOST_AFTER = 5.0  # seconds a GPU must stay lost before its jobs are stopped: one NVML hiccup is not a dead GPU
SAMPLE_EVERY = 2.0  # seconds between samples of per-process GPU memory (peak memory of each job)


class Seeing(Protocol):
    """What tells our jobs' GPU processes from others' (``views``, ``attribute``; ``SchedulerState`` is one): the
    jobs on their GPUs, the containment (whose cgroup a process is in), gpuq's MPS servers and the jobs each
    serves, the state directory (their pipes), the drained GPUs."""

    @property
    def lives(self) -> Lives: ...

    @property
    def containment(self) -> containment.Containment: ...

    @property
    def controls(self) -> Controls | None: ...

    @property
    def mps_jobs(self) -> Mapping[Key, set[int]]: ...

    @property
    def state(self) -> StateDir: ...

    @property
    def drained(self) -> Set[int]: ...


class Stopping(Protocol):
    """The daemon's stops (the state's): the running jobs gpuq is stopping, each with the outcome it gets unless
    it succeeds first, and the act of stopping one."""

    @property
    def stopped_for(self) -> Mapping[int, Outcome]: ...

    def stop_for(self, job: Running, outcome: Outcome) -> None: ...


class Readings:
    """A pass's GPU snapshot, and what NVML is slow to answer on some GPUs (``GpuSource.snapshot``), read when a
    step that watches the running jobs first asks for it, once a pass: each GPU's energy counter (the
    watchdog's charge), each process's share of its GPU's time (idle jobs)."""

    def __init__(self, source: GpuSource, plain: list[GpuSnapshot]) -> None:
        self.plain = plain
        self._source = source
        self._energy: list[GpuSnapshot] | None = None
        self._shares: list[GpuSnapshot] | None = None

    def with_energy(self) -> list[GpuSnapshot]:
        if self._energy is None:
            self._energy = self._source.snapshot(energy=True)
        return self._energy

    def with_shares(self) -> list[GpuSnapshot]:
        if self._shares is None:
            self._shares = self._source.snapshot(process_utilization=True)
        return self._shares


def stop_on_lost_gpus(
    monitor: Monitor, running: Mapping[int, Running], stopping: Stopping, now: float, snapshot: list[GpuSnapshot]
) -> list[Event]:
    """Stop the jobs on a GPU that has stayed lost for LOST_AFTER seconds: their work is gone with it,
    and a multi-GPU job would hold its other GPUs for nothing. They end as lost, naming the GPU. The events."""
    for gpu in snapshot:
        if gpu.lost:
            monitor.lost_since.setdefault(gpu.index, now)
        else:
            monitor.lost_since.pop(gpu.index, None)
    dead = {g.index: g for g in snapshot if g.lost and now - monitor.lost_since[g.index] >= LOST_AFTER}
    events: list[Event] = []
    for job_id, job in list(running.items()):
        gone = [dead[i] for i in job.record.gpus if i in dead]
        if not gone or job_id in stopping.stopped_for:
            continue
        why = "; ".join(f"GPU {g.index} ({g.uuid}) was lost: {g.error or 'it stopped answering'}" for g in gone)
        stopping.stop_for(job, Outcome.gpu_lost(why))  # SIGTERM, then SIGKILL after the grace period
        log.warning("stopping job %d: %s", job_id, why)
        events.append(GpuLost(now, job_id, why))
    return events


def views(scheduler: Seeing, snapshot: list[GpuSnapshot]) -> list[GpuView]:
    """What placement sees: memory used by processes outside gpuq is told apart from our jobs' own."""
    running = scheduler.lives.running
    ours = {pid for job in running.values() for pid in job.pids}
    mps = scheduler.controls is not None
    views = []
    for gpu in snapshot:
        if gpu.processes is not None:
            attribute(scheduler, gpu.processes)
            ours |= {pid for job in running.values() for pid in job.pids}
            if scheduler.mps_jobs:  # our MPS servers hold memory for our fence: not a teammate's
                ours |= server_pids(scheduler.state.mps, set(gpu.processes) - ours)
        external = gpu.outside_use(ours)
        available = not gpu.lost and gpu.index not in scheduler.drained
        views.append(GpuView(gpu.index, gpu.total, gpu.used, external, available=available, mps=mps))
    return views


class Sampling(Seeing, Protocol):
    """What a sample of the running jobs' memory reads and writes (``SchedulerState`` is one): what tells our
    jobs' processes from others', when to sample, the table (their peaks), what ``--mem auto`` learns."""

    @property
    def monitor(self) -> Monitor: ...

    @property
    def table(self) -> JobTable: ...

    @property
    def mem_auto(self) -> MemAuto: ...

    @property
    def policy(self) -> Policy: ...


def sample(scheduler: Sampling, now: float, snapshot: list[GpuSnapshot]) -> None:
    """Record each running job's peak GPU memory (the most it held on any one of its GPUs)."""
    running = scheduler.lives.running
    if not running or now < scheduler.monitor.next_sample:
        return
    scheduler.monitor.next_sample = now + SAMPLE_EVERY
    peaks: dict[int, int] = {}
    for job in running.values():
        job.held = {}
    for gpu in snapshot:
        if not gpu.processes:
            continue
        attribute(scheduler, gpu.processes)
        for job_id, job in running.items():
            held = sum(used for pid, used in gpu.processes.items() if pid in job.pids)
            if held:
                peaks[job_id] = max(peaks.get(job_id, 0), held)
                job.held[gpu.index] = held
    if peaks:
        scheduler.table.set_peak_mem(peaks)
    learning.settle(scheduler.mem_auto, scheduler.table, scheduler.policy, scheduler.lives, now, peaks)


def out_of_memory(
    running: Mapping[int, Running], snapshot: list[GpuSnapshot], policy: Policy, fenced: bool, job: Running
) -> OutOfMemory:
    """Which kind of CUDA out of memory a running job's was, from the last sample (``policy.blame``): ``fenced``,
    whether a fence held the jobs packed beside it to their shares."""
    record = job.record
    share = record.spec.mem_per_gpu if record.spec.gpus else None
    asked = "auto" if record.spec.mem_auto else format_size(share) if share is not None else ""
    others = [
        blame.Sampled(other.record.id, other.record.spec.mem_per_gpu, other.held)
        for other in running.values()
        if other.record.id != record.id
    ]
    free = {g.index: g.total - g.used for g in snapshot}
    return blame.out_of_memory(
        blame.Sampled(record.id, share, job.held),
        record.gpus,
        others,
        overhead=policy.overhead,
        fenced=fenced,
        asked=asked,
        free=free,
    )


def release_idle(scheduler: SchedulerState, now: float, readings: Readings) -> None:
    """Say how long each interactive job's GPUs did no work (its reason, once a minute or a tenth of the
    limit has passed), and with an idle limit release those idle that long. In the limit's last tenth (10
    minutes at most, three checks at least) the reason says when, which its `gpuq run` shows on the terminal.
    Under an MPS fence NVML files a client's work under the MPS server: an MPS-fenced job is never idle."""
    limit = scheduler.monitor.idle_limit
    if now < scheduler.monitor.next_idle_check:
        return
    every = SAMPLE_EVERY if limit is None else min(SAMPLE_EVERY, limit / 10)
    scheduler.monitor.next_idle_check = now + every
    watched = [
        (job_id, job)
        for job_id, job in scheduler.running.items()
        if job.record.spec.interactive
        and job.record.gpus
        and not job.launch.cancel_by
        and fences.kind(scheduler, job.record) != fences.MPS
    ]
    if not watched:
        return
    busy = _busy(scheduler, readings.with_shares())
    reasons: dict[int, str] = {}
    events: list[Event] = []
    clock = time.monotonic()  # idle time is a duration: a jump of the wall clock must not release a busy job
    for job_id, job in watched:
        record = job.record
        if job.active_at is None or any(busy.get(pid, 0) > 0 for pid in job.pids):
            job.active_at = clock  # busy now, or first watched by this daemon now
        idle = clock - job.active_at
        if limit is not None and idle >= limit:
            who = f"gpuq (its GPUs did no work for {format_duration(idle)})"
            scheduler.cancel(job, who)
            events.append(IdleReleased(now, job_id, idle))
            continue
        shown = 60.0 if limit is None else min(60.0, limit / 10)
        reason = f"idle {format_duration(idle)}" if idle >= shown else ""
        # The warning's window is three checks at least: a client looks twice a second, it must see one.
        if limit is not None and reason and idle >= limit - max(min(limit / 10, 600.0), 3 * every):
            reason += f"; released after {format_duration(limit)} without GPU work"
        if reason != record.reason:
            reasons[job_id] = reason
            job.record = record.replace(reason=reason)
    if reasons:
        scheduler.table.set_reasons(reasons, state=JobState.RUNNING)
    scheduler.journal.extend(events)


def report_idle_batch(scheduler: SchedulerState, now: float, readings: Readings) -> None:
    """Say in its reason when a batch job's GPUs have done no work for ``idle_report`` or more (a hung
    NCCL call, a job waiting on input that never comes): it holds GPUs others wait for. Reported, never
    stopped: a batch job may have long phases on the CPU. Idle time is monotonic, counted from when this
    daemon first watched the job; only GPUs whose per-process utilisation is known are judged."""
    after = scheduler.monitor.idle_report
    if after is None or now < scheduler.monitor.next_batch_check:
        return
    scheduler.monitor.next_batch_check = now + min(SAMPLE_EVERY, after / 10)
    watched = [
        (job_id, job)
        for job_id, job in scheduler.running.items()
        if not job.record.spec.interactive and job.record.gpus
    ]
    if not watched:
        return
    snapshot = readings.with_shares()
    judged = {gpu.index for gpu in snapshot if gpu.process_utilization is not None}
    if not judged:
        return
    busy = _busy(scheduler, snapshot)
    clock = time.monotonic()
    reasons: dict[int, str] = {}
    idle_now: dict[int, float] = {}
    for job_id, job in watched:
        record = job.record
        if not set(record.gpus) <= judged or (record.reason and not record.reason.startswith(causes.IDLE_BATCH)):
            continue  # cannot tell, or its reason says something else that matters more
        if job.active_at is None or any(busy.get(pid, 0) > 0 for pid in job.pids):
            job.active_at = clock
        idle = clock - job.active_at
        reason = causes.idle_batch(idle) if idle >= after else ""
        if reason:
            idle_now[job_id] = round(idle, 1)
        if reason != record.reason:
            reasons[job_id] = reason
            job.record = record.replace(reason=reason)
    if reasons:
        scheduler.table.set_reasons(reasons, state=JobState.RUNNING)
    if idle_now or reasons:  # the typed fact beside the sentence, for `gpuq doctor` (none idle: the file goes)
        notices.idle_batch(scheduler.state, idle_now)


def attribute(scheduler: Seeing, usage: dict[int, int] | Any) -> None:
    """Learn which GPU-using pids belong to our jobs, by walking each pid's ancestors up to a shim."""
    running = scheduler.lives.running
    shims = {job.launch.shim_pid: job for job in running.values()}
    for job in running.values():  # an interactive job's program runs under its gpuq client
        client = job.record.spec.client
        if client is not None and processes.owner(client) == job.record.uid:
            shims.setdefault(client, job)
    known = {pid for job in running.values() for pid in job.pids}
    group = scheduler.containment.group
    for pid in usage:
        if pid in known:
            continue
        owner = containment.job_of(pid, group)  # a detached grandchild too: its cgroup says whose it is
        if owner is not None and owner in running:
            running[owner].pids.add(pid)
            continue
        for ancestor in processes.ancestors(pid):
            if ancestor in shims:
                shims[ancestor].pids.add(pid)
                break


def _busy(scheduler: SchedulerState, snapshot: list[GpuSnapshot]) -> dict[int, int]:
    """Every process's utilization on the GPUs NVML reports it for, each process first attributed to its job."""
    busy: dict[int, int] = {}
    for gpu in snapshot:
        if gpu.process_utilization is not None:
            attribute(scheduler, gpu.process_utilization)
            busy.update(gpu.process_utilization)
    return busy
