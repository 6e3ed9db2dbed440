"""Pure placement policy: (pending jobs, GPU views, holdings, now) -> which jobs start where, and why
the others wait. No I/O, no clock, no processes: tested with plain values.

Rules, in order:

* **Headroom.** A GPU's headroom is ``total - max(used, reserved + external) - margin``: ``used`` is what
  NVML sees in use, ``reserved`` what gpuq promised its running jobs (from launch, before their CUDA
  contexts exist, until they end), ``external`` what processes outside gpuq use. Taking the larger of
  the two views means neither a job still warming up nor a teammate's notebook can be over-committed.
* **Fit.** A ``--mem`` job fits a GPU whose headroom is at least its memory plus a per-process overhead
  (the CUDA context, which PyTorch's memory cap does not cover). A whole-GPU job needs a GPU
  with no gpuq job and only negligible external use, and then holds all of it.
* **Order.** Jobs are considered in the order given (``launcher.policy.fairshare.fair_order``: with one user,
  priority, then submission). The first job that cannot start is the *head*: it claims the GPUs it will
  start on (those that free up soonest), and later jobs may use a claimed GPU only if they cannot delay
  the head: they end (by their time limit) before the head could start anyway, or they leave the head's
  memory free on that GPU.
* **User caps.** In a shared queue a GPU job whose owner would then hold more GPUs than their cap waits,
  and, like a throttled array at its limit, never becomes the head: a user held back by their own cap
  must not claim GPUs and so hold back other users' jobs. Placements earlier in the pass count.
* **Choice.** Among fitting GPUs, spread: fewest gpuq jobs first, then most headroom, then lowest index,
  so small jobs do not pile onto one GPU while another idles. Multi-GPU jobs take their GPUs together,
  preferring the closest set (NVLink before PCIe) when the topology is known.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuq_scheduler.jobs.units import format_size
from gpuq_scheduler.launcher.policy import memory

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class GpuView:
    """What placement needs to know about one GPU. ``available`` is False for a lost or drained GPU."""

    index: int
    total: int
    used: int = 0
    external: int = 0
    available: bool = True
    mps: bool = False  # a job sharing this GPU alone runs as an MPS client (the fence: daemon/fences.py)


@dataclass(frozen=True)
class Holding:
    """A running gpuq job's claim on GPUs. ``mem_per_gpu`` None means whole GPUs."""

    job_id: int
    gpus: tuple[int, ...]
    mem_per_gpu: int | None
    ends_by: float | None = None  # start + time limit, when it has one


@dataclass(frozen=True)
class Request:
    """A pending job's needs."""

    job_id: int
    gpus: int
    mem_per_gpu: int | None = None
    time_limit: float | None = None
    group: int | None = None  # an array with a throttle: at most group_limits[group] of it run at once
    user: str | None = None  # the owner, for per-user GPU caps in a shared queue
    priority: int = 0  # the job's --priority: the scheduler orders requests by it (placement takes them in order)
    only: tuple[int, ...] = ()  # --gpu-ids: the GPUs it may run on, by index (empty: any)


@dataclass(frozen=True)
class Decision:
    job_id: int
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Policy:
    margin: int = 512 * MiB  # kept free on every GPU: allocator slack and NVML's rounding live here
    # Added to each --mem job's reservation on each GPU: the CUDA context, cuBLAS workspace and NCCL
    # buffers sit outside PyTorch's memory cap. Measured on H200 with torch 2.11: 0.83-0.87 GiB for a
    # small training job, 1.4-1.6 GiB per GPU for DataParallel and torchrun jobs (bench/results).
    overhead: int = 1 * GiB
    negligible: int = 1 * GiB  # external use below this still leaves a GPU "free" for a whole-GPU job
    cpu_slots: int | None = None  # how many --gpus 0 jobs run at once (None: no limit)
    auto_margin: float = memory.MARGIN  # --mem auto: the learned reservation is the peak plus this much
    auto_probe_mem: int | None = None  # --mem auto with no history: the probe's share (None: a whole GPU)
    # --mem auto with no history, where a fence holds it: the first share (0: a sixteenth of the GPU; None: a probe)
    auto_first: int | None = 0
    auto_settle: float = memory.SETTLE  # seconds a probe runs before its peak so far counts
    auto_steady: float | None = memory.STEADY  # ... or sooner, once its peak held still this long (None: off)


@dataclass
class Plan:
    decisions: list[Decision] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)  # job id -> why it waits


Distance = Callable[[int, int], "int | None"]


@dataclass
class _Gpu:
    view: GpuView
    reserved: int = 0
    jobs: int = 0
    whole: bool = False
    holds: list[tuple[int, float]] = field(default_factory=list)  # (bytes reserved, ends by; inf if unknown)

    @property
    def headroom(self) -> int:
        if self.whole or not self.view.available:
            return -1
        taken = max(self.view.used, self.reserved + self.view.external)
        return self.view.total - taken

    def fits(self, request: Request, policy: Policy) -> bool:
        if not self.view.available or self.whole:
            return False
        if request.mem_per_gpu is None:
            return self.jobs == 0 and self.view.external <= policy.negligible and self.headroom > policy.margin
        return self.headroom - policy.margin >= request.mem_per_gpu + policy.overhead

    def could_ever_fit(self, request: Request, policy: Policy) -> bool:
        """Would the request fit once every gpuq job here has ended (external use staying as it is)?"""
        if not self.view.available:
            return False
        room = self.view.total - self.view.external - policy.margin
        if request.mem_per_gpu is None:
            return self.view.external <= policy.negligible and room > 0
        return room >= request.mem_per_gpu + policy.overhead

    def free_at(self, request: Request, policy: Policy, now: float) -> float:
        """When the request could start here if holdings end by their time limits (inf if that is unknown).

        A whole-GPU request waits for every holding; a --mem request only until enough of them have ended.
        """
        if self.fits(request, policy):
            return now
        if request.mem_per_gpu is None:
            return max((end for _, end in self.holds), default=now)
        need = request.mem_per_gpu + policy.overhead
        reserved = sum(size for size, _ in self.holds)
        for size, end in sorted(self.holds, key=lambda hold: hold[1]):
            reserved -= size
            if self.view.total - reserved - self.view.external - policy.margin >= need:
                return end
        return math.inf

    def hold(self, mem_per_gpu: int | None, ends_by: float | None, policy: Policy, user: str | None = None) -> None:
        self.jobs += 1
        size = self.view.total if mem_per_gpu is None else mem_per_gpu + policy.overhead
        self.holds.append((size, math.inf if ends_by is None else ends_by))
        if mem_per_gpu is None:
            self.whole = True
            self.reserved = self.view.total
        else:
            self.reserved += size


@dataclass
class _Claim:
    """The head job's hold on the GPUs it will start on."""

    head: Request
    gpus: set[int]
    starts_by: float  # inf when a blocker has no time limit: then no time limit is short enough

    def allows(self, request: Request, gpu: _Gpu, policy: Policy, now: float) -> bool:
        if gpu.view.index not in self.gpus:
            return True
        if request.time_limit is not None and now + request.time_limit <= self.starts_by < math.inf:
            return True  # ends before the head could start: backfill cannot delay it
        if self.head.mem_per_gpu is None or request.mem_per_gpu is None:
            return False
        after = gpu.headroom - policy.margin - request.mem_per_gpu - policy.overhead
        return after >= self.head.mem_per_gpu + policy.overhead


def place(
    pending: Sequence[Request],
    gpus: Sequence[GpuView],
    holdings: Sequence[Holding],
    now: float,
    policy: Policy = Policy(),
    distance: Distance | None = None,
    cpu_jobs_running: int = 0,
    group_limits: Mapping[int, int] | None = None,
    group_running: Mapping[int, int] | None = None,
    user_caps: Mapping[str, int] | None = None,
    user_gpus: Mapping[str, int] | None = None,
) -> Plan:
    """Decide which pending jobs start now and on which GPUs. ``pending`` is in queue order.

    A throttled group (an array run with ``%N``) at its limit just waits: it never claims GPUs as head.
    ``user_caps`` is the most GPUs each user's running jobs may hold at once (a user not in it has no cap),
    ``user_gpus`` what each user holds now; a GPU job over its owner's cap waits and never claims GPUs.
    """
    limits = group_limits or {}
    in_group = dict(group_running or {})
    caps = user_caps or {}
    held = dict(user_gpus or {})
    state = {view.index: _Gpu(view) for view in gpus}
    for holding in holdings:
        for index in holding.gpus:
            gpu = state.get(index)
            if gpu is None:
                continue  # a GPU that vanished from the snapshot: nothing to place there anyway
            gpu.hold(holding.mem_per_gpu, holding.ends_by, policy)

    plan = Plan()
    claim: _Claim | None = None
    cpu_running = cpu_jobs_running
    # Within one pass capacity only shrinks, so a shape that failed once fails again: remember it.
    failed: dict[tuple[int, int | None, float | None, str | None, tuple[int, ...]], str] = {}
    for request in pending:
        group = request.group
        if group is not None and group in limits and in_group.get(group, 0) >= limits[group]:
            plan.waiting[request.job_id] = f"array {group} runs at most {limits[group]} at once"
            continue
        if request.gpus == 0:
            if policy.cpu_slots is not None and cpu_running >= policy.cpu_slots:
                plan.waiting[request.job_id] = f"waiting for a CPU slot ({cpu_running} of {policy.cpu_slots} in use)"
                continue
            cpu_running += 1
            plan.decisions.append(Decision(request.job_id, ()))
            if group is not None:
                in_group[group] = in_group.get(group, 0) + 1
            continue
        user = request.user
        if user is not None and user in caps and held.get(user, 0) + request.gpus > caps[user]:
            plan.waiting[request.job_id] = _over_cap(user, held.get(user, 0), caps[user], request.gpus)
            continue
        # Requests of one shape fit or fail alike, except that an MPS server serves one user: a packed
        # request's shape includes its user.
        user_part = request.user if request.mem_per_gpu is not None and request.gpus == 1 else None
        shape = (request.gpus, request.mem_per_gpu, request.time_limit, user_part, request.only)
        if shape in failed and claim is not None:
            plan.waiting[request.job_id] = failed[shape]
            continue
        fitting = [
            gpu
            for gpu in _candidates(request, state)
            if gpu.fits(request, policy) and (claim is None or claim.allows(request, gpu, policy, now))
        ]
        if len(fitting) >= request.gpus:
            chosen = _choose(request, fitting, distance)
            ends_by = None if request.time_limit is None else now + request.time_limit
            for gpu in chosen:
                gpu.hold(request.mem_per_gpu, ends_by, policy, request.user if request.gpus == 1 else None)
            plan.decisions.append(Decision(request.job_id, tuple(sorted(g.view.index for g in chosen))))
            if group is not None:
                in_group[group] = in_group.get(group, 0) + 1
            if user is not None:
                held[user] = held.get(user, 0) + request.gpus
            continue
        if claim is None:
            claim = _claim(request, state, policy, now)
            # Jobs ahead of it in queue order that wait on their own limits (a throttle, a user's cap)
            ahead = len(plan.waiting)
            plan.waiting[request.job_id] = _why(request, state, policy, head=True, ahead=ahead)
        failed[shape] = _why(request, state, policy, head=False, claim=claim)
        plan.waiting.setdefault(request.job_id, failed[shape])
    return plan


def _choose(request: Request, fitting: list[_Gpu], distance: Distance | None) -> list[_Gpu]:
    ranked = sorted(fitting, key=lambda g: (g.jobs, -g.headroom, g.view.index))
    if request.gpus == 1 or distance is None or len(ranked) == request.gpus:
        return ranked[: request.gpus]
    if math.comb(len(ranked), request.gpus) > 256:
        return ranked[: request.gpus]

    def spread(group: Sequence[_Gpu]) -> tuple[float, int]:
        links = [distance(a.view.index, b.view.index) for a, b in itertools.combinations(group, 2)]
        worst = max((math.inf if link is None else link for link in links), default=0)
        return worst, sum(ranked.index(g) for g in group)

    groups: list[Sequence[_Gpu]] = list(itertools.combinations(ranked, request.gpus))
    best = min(groups, key=spread)
    return list(best)


def _claim(request: Request, state: dict[int, _Gpu], policy: Policy, now: float) -> _Claim | None:
    """The GPUs the head will start on: those it could ever fit, soonest free first. None if it never fits."""
    possible = [g for g in _candidates(request, state) if g.could_ever_fit(request, policy)]
    if len(possible) < request.gpus:
        return None
    possible.sort(key=lambda g: (g.free_at(request, policy, now), g.reserved, g.view.index))
    chosen = possible[: request.gpus]
    return _Claim(request, {g.view.index for g in chosen}, max(g.free_at(request, policy, now) for g in chosen))


def _candidates(request: Request, state: dict[int, _Gpu]) -> list[_Gpu]:
    """The GPUs a request may run on: those its --gpu-ids name, else all."""
    if not request.only:
        return list(state.values())
    return [state[i] for i in request.only if i in state]


def _over_cap(user: str, held: int, cap: int, needs: int) -> str:
    if needs > cap:
        return f"user cap: {user} may hold at most {cap} GPU{'s' if cap != 1 else ''} at once; this job needs {needs}"
    return f"user cap: {user} has {held} GPU{'s' if held != 1 else ''} in use (at most {cap} at once)"


def _need(request: Request) -> str:
    count = f"{request.gpus} GPU" + ("s" if request.gpus > 1 else "")
    if request.only:  # --gpu-ids: which, not how many
        count = ("GPUs " if len(request.only) > 1 else "GPU ") + ",".join(map(str, request.only))
        if request.gpus < len(request.only):
            count = f"{request.gpus} of {count}"
    if request.mem_per_gpu is None:
        return f"{count} to itself" if request.gpus == 1 else f"{count} to themselves"
    each = " each" if request.gpus > 1 else ""
    return f"{count} with {format_size(request.mem_per_gpu)} free{each}"


def _why(
    request: Request,
    state: dict[int, _Gpu],
    policy: Policy,
    *,
    head: bool,
    claim: _Claim | None = None,
    ahead: int = 0,
) -> str:
    candidates = _candidates(request, state)
    possible = sum(1 for g in candidates if g.could_ever_fit(request, policy))
    if possible < request.gpus:
        usable = sum(1 for g in candidates if g.view.available)
        return (
            f"waiting for {_need(request)}: only {possible} of {usable} usable GPUs could ever have that "
            "beside what processes outside gpuq hold"
        )
    now_fit = sum(1 for g in candidates if g.fits(request, policy))
    if claim is not None and now_fit >= request.gpus:
        return f"held back for job {claim.head.job_id}, first in the queue, which needs GPU(s) this one fits"
    have = f" ({now_fit} has it now)" if now_fit == 1 else f" ({now_fit} have it now)" if now_fit else ""
    if head and ahead:  # "first in line" under jobs listed ahead of it read as wrong (issue #39)
        return f"waiting for {_need(request)}{have} - first in line for GPUs; {ahead} ahead wait on their own limits"
    return f"waiting for {_need(request)}{have}" + (" - first in line" if head else "")
