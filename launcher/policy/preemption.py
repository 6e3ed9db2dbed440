"""Which running jobs a waiting job may take the GPUs of, and which of them to take: pure, over plain values.

The rules (docs/suspend.md, "Preemption"):

* **Who may be preempted.** A running job that ran at least ``min_runtime`` since it last started or
  resumed (so nothing thrashes), for a waiting job that outranks it:
  - it is ``--preemptible`` and the waiting job is not, or the waiting job's priority is higher;
  - ``by_priority``: any job of lower priority, preemptible or not;
  - ``by_fair_share``: a job whose user is over their fair share, for a job whose user is not.
  Priorities compare the users' priorities between two users, the jobs' own ``--priority`` within one.
* **When.** Only if nothing frees the GPUs sooner: the time limits of the running jobs would not let the
  waiting job start before the victims' checkpoint could be done (their GPU memory at ``rate`` bytes a
  second, plus ``slack`` seconds; plus the ``grace`` period where one is requeued instead). A running job
  whose time limit ends first counts as freeing sooner.
* **Least cost.** Victims are chosen GPU by GPU, greedily: each step takes the GPU whose missing victims
  cost least, cost being (times already preempted, jobs requeued rather than suspended, bytes of GPU state
  to move, jobs touched), compared in that order; on a GPU, the cheapest victims go first until it fits.

The caller passes only the jobs that could be suspended or requeued now as candidates; every other claim on
a GPU (a job that is not a candidate, a suspended victim's place kept for its resume) is a ``Holding``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuq_scheduler.launcher.policy.placement import GpuView, Holding, Policy


@dataclass(frozen=True)
class Settings:
    """How a queue preempts (a shared queue's ``[shared]`` config; a personal queue's GPUQ_PREEMPT*)."""

    enabled: bool = False
    min_runtime: float = 600.0  # seconds a job runs after it (re)started before it may be preempted
    by_priority: bool = False  # any job of lower priority is preemptible, not only --preemptible ones
    by_fair_share: bool = False  # a job whose user is over their fair share is preemptible by other users
    rate: float = 1e9  # bytes a second a checkpoint moves (the H100 measured 1.8-2.5 GB/s: docs/suspend.md)
    slack: float = 1.0  # seconds added to a checkpoint's estimate
    grace: float = 60.0  # seconds a job that is requeued instead (it cannot be suspended) has to save its work


@dataclass(frozen=True)
class Job:
    """A waiting job, or a running one that may be a victim."""

    job_id: int
    gpus: tuple[int, ...] | int  # a running job's GPUs; a waiting job's count
    mem_per_gpu: int | None  # None: whole GPUs
    user: str = ""
    priority: int = 0  # the job's --priority
    user_priority: int = 0  # its user's priority ([shared.priority])
    preemptible: bool = False  # --preemptible
    over_share: bool = False  # its user is over their fair share
    ran: float = 0.0  # seconds since it last started or resumed (running jobs)
    held: int = 0  # bytes of GPU state it holds (running jobs): what a checkpoint moves
    preemptions: int = 0  # times it was already preempted
    ends_by: float | None = None  # start + time limit (running jobs with one)
    requeue: bool = False  # it cannot be suspended: taken, it is signalled, ended after the grace and requeued


# A claim on one GPU: (job id, its --mem or None for a whole GPU, the victim it is if it may be taken, ends by).
_Claim = tuple[int, "int | None", "Job | None", float]


@dataclass(frozen=True)
class Choice:
    """Take ``victims``' GPUs for ``job_id``, which starts on ``gpus`` once they are off them."""

    job_id: int
    victims: tuple[int, ...]
    gpus: tuple[int, ...]
    why: dict[int, str] = field(default_factory=dict)  # victim -> why it may be preempted ("priority 10 > 0")


def why_preemptible(waiting: Job, running: Job, settings: Settings) -> str:
    """Why ``running`` may be preempted for ``waiting`` ("" if it may not): the parenthesis of
    "suspended for job 12 (priority 10 > 0)"."""
    if not settings.enabled or running.ran < settings.min_runtime:
        return ""
    if waiting.user != running.user:
        mine, theirs = waiting.user_priority, running.user_priority
        scope = f"{waiting.user}'s priority" if waiting.user else "priority"
    else:
        mine, theirs, scope = waiting.priority, running.priority, "priority"
    if mine > theirs and (running.preemptible or settings.by_priority):
        return f"{scope} {mine} > {theirs}"
    if running.preemptible and not waiting.preemptible:
        return f"job {running.job_id} is --preemptible"
    if settings.by_fair_share and waiting.user != running.user and running.over_share and not waiting.over_share:
        return f"{running.user} is over their fair share"
    return ""


def _size(mem_per_gpu: int | None, total: int, policy: Policy) -> int:
    return total if mem_per_gpu is None else mem_per_gpu + policy.overhead


def _fits(view: GpuView, sizes: Sequence[int], whole: Sequence[bool], request: Job, policy: Policy) -> bool:
    """Would ``request`` fit on this GPU beside these claims (placement's rule, over reservations)?"""
    if not view.available:
        return False
    if request.mem_per_gpu is None:
        return not sizes and view.external <= policy.negligible and view.total - view.external > policy.margin
    if any(whole):
        return False
    room = view.total - view.external - policy.margin - sum(sizes)
    return room >= request.mem_per_gpu + policy.overhead


def _cost(jobs: Sequence[Job]) -> tuple[int, int, int, int]:
    return sum(j.preemptions for j in jobs), sum(j.requeue for j in jobs), sum(j.held for j in jobs), len(jobs)


def choose(
    waiting: Job,
    gpus: Sequence[GpuView],
    holdings: Sequence[Holding],
    candidates: Sequence[Job],
    now: float,
    settings: Settings,
    policy: Policy | None = None,
) -> Choice | None:
    """The victims to take for ``waiting`` at least cost, or None: preemption is off, it needs no GPU, it
    would not fit even without them, or running jobs' time limits free its GPUs sooner."""
    policy = policy or Policy()
    count = waiting.gpus if isinstance(waiting.gpus, int) else len(waiting.gpus)
    if not settings.enabled or count <= 0:
        return None
    why = {c.job_id: w for c in candidates if (w := why_preemptible(waiting, c, settings))}
    victims = {c.job_id: c for c in candidates if c.job_id in why}
    on: dict[int, list[_Claim]] = {view.index: [] for view in gpus}
    for holding in holdings:
        for index in holding.gpus:
            if index in on:
                on[index].append((holding.job_id, holding.mem_per_gpu, None, _end(holding.ends_by)))
    for job in candidates:
        assert isinstance(job.gpus, tuple)
        for index in job.gpus:
            if index in on:
                on[index].append((job.job_id, job.mem_per_gpu, victims.get(job.job_id), _end(job.ends_by)))
    views = {view.index: view for view in gpus}
    taken: set[int] = set()
    chosen: list[int] = []
    while len(chosen) < count:
        best: tuple[tuple[int, int, int, int], int, list[Job]] | None = None
        for index, view in views.items():
            if index in chosen:
                continue
            need = _victims_on(view, on[index], waiting, taken, policy)
            if need is None:
                continue
            fresh = [job for job in need if job.job_id not in taken]
            key = (_cost(fresh), index, fresh)
            if best is None or key[:2] < best[:2]:
                best = key
        if best is None:
            return None
        _, index, fresh = best
        chosen.append(index)
        taken |= {job.job_id for job in fresh}
    if not taken:
        return None  # it fits without taking anything: placement starts it
    picked = [victims[job_id] for job_id in sorted(taken)]
    moved = sum(job.held for job in picked if not job.requeue)
    checkpointed = (
        now + moved / settings.rate + settings.slack + (settings.grace if any(j.requeue for j in picked) else 0)
    )
    if _frees_sooner(waiting, views, on, now, policy) <= checkpointed:
        return None  # waiting costs no more than the checkpoint would
    why_each = {job.job_id: why[job.job_id] for job in picked}
    return Choice(waiting.job_id, tuple(sorted(taken)), tuple(sorted(chosen)), why_each)


def _end(ends_by: float | None) -> float:
    return math.inf if ends_by is None else ends_by


def _victims_on(view: GpuView, claims: list[_Claim], request: Job, taken: set[int], policy: Policy) -> list[Job] | None:
    """The cheapest victims on this GPU that make room for ``request`` (those already taken count as gone),
    or None if no choice of them does."""
    kept = [(mem, job) for job_id, mem, job, _ in claims if job_id not in taken]
    removable = sorted(
        (job for _, job in kept if job is not None), key=lambda j: (j.preemptions, j.requeue, j.held, j.job_id)
    )
    gone: list[Job] = [job for _, _, job, _ in claims if job is not None and job.job_id in taken]
    left = list(kept)
    for step in range(len(removable) + 1):
        sizes = [_size(mem, view.total, policy) for mem, _ in left]
        if _fits(view, sizes, [mem is None for mem, _ in left], request, policy):
            return gone + removable[:step]
        if step == len(removable):
            return None
        victim = removable[step]
        left = [(mem, job) for mem, job in left if job is not victim]
    return None


def _frees_sooner(
    request: Job,
    views: dict[int, GpuView],
    on: dict[int, list[_Claim]],
    now: float,
    policy: Policy,
) -> float:
    """When the running jobs' time limits would let ``request`` start without preempting (inf: never known)."""
    count = request.gpus if isinstance(request.gpus, int) else len(request.gpus)
    ends: list[float] = []
    for index, view in views.items():
        claims = [(mem, end) for _, mem, _, end in on[index]]
        claims.sort(key=lambda claim: claim[1])
        at = math.inf
        for cut in range(len(claims) + 1):
            left = claims[cut:]
            sizes = [_size(mem, view.total, policy) for mem, _ in left]
            if _fits(view, sizes, [mem is None for mem, _ in left], request, policy):
                at = now if cut == 0 else claims[cut - 1][1]
                break
        ends.append(at)
    ends.sort()
    return ends[count - 1] if len(ends) >= count else math.inf
