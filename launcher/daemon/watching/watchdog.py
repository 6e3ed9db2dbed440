"""The GPU watchdog in the daemon's pass: measure (the snapshot's NVML per-process memory), attribute
(each process to its job by containment, ``daemon.attribution``), compare with what each job was given and
act (``policy.watchdog``'s rules): stop the job that took what it was not given, naming what it took;
end a process left on a GPU after its job ended, and say so. On the same sample it charges each GPU's
energy to the jobs given it (``policy.energy``). docs/watchdog.md is the user's page.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from gpuq_scheduler.jobs.config import Watchdog
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store.events import Event
from gpuq_scheduler.jobs.store.events import Watchdog as Broken
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.launcher.daemon import attribution
from gpuq_scheduler.launcher.daemon.lives import Lives, Running
from gpuq_scheduler.launcher.daemon.watching.sight import Readings, Stopping
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot
from gpuq_scheduler.launcher.policy import energy
from gpuq_scheduler.launcher.policy import watchdog_rules as rules

log = logging.getLogger("gpuq.watchdog")

EVERY = 2.0  # seconds between checks: one per per-process sample (``watching.SAMPLE_EVERY``)


@dataclass
class Watch:
    """The watchdog's settings and what it has already said or done, between passes."""

    key: str  # the queue's name in its jobs' cgroups and markers
    settings: rules.Settings
    next_at: float = 0.0
    said: set[tuple[int, rules.Rule, int, tuple[int, ...]]] = field(default_factory=set)
    energy_at: dict[str, int] = field(default_factory=dict)  # GPU uuid -> its energy counter at the last check

    @classmethod
    def of(cls, root: str | os.PathLike[str], overhead: int) -> Watch:
        """The watchdog of the queue at ``root``, with its rules' defaults until the daemon's settings come."""
        return cls(attribution.queue_key(root), rules.Settings(overhead=overhead))

    def check(
        self,
        lives: Lives,
        table: JobTable,
        stopping: Stopping,
        now: float,
        readings: Readings,
        probes: Collection[int] = (),
    ) -> list[Event]:
        """One check (``check``); the events it journals. ``probes``: the running ``--mem auto`` probes, whose
        share is placement's figure from their own early peak, not a limit they were given."""
        return check(lives, table, stopping, self, now, readings, probes)


def settings(config: Watchdog, environ: Mapping[str, str], overhead: int) -> rules.Settings:
    """The rules' settings from the config's [watchdog]; ``GPUQ_WATCHDOG=warn`` (or ``stop``) sets all three
    for this daemon (a personal queue's quick switch)."""
    every = environ.get("GPUQ_WATCHDOG", "")
    if every and every not in ("stop", "warn"):
        raise BadInput(f"GPUQ_WATCHDOG={every!r}: choose stop (the default) or warn")
    return rules.Settings(
        other_gpu=rules.Action(every or config.other_gpu),
        past_share=rules.Action(every or config.past_share),
        leftover=rules.Action(every or config.leftover),
        tolerance=config.tolerance,
        overhead=overhead,
    )


def check(
    lives: Lives,
    table: JobTable,
    stopping: Stopping,
    watch: Watch,
    now: float,
    readings: Readings,
    probes: Collection[int] = (),
) -> list[Event]:
    """One check over this pass's snapshot, at most every ``EVERY`` seconds; the events to journal. Energy counters
    are read only while a job holds a GPU: a job is charged from the first check after its start, never for what
    its GPU drew before."""
    if now < watch.next_at:
        return []
    watch.next_at = now + EVERY
    holding = any(job.record.gpus for job in lives.running.values())
    snapshot = readings.with_energy() if holding else readings.plain
    seen = [
        rules.Seen(gpu.index, pid, used)
        for gpu in snapshot
        if gpu.processes and not gpu.lost
        for pid, used in gpu.processes.items()
    ]
    owners = _owners(lives, table, watch.key, {row.pid for row in seen}) if seen else {}
    for pid, job_id in owners.items():  # placement, peaks and blame count them as the job's from now on
        job = lives.running.get(job_id) if job_id is not None else None
        if job is not None:
            job.pids.add(pid)
    _charge(lives, table, watch, snapshot, owners)
    if not seen:
        watch.said.clear()
        return []
    # A probe started unfenced on a whole GPU, and its share came later from its own early peak: it is
    # placement's figure for the jobs beside it, not a limit the probe was given, so its growth past it is no
    # lie to stop it for (it was, when a watchdog check fell in the moments it held more).
    running = {job_id: _given(job, job_id in probes) for job_id, job in lives.running.items()}
    for job_id, job in lives.suspended.items():  # its frozen context, kept on its GPU, is no leftover:
        running[job_id] = _given(job)  # in place (an MPS client), or kept as nothing else was left (#40)
    for job_id, staged in lives.staged.items():  # its shim may start it before this daemon hears of it
        record = lives.pending.get(job_id)
        running[job_id] = rules.Given(staged.gpus, record.spec.mem_per_gpu if record is not None else None)
    findings = rules.check(seen, owners, running, watch.settings)
    stops = rules.to_stop(findings)
    events: list[Event] = []
    for finding in findings:
        job = lives.running.get(finding.job)
        if finding.rule is rules.Rule.LEFTOVER and finding.action is rules.Action.STOP:
            _end_leftover(table, watch, finding, now, events)
        elif stops.get(finding.job) is finding and job is not None and finding.job not in stopping.stopped_for:
            _stop(stopping, job, finding.what())  # (not again: a lost GPU or an earlier finding stops it already)
            log.warning("stopping job %d: %s", finding.job, finding.what())
            events.append(_event(finding, now))
        elif finding.action is rules.Action.WARN and _first(watch, finding):
            log.warning("job %d %s (watchdog.%s = warn: not stopped)", finding.job, finding.what(), _key(finding))
            events.append(_event(finding, now))
    watch.said &= {(f.job, f.rule, f.gpu, f.pids) for f in findings}  # said again if it stops and comes back
    return events


def _charge(
    lives: Lives, table: JobTable, watch: Watch, snapshot: list[GpuSnapshot], owners: Mapping[int, int | None]
) -> None:
    """Charge each GPU's energy since the last check to the jobs given it (``policy.energy``'s rule)."""
    charges: dict[int, float] = {}
    for gpu in snapshot:
        last = watch.energy_at.pop(gpu.uuid, None)
        if gpu.energy is None or gpu.lost:
            continue
        watch.energy_at[gpu.uuid] = gpu.energy
        if last is None or gpu.energy <= last:
            continue  # its first reading, or its driver was reloaded (the counter started again)
        held = {job_id: 0 for job_id, job in lives.running.items() if gpu.index in job.record.gpus}
        if not held:
            continue
        outside = 0
        for pid, used in (gpu.processes or {}).items():
            job_id = owners.get(pid)
            if job_id is not None and job_id in held:
                held[job_id] += used
            else:
                outside += used
        for job_id, joules in energy.split((gpu.energy - last) / 1000, held, outside).items():
            charges[job_id] = charges.get(job_id, 0.0) + joules
    if charges:
        table.add_energy(charges)


def _given(job: Running, probe: bool = False) -> rules.Given:
    spec = job.record.spec
    return rules.Given(job.record.gpus, spec.mem_per_gpu if spec.gpus and not probe else None)


def _owners(lives: Lives, table: JobTable, key: str, pids: set[int]) -> dict[int, int | None]:
    """Each GPU process's job: by containment first; else, for the processes the daemon found under a
    job's supervisor (``watching.attribute``: an interactive job's program under its client, a queue
    without containment), by that."""
    uids: dict[int, int | None] = {job_id: job.record.uid for job_id, job in lives.running.items()}

    def uid_of(job_id: int) -> int | None:
        if job_id not in uids:
            record = table.get(job_id)
            uids[job_id] = record.uid if record is not None else None
        return uids[job_id]

    under = {pid: job_id for job_id, job in lives.running.items() for pid in job.pids}
    return {pid: attribution.job_of(pid, key, uid_of) or under.get(pid) for pid in pids}


def _stop(stopping: Stopping, job: Running, what: str) -> None:
    """Stop a running job for ``what`` it took: unless it succeeds first, it fails with Cause.WATCHDOG."""
    stopping.stop_for(job, Outcome.stopped_by_watchdog(what))  # SIGTERM to all its processes, SIGKILL after grace


def _end_leftover(table: JobTable, watch: Watch, finding: rules.Finding, now: float, events: list[Event]) -> None:
    """SIGKILL a process of an ended job still on a GPU, through a pidfd opened before its job is read
    again, so a pid reused meanwhile is never the one killed; and say so on the job's record."""
    ended = []
    for pid in finding.pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if attribution.job_of(pid, watch.key) == finding.job:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                ended.append(pid)
        except OSError:
            pass
        finally:
            os.close(fd)
    if not ended or not _first(watch, finding):
        return
    note = f"{finding.what()} and was ended by the watchdog"
    log.warning("job %d: %s", finding.job, note)
    events.append(_event(finding, now))
    record = table.get(finding.job)
    if record is not None and record.state not in (JobState.PENDING, JobState.RUNNING):
        reason = f"{record.reason}; {note}" if record.reason else note
        table.set_reasons({finding.job: reason}, state=record.state)


def _first(watch: Watch, finding: rules.Finding) -> bool:
    """True the first time this finding is seen: a warning is said once, not every two seconds."""
    said = (finding.job, finding.rule, finding.gpu, finding.pids)
    if said in watch.said:
        return False
    watch.said.add(said)
    return True


def _key(finding: rules.Finding) -> str:
    return str(finding.rule.value).replace("-", "_")


def _event(finding: rules.Finding, now: float) -> Broken:
    return Broken(
        now,
        finding.job,
        finding.rule.value,
        finding.action.value,
        finding.gpu,
        finding.pids,
        finding.held,
        finding.what(),
    )
