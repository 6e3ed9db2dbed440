"""A pass's placement: which pending jobs are ready, the plan (``launcher.policy.placement``) over the GPUs as
they are, the launches it decides, the jobs staged behind running ones, and why the others wait.

Placement's own memory between passes is :class:`Placement`'s: nothing else reads it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.options import GPU_IDS
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.launcher.daemon import fences, handoff, isolation, preempting, readiness, reserving
from gpuq_scheduler.launcher.daemon.clients import gone, withdraw
from gpuq_scheduler.launcher.daemon.lives import Running
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.daemon.watching import sight
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot
from gpuq_scheduler.launcher.policy import fairshare
from gpuq_scheduler.launcher.policy.fairshare import Usage
from gpuq_scheduler.launcher.policy.placement import Holding, Plan, Request, place

Launcher = Callable[[JobRecord, tuple[int, ...], tuple[str, ...], float], None]


@dataclass
class Placement:
    """What placement keeps between passes, for itself."""

    # Placement's view of each pending job, built once per spec: building 10,000 of them on every pass was most
    # of a pass's time (14 of 17 ms, measured). Made anew by each plan from the jobs it plans, so an ended job's
    # goes with the next plan (nothing to forget).
    requests: dict[int, tuple[JobSpec, Request]] = field(default_factory=dict)
    last_key: object = None  # what the last plan looked at (a pass that would look at the same is skipped)
    waiting: dict[int, str] = field(default_factory=dict)  # why each job waits, as last written
    reasons_due: float = 0.0  # reasons are written at most once a second ...
    unsaved: dict[int, str] | None = None  # ... and those held back until then
    queue_order: list[Request] = field(default_factory=list)  # the last plan's ready jobs in order (personal queue)
    fenced_off: set[int] = field(default_factory=set)  # pending jobs a reservation keeps off some GPUs


def place_and_launch(
    state: SchedulerState, placement: Placement, now: float, snapshot: list[GpuSnapshot], launch: Launcher
) -> None:
    """Place the pending jobs (the lives') that may start and ``launch`` them; stage those that follow running
    ones; record why the others wait. It takes the whole state for the steps it runs that do: readiness,
    reservations, preemptions, the hand-offs, withdrawing a job whose client is gone."""
    lives = state.lives
    if not lives.pending:
        _record_reasons(state.table, placement, {}, now)
        return
    # Nothing that placement looks at has changed since the last pass (a periodic wake-up with a
    # blocked queue): skip it, so 10,000 waiting jobs cost no CPU between events. What it reads marks
    # ``changes`` itself (``launcher.daemon.tracked``); a running job's record is replaced, never changed.
    key = (
        tuple((g.index, g.used, g.lost) for g in snapshot),
        state.changes.count,
        state.paused_by,
        tuple(job.record for job in lives.running.values()),
        min(lives.not_before.values(), default=0.0) <= now,
        reserving.phase(state, now),
    )
    if key == placement.last_key and not any(now >= t for t in lives.not_before.values()):
        if placement.unsaved is not None and now >= placement.reasons_due:
            _record_reasons(state.table, placement, placement.unsaved, now)  # held back by the once-a-second limit
        return
    placement.last_key = key
    try:
        ready, waiting = readiness.eligible(state, now)
        planned = plan(state, placement, now, snapshot, ready)
    except isolation.INPUT_ERRORS:  # a job that breaks planning fails alone, not every pass for everyone
        retry = lambda: plan(state, placement, now, snapshot, readiness.eligible(state, now)[0])  # noqa: E731
        bad = isolation.unplaceable(lives, retry)
        if not bad:
            raise
        isolation.fail(state, bad, now)
        ready, waiting = readiness.eligible(state, now)
        planned = plan(state, placement, now, snapshot, ready)
    uuids = {g.index: g.uuid for g in snapshot}
    for decision in planned.decisions:
        record = lives.pending[decision.job_id]  # pending until it starts (``launching``)
        lives.due(record.id)
        if gone(record):  # its client went since the last look: it is withdrawn, its GPUs wait for the next pass
            withdraw(state, [record], now)
            continue
        launch(record, decision.gpus, tuple(uuids[i] for i in decision.gpus), now)
    placed = {decision.job_id for decision in planned.decisions}
    skip = placed | placement.fenced_off
    # What comes next, lazily: staging looks at a few jobs, and 10,000 may wait.
    upcoming = (lives.pending[q.job_id] for q in placement.queue_order if q.job_id not in skip)
    handoff.stage(state, upcoming, snapshot, now)
    # A job staged in this pass was in the plan, which gave it a reason to wait: being staged is the reason.
    behind = {job_id: handoff.reason(staged) for job_id, staged in lives.staged.items()}
    fenced = {job_id: fences.waiting_reason(state, job_id) for job_id in state.fence_waits}
    taking = {job_id: preempting.reason(state, job_id) for job_id in state.lives.takings()}
    _record_reasons(state.table, placement, {**waiting, **planned.waiting, **behind, **fenced, **taking}, now)


def plan(
    state: SchedulerState,
    placement: Placement,
    now: float,
    snapshot: list[GpuSnapshot],
    ready: list[JobRecord] | None = None,
) -> Plan:
    """The plan over ``ready`` (else every pending job). It takes the whole state for the reservations' fence
    and the GPUs' views (``reserving``, ``watching.sight``), which do."""
    running = state.lives.running
    jobs = list(state.lives.pending.values()) if ready is None else ready
    caps: dict[str, int] | None = None
    held: dict[str, int] | None = None
    used: dict[str, float] = {}
    queue = jobs
    cache, placement.requests = placement.requests, {}
    if state.shared is None:  # one user: priority, then submission. Two stable sorts on C-level keys, not a
        requests = [_request(placement, cache, r) for r in jobs]
        requests.sort(key=_BY_ID)  # Python key per job: with 10,000 pending that was a third of a pass
        requests.sort(key=_BY_PRIORITY, reverse=True)  # (reverse keeps equal priorities in id order)
        placement.queue_order = requests
    else:
        used, held = _use(state.usage, running, now)
        queue = fairshare.fair_order(jobs, _fair_key, used=used, held=held, user_priority=state.shared.priority)
        cap = state.shared.max_gpus_per_user
        caps = None if cap is None else {r.user: cap for r in jobs}
        requests = [_request(placement, cache, r) for r in queue]
    state.plan_order = requests
    claims = holdings(state)
    cpu_jobs = sum(1 for job in running.values() if not job.record.gpus)
    # Only the arrays in play (state.arrays also holds those whose pending members all wait: held, say).
    live = {q.group for q in requests} | {j.record.array_id for j in running.values()}
    limits = {a: info.throttle for a in live if a is not None and (info := state.arrays.get(a)) and info.throttle}
    in_group: dict[int, int] = {}
    for job in running.values():
        if job.record.array_id in limits:
            in_group[job.record.array_id] = in_group.get(job.record.array_id, 0) + 1
    requests, reserved, notes = reserving.fence(state, requests, now, [g.index for g in snapshot])
    planned = place(
        requests,
        sight.views(state, snapshot),
        claims,
        now,
        state.policy,
        state.source.distance,
        cpu_jobs,
        limits,
        in_group,
        user_caps=caps,
        user_gpus=held,
    )
    planned.waiting.update(reserved)  # waiting on a reservation whatever the GPUs hold
    # While a reservation is on or to come, no job is staged behind a running one: it would start whenever that
    # one ends, which may be past a start its own time limit was checked against (daemon/reserving.py).
    placement.fenced_off = set(reserved) | ({r.job_id for r in requests} if reserving.live(state, now) else set())
    if state.shared is not None:
        planned.waiting.update(fairshare.explain(planned.waiting, queue, _fair_key, used, state.shared.priority))
    for job_id, words in notes.items():  # narrowed by a reservation, and waiting: say that first
        if job_id in planned.waiting:
            planned.waiting[job_id] = f"{words}; {planned.waiting[job_id]}"
    return planned


def holdings(state: SchedulerState) -> list[Holding]:
    """Placement's claims on the GPUs: the running jobs' reservations, and the places kept for others (the
    fences', the preemptions' and the reservations': the state is for the last two, which take it whole)."""
    return (
        [
            Holding(
                job.record.id,
                job.record.gpus,
                job.record.spec.mem_per_gpu,
                None
                if job.record.spec.time_limit is None or job.record.started_at is None
                else job.record.started_at + job.record.spec.time_limit,
            )
            for job in state.lives.running.values()
        ]
        + fences.holdings(state)
        + preempting.holdings(state)
        + reserving.holdings(state)
    )


def _use(usage: Usage | None, running: Mapping[int, Running], now: float) -> tuple[dict[str, float], dict[str, int]]:
    """Each user's recent GPU-seconds (running jobs' time so far included) and GPUs held now."""
    assert usage is not None  # a shared queue's, which fair share is for
    runs = [(j.record.user, len(j.record.gpus), j.record.started_at or now) for j in running.values()]
    return fairshare.recent_use(usage, runs, now), fairshare.held_gpus(runs)


def _request(placement: Placement, cache: dict[int, tuple[JobSpec, Request]], record: JobRecord) -> Request:
    """Placement's view of a pending job: the last plan's if its spec is the same, else built anew."""
    cached = cache.get(record.id)
    if cached is None or cached[0] is not record.spec:
        spec = record.spec
        request = Request(
            record.id,
            spec.gpus,
            spec.mem_per_gpu,
            spec.time_limit,
            record.array_id,
            record.user,
            spec.priority,
            tuple(spec.value(GPU_IDS)),
        )
        cached = (spec, request)
    placement.requests[record.id] = cached
    return cached[1]


def _record_reasons(table: JobTable, placement: Placement, waiting: dict[int, str], now: float) -> None:
    """Store why jobs wait, for `gpuq status`: at most once a second, since they are for people to
    read and writing them on every tick would cost the dispatch path a write per tick."""
    if now < placement.reasons_due and set(waiting) <= set(placement.waiting):
        placement.unsaved = waiting
        return
    placement.unsaved = None
    placement.reasons_due = now + 1.0
    changed = {job_id: why for job_id, why in waiting.items() if placement.waiting.get(job_id) != why}
    placement.waiting = waiting
    if changed:
        table.set_reasons(changed)


_BY_ID = operator.attrgetter("job_id")
_BY_PRIORITY = operator.attrgetter("priority")


def _fair_key(record: JobRecord) -> tuple[str, int, int, int]:
    return record.user, record.spec.gpus, record.spec.priority, record.id
