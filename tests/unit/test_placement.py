# One module past 400 lines on purpose: it mirrors policy/placement.py, a test per rule of one pure function.
"""launcher.policy.placement: the pure placement policy, with plain values and simulated time.

The property tests replay a queue over several ticks: jobs arrive, ``place()`` decides, the decided jobs
become holdings, some running jobs end, and ``place()`` runs again. Every plan is checked against an
independent model of the rules in the module docstring (headroom, fit, order, claim), not against the
implementation's own helpers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpuq_scheduler.launcher.policy.placement import (
    Decision,
    Distance,
    GiB,
    GpuView,
    Holding,
    MiB,
    Plan,
    Policy,
    Request,
    place,
)

SIM = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HALVES = Policy(margin=512 * MiB, overhead=512 * MiB)  # for examples whose arithmetic is spelled out


def nvlink_pairs(a: int, b: int) -> int | None:
    """GPUs {0,1} and {2,3} are NVLink pairs; every other pair goes over PCIe."""
    return 0 if a // 2 == b // 2 else 20


# ----------------------------------------------------------------------------------------------------------
# An independent model of the rules, used as the oracle.


@dataclass
class Load:
    """What gpuq has put on one GPU: running holdings plus the decisions of the plan so far."""

    policy: Policy
    jobs: int = 0
    whole: int = 0
    reserved: int = 0  # --mem reservations, each with the per-process overhead (its CUDA context)

    def add(self, mem_per_gpu: int | None) -> None:
        self.jobs += 1
        if mem_per_gpu is None:
            self.whole += 1
        else:
            self.reserved += mem_per_gpu + self.policy.overhead


def loads(gpus: Sequence[GpuView], holdings: Sequence[Holding], policy: Policy) -> dict[int, Load]:
    result = {g.index: Load(policy) for g in gpus}
    for holding in holdings:
        for index in holding.gpus:
            if index in result:
                result[index].add(holding.mem_per_gpu)
    return result


def fits_now(view: GpuView, load: Load, request: Request, policy: Policy) -> bool:
    if not view.available or load.whole:
        return False
    if request.mem_per_gpu is None:
        taken = max(view.used, view.external)
        return load.jobs == 0 and view.external <= policy.negligible and view.total - taken > policy.margin
    taken = max(view.used, load.reserved + view.external)
    return taken + policy.margin + request.mem_per_gpu + policy.overhead <= view.total


def fits_some_day(view: GpuView, request: Request, policy: Policy) -> bool:
    """Would the request fit here once every gpuq job has ended, external use staying as it is?"""
    if not view.available:
        return False
    room = view.total - view.external - policy.margin
    if request.mem_per_gpu is None:
        return view.external <= policy.negligible and room > 0
    return room >= request.mem_per_gpu + policy.overhead


def never_fits(request: Request, gpus: Sequence[GpuView], policy: Policy) -> bool:
    return sum(fits_some_day(g, request, policy) for g in gpus) < request.gpus


def check_plan(
    plan: Plan,
    pending: Sequence[Request],
    gpus: Sequence[GpuView],
    holdings: Sequence[Holding],
    policy: Policy,
    cpu_jobs_running: int,
    user_caps: Mapping[str, int] | None = None,
    user_gpus: Mapping[str, int] | None = None,
) -> None:
    """Every rule a single plan must obey, whatever came before it."""
    by_id = {r.job_id: r for r in pending}
    views = {g.index: g for g in gpus}
    decided = [d.job_id for d in plan.decisions]

    # Each decided job was pending and is decided once; everything else waits, with a reason.
    assert len(decided) == len(set(decided)), plan
    assert set(decided) <= by_id.keys(), plan
    assert not set(decided) & plan.waiting.keys(), plan
    assert set(decided) | plan.waiting.keys() == by_id.keys(), plan
    for job_id, reason in plan.waiting.items():
        assert isinstance(reason, str) and reason.strip(), (job_id, reason)

    # Decisions name existing, available GPUs: exactly `gpus` distinct ones (none for a CPU job).
    for decision in plan.decisions:
        request = by_id[decision.job_id]
        assert len(decision.gpus) == len(set(decision.gpus)) == request.gpus, (request, decision)
        for index in decision.gpus:
            assert index in views and views[index].available, (request, decision, views.get(index))

    # CPU slots, counting the CPU jobs already running.
    if policy.cpu_slots is not None:
        started = sum(1 for d in plan.decisions if by_id[d.job_id].gpus == 0)
        assert started <= max(0, policy.cpu_slots - cpu_jobs_running), plan

    # Memory: on every GPU that received a job, after counting the decided jobs as reserved.
    before = loads(gpus, holdings, policy)
    after = loads(gpus, holdings, policy)
    touched: set[int] = set()
    for decision in plan.decisions:
        request = by_id[decision.job_id]
        for index in decision.gpus:
            if request.mem_per_gpu is None:
                view = views[index]
                assert before[index].jobs == 0, f"whole-GPU job {request} put on busy GPU {index}"
                assert view.external <= policy.negligible, f"whole-GPU job {request} put beside {view}"
            after[index].add(request.mem_per_gpu)
            touched.add(index)
    for index in touched:
        view, load = views[index], after[index]
        if load.whole:
            assert load.jobs == 1, f"GPU {index} shared with a whole-GPU job: {load}"
        else:
            taken = max(view.used, load.reserved + view.external)
            assert taken + policy.margin <= view.total, f"GPU {index} over-committed: {view} {load} {policy}"

    # Caps, in queue order: a GPU job is over its user's cap when the GPUs the user holds plus those placed
    # ahead of it in this plan plus its own exceed the cap. Such a job is never placed, and its reason
    # says so; no other job gives that reason.
    caps = user_caps or {}
    held = dict(user_gpus or {})
    decisions = {d.job_id: d for d in plan.decisions}
    over_cap: set[int] = set()
    for request in pending:
        user = request.user
        if request.gpus and user is not None and user in caps and held.get(user, 0) + request.gpus > caps[user]:
            over_cap.add(request.job_id)
            assert request.job_id not in decisions, f"{request} placed over its user's cap: {held} {caps}"
        elif request.job_id in decisions and user is not None:
            held[user] = held.get(user, 0) + request.gpus
    for job_id, reason in plan.waiting.items():
        assert reason.startswith("user cap: ") == (job_id in over_cap), (by_id[job_id], reason)

    # A job that could never fit says so (unless it is over its user's cap: that is checked first, being
    # cheap); one that could does not claim it never will.
    for request in pending:
        if request.job_id in plan.waiting and request.gpus > 0 and request.job_id not in over_cap:
            says_never = "could ever" in plan.waiting[request.job_id]
            assert says_never == never_fits(request, gpus, policy), (request, plan.waiting[request.job_id])

    # Work conservation, in queue order: until the first job that waits although it could fit some day
    # (the head), every job that fits in what the jobs ahead of it left is placed; the head itself
    # must really not fit in what was left. A job over its user's cap is never the head: the jobs behind
    # it are judged as if it were not there, so a capped user cannot hold back the others.
    left = loads(gpus, holdings, policy)
    for request in pending:
        placed = decisions.get(request.job_id)
        if placed is not None:
            for index in placed.gpus:
                left[index].add(request.mem_per_gpu)
            continue
        if request.gpus == 0 or request.job_id in over_cap or never_fits(request, gpus, policy):
            continue
        fitting = [g.index for g in gpus if fits_now(g, left[g.index], request, policy)]
        assert len(fitting) < request.gpus, f"{request} waits though GPUs {fitting} are free and nothing is ahead"
        break


def check_no_overcommit(gpus: Sequence[GpuView], holdings: Sequence[Holding], policy: Policy) -> None:
    """With external use fixed, what gpuq holds never exceeds any GPU's total less the margin."""
    for index, load in loads(gpus, holdings, policy).items():
        view = next(g for g in gpus if g.index == index)
        if load.whole:
            assert load.jobs == 1, f"GPU {index} shared with a whole-GPU job: {load}"
        else:
            assert load.reserved + view.external + policy.margin <= view.total, (view, load, policy)


def ends_by(request: Request, now: float) -> float | None:
    return None if request.time_limit is None else now + request.time_limit


def start(plan: Plan, pending: Sequence[Request], now: float) -> tuple[list[Holding], list[Request]]:
    """The decided jobs as holdings (ending by their time limit), and what is still pending."""
    by_id = {r.job_id: r for r in pending}
    started = []
    for decision in plan.decisions:
        request = by_id[decision.job_id]
        if request.gpus:
            started.append(Holding(request.job_id, decision.gpus, request.mem_per_gpu, ends_by(request, now)))
    decided = {d.job_id for d in plan.decisions}
    return started, [r for r in pending if r.job_id not in decided]


# ----------------------------------------------------------------------------------------------------------
# Strategies.

SIZES = [16 * GiB, 24 * GiB, 48 * GiB, 80 * GiB]
EXTERNAL = [0, 0, 0, 256 * MiB, 1 * GiB, 3 * GiB, 12 * GiB]
MEMS: list[int | None] = [None, 1 * GiB, 4 * GiB, 10 * GiB, 20 * GiB, 40 * GiB, 70 * GiB, 100 * GiB]
LIMITS: list[float | None] = [None, 5.0, 30.0, 120.0]


@st.composite
def gpu_sets(draw: st.DrawFn) -> list[GpuView]:
    count = draw(st.integers(1, 5))
    return [
        GpuView(
            i,
            draw(st.sampled_from(SIZES)),
            external=draw(st.sampled_from(EXTERNAL)),
            available=draw(st.sampled_from([True, True, True, False])),
        )
        for i in range(count)
    ]


policies = st.builds(
    Policy,
    margin=st.sampled_from([0, 512 * MiB, 1 * GiB]),
    overhead=st.sampled_from([0, 512 * MiB, 1 * GiB]),
    negligible=st.sampled_from([512 * MiB, 1 * GiB, 2 * GiB]),
    cpu_slots=st.sampled_from([None, 0, 1, 2]),
)

requests = st.builds(
    Request,
    job_id=st.just(0),
    gpus=st.sampled_from([0, 1, 1, 1, 2, 2, 3]),
    mem_per_gpu=st.sampled_from(MEMS),
    time_limit=st.sampled_from(LIMITS),
)


def nvml_used(data: st.DataObject, view: GpuView, load: Load) -> int:
    """What NVML might see: external use plus some, all or more than what gpuq reserved, or a full GPU."""
    ours = view.total - view.external if load.whole else load.reserved
    factor = data.draw(st.sampled_from([0.0, 0.5, 1.0, 1.0, 1.25]), f"GPU {view.index} used x reserved")
    if data.draw(st.integers(0, 9), f"GPU {view.index} full") == 0:
        return view.total  # memory not yet given back by a process that just died
    return min(view.total, view.external + int(ours * factor))


# ----------------------------------------------------------------------------------------------------------
# Properties over simulated time.


@pytest.mark.slow  # many simulated ticks: seconds, out of the everyday unit run
@settings(SIM, max_examples=1000)
@given(st.data())
def test_simulated_ticks_keep_every_placement_rule(data: st.DataObject) -> None:
    """Memory, exclusivity, availability, reasons, CPU slots and work conservation, tick after tick."""
    gpus = data.draw(gpu_sets(), "gpus")
    policy = data.draw(policies, "policy")
    distance: Distance | None = data.draw(st.sampled_from([None, nvlink_pairs]), "distance")
    holdings: list[Holding] = []
    cpu_jobs: list[float | None] = []  # when each running CPU job must end
    pending: list[Request] = []
    now, next_id = 0.0, 1
    for _tick in range(data.draw(st.integers(1, 8), "ticks")):
        for request in data.draw(st.lists(requests, max_size=4), "arrivals"):
            pending.append(dataclasses.replace(request, job_id=next_id))
            next_id += 1
        # Jobs end at their time limit, or earlier when they finish.
        ends = data.draw(st.lists(st.booleans(), min_size=len(holdings), max_size=len(holdings)), "ends")
        holdings = [
            h for h, ended in zip(holdings, ends, strict=True) if not ended and (h.ends_by is None or h.ends_by > now)
        ]
        cpu_ends = data.draw(st.lists(st.booleans(), min_size=len(cpu_jobs), max_size=len(cpu_jobs)), "cpu ends")
        cpu_jobs = [e for e, ended in zip(cpu_jobs, cpu_ends, strict=True) if not ended and (e is None or e > now)]
        # A drained GPU may come back, a GPU may be lost; NVML's view moves with the jobs.
        if data.draw(st.integers(0, 4), "flip availability") == 0:
            flip = data.draw(st.integers(0, len(gpus) - 1), "which GPU")
            gpus[flip] = dataclasses.replace(gpus[flip], available=not gpus[flip].available)
        held = loads(gpus, holdings, policy)
        gpus = [dataclasses.replace(g, used=nvml_used(data, g, held[g.index])) for g in gpus]

        plan = place(pending, gpus, holdings, now, policy, distance, len(cpu_jobs))

        check_plan(plan, pending, gpus, holdings, policy, len(cpu_jobs))
        by_id = {r.job_id: r for r in pending}
        cpu_jobs += [ends_by(by_id[d.job_id], now) for d in plan.decisions if by_id[d.job_id].gpus == 0]
        started, pending = start(plan, pending, now)
        holdings += started
        check_no_overcommit(gpus, holdings, policy)
        now += data.draw(st.sampled_from([1.0, 10.0, 60.0]), "elapsed")


@SIM
@given(st.data())
def test_small_jobs_never_take_an_idle_gpu_from_a_waiting_whole_gpu_head(data: st.DataObject) -> None:
    """A head needing k whole GPUs claims every idle GPU; with no time limits nothing may backfill there,
    so idle GPUs only accumulate until the head starts, and it starts as soon as k are idle."""
    count = data.draw(st.integers(2, 5), "GPUs")
    need = data.draw(st.integers(2, count), "head needs")
    gpus = [GpuView(i, 80 * GiB) for i in range(count)]
    small = st.builds(
        Request, job_id=st.just(0), gpus=st.just(1), mem_per_gpu=st.sampled_from([None, 4 * GiB, 20 * GiB])
    )
    per_gpu = data.draw(st.lists(st.integers(0, 2), min_size=count, max_size=count), "initial jobs per GPU")
    assume(sum(n == 0 for n in per_gpu) < need)
    holdings = [Holding(-(10 * i + n) - 1, (i,), 10 * GiB) for i, jobs in enumerate(per_gpu) for n in range(jobs)]
    head = Request(1, need, None)
    pending, next_id = [head], 2
    for _tick in range(data.draw(st.integers(1, 12), "ticks")):
        for request in data.draw(st.lists(small, max_size=3), "arrivals"):
            pending.append(dataclasses.replace(request, job_id=next_id))
            next_id += 1
        ends = data.draw(st.lists(st.booleans(), min_size=len(holdings), max_size=len(holdings)), "ends")
        holdings = [h for h, ended in zip(holdings, ends, strict=True) if not ended]
        idle = {g.index for g in gpus} - {i for h in holdings for i in h.gpus}

        plan = place(pending, gpus, holdings, 0.0)

        check_plan(plan, pending, gpus, holdings, Policy(), 0)
        head_started = any(d.job_id == head.job_id for d in plan.decisions)
        assert head_started == (len(idle) >= need), (idle, plan)
        if head_started:
            return
        for decision in plan.decisions:
            assert not set(decision.gpus) & idle, f"{decision} took an idle GPU the head {head} claimed"
        started, pending = start(plan, pending, 0.0)
        holdings += started


@SIM
@given(st.data())
def test_whole_gpu_head_is_not_starved_by_a_stream_of_small_jobs_without_time_limits(data: st.DataObject) -> None:
    """Jobs really end within `longest` ticks, but gpuq is told no time limits, so nothing backfills.

    The claim is recomputed every tick and can move to a GPU that became emptier, so the head may wait
    longer than the jobs on its first claimed GPUs take. But a claimed GPU gets no new job and drains within
    `longest` ticks, and each move lowers the largest (reserved, index) key among the claimed GPUs, which
    takes at most `levels * count` values: the head starts within `(levels * count + 1) * longest` ticks.
    """
    longest = 3
    policy = Policy()
    size = 10 * GiB  # one job size keeps the reserved levels few: 0..7 jobs of 11 GiB on an 80 GiB GPU
    levels = (80 * GiB - policy.margin) // (size + policy.overhead) + 1
    count = data.draw(st.integers(2, 4), "GPUs")
    need = data.draw(st.integers(2, count), "head needs")
    gpus = [GpuView(i, 80 * GiB) for i in range(count)]
    duration = st.integers(1, longest)
    ends: dict[int, int] = {}  # job id -> the tick it ends at
    holdings: list[Holding] = []
    for i in range(count):
        for _ in range(data.draw(st.integers(1, 2), f"jobs on GPU {i}")):
            holdings.append(Holding(-len(holdings) - 1, (i,), size))
            ends[holdings[-1].job_id] = data.draw(duration, "runs for")
    head = Request(1, need, None)
    pending, next_id = [head], 2
    bound = (levels * count + 1) * longest
    for tick in range(1, bound + 2):
        for _ in range(data.draw(st.integers(0, 3), "arrivals")):
            pending.append(Request(next_id, 1, size))
            ends[next_id] = data.draw(duration, "runs for")  # counted from when it starts
            next_id += 1
        holdings = [h for h in holdings if ends[h.job_id] > tick]

        plan = place(pending, gpus, holdings, float(tick), policy)

        if any(d.job_id == head.job_id for d in plan.decisions):
            return
        for decision in plan.decisions:
            ends[decision.job_id] += tick
        started, pending = start(plan, pending, float(tick))
        holdings += started
    raise AssertionError(f"head {head} still waits after {bound} ticks: {holdings}")


def shadow_time(head: Request, gpus: Sequence[GpuView], holdings: Sequence[Holding], policy: Policy) -> float:
    """When the head is sure to start if every running job runs to its time limit (all have one)."""
    times = []
    for view in gpus:
        candidates = sorted({0.0, *(h.ends_by or 0.0 for h in holdings if view.index in h.gpus)})
        for t in candidates:
            left = [h for h in holdings if view.index in h.gpus and (h.ends_by or 0.0) > t]
            if fits_now(view, loads([view], left, policy)[view.index], head, policy):
                times.append(t)
                break
    assert len(times) >= head.gpus
    return sorted(times)[head.gpus - 1]


def backfill_keeps_head_on_time(
    data: st.DataObject, max_gpus: int, head_mem: list[int | None], blocker_mem: list[int | None], min_jobs: int = 0
) -> None:
    """EASY backfilling: when every running job has a time limit, jobs behind the head may start now
    only if that cannot push the head past the time it is sure to start at (its shadow time)."""
    count = data.draw(st.integers(1, max_gpus), "GPUs")
    gpus = [GpuView(i, 80 * GiB) for i in range(count)]
    policy = Policy()
    head = Request(1, data.draw(st.integers(1, count), "head needs"), data.draw(st.sampled_from(head_mem), "head mem"))
    mems = st.sampled_from(blocker_mem)
    holdings: list[Holding] = []
    for i in range(count):
        for mem in data.draw(st.lists(mems, min_size=min_jobs, max_size=3), f"jobs on GPU {i}"):
            ends_by = float(data.draw(st.integers(1, 12), "ends by"))
            holdings.append(Holding(-len(holdings) - 1, (i,), mem, ends_by))
            if mem is None:
                break  # a whole-GPU job is alone on its GPU
    deadline = shadow_time(head, gpus, holdings, policy)
    assume(deadline > 0)  # the head does not fit right away
    small = st.builds(
        Request,
        job_id=st.just(0),
        gpus=st.integers(1, count),
        mem_per_gpu=st.sampled_from([None, *blocker_mem]),
        time_limit=st.integers(1, 16).map(float),
    )
    ends_early = st.sampled_from([False, False, False, True])
    pending, next_id = [head], 2
    for tick in range(int(deadline) + 1):
        now = float(tick)
        for request in data.draw(st.lists(small, max_size=2), "arrivals"):
            pending.append(dataclasses.replace(request, job_id=next_id))
            next_id += 1
        early = data.draw(st.lists(ends_early, min_size=len(holdings), max_size=len(holdings)), "ends early")
        holdings = [h for h, gone in zip(holdings, early, strict=True) if not gone and (h.ends_by or 0.0) > now]

        plan = place(pending, gpus, holdings, now, policy)

        check_plan(plan, pending, gpus, holdings, policy, 0)
        if any(d.job_id == head.job_id for d in plan.decisions):
            return
        started, pending = start(plan, pending, now)
        holdings += started
    raise AssertionError(f"head {head} did not start by its shadow time {deadline}")


@pytest.mark.slow  # many simulated ticks: seconds, out of the everyday unit run
@SIM
@given(st.data())
def test_backfill_never_delays_a_whole_gpu_head_past_its_shadow_time(data: st.DataObject) -> None:
    backfill_keeps_head_on_time(data, 4, [None], [None, 10 * GiB, 20 * GiB, 30 * GiB])


# Regression: _Gpu.free_at once took the end of the *last* job on a GPU, though a --mem head fits once
# enough of them end, so backfill that ended before that late estimate still delayed the head.


@settings(SIM, max_examples=300)
@given(st.data())
def test_backfill_never_delays_a_mem_head_past_its_shadow_time(data: st.DataObject) -> None:
    backfill_keeps_head_on_time(data, 2, [40 * GiB, 60 * GiB], [10 * GiB, 20 * GiB, 30 * GiB], min_jobs=2)


# ----------------------------------------------------------------------------------------------------------
# Examples: one rule each.


@pytest.mark.parametrize(("mem", "fits"), [(52 * GiB, True), (52 * GiB + 1, False)])
def test_mem_job_fits_beside_reservations_external_use_margin_and_overhead(mem: int, fits: bool) -> None:
    policy = Policy(margin=1 * GiB, overhead=1 * GiB)
    gpus = [GpuView(0, 80 * GiB, used=25 * GiB, external=5 * GiB)]
    holdings = [Holding(9, (0,), 20 * GiB)]
    # taken = max(used 25, reserved 20 + 1 + external 5) = 26; free = 80 - 26 - margin 1 = 53 = 52 + overhead 1
    plan = place([Request(1, 1, mem)], gpus, holdings, 0.0, policy)

    assert plan.decisions == ([Decision(1, (0,))] if fits else [])


@pytest.mark.parametrize(("overhead", "started"), [(0, 4), (1, 3)])
def test_four_jobs_of_a_quarter_gpu_do_not_fit_one_gpu_because_of_their_overhead(overhead: int, started: int) -> None:
    gpus = [GpuView(0, 80 * GiB)]

    plan = place([Request(i, 1, 20 * GiB) for i in range(1, 5)], gpus, [], 0.0, Policy(margin=0, overhead=overhead))

    assert len(plan.decisions) == started


def test_memory_nvml_sees_in_use_counts_even_beyond_reservations() -> None:
    """A job still warming up (or using more than it asked for) shows in NVML's used before reserved."""
    gpus = [GpuView(0, 80 * GiB, used=70 * GiB)]
    holdings = [Holding(9, (0,), 10 * GiB)]

    plan = place([Request(1, 1, 20 * GiB)], gpus, holdings, 0.0)

    assert plan.decisions == []
    assert plan.waiting[1]


def test_whole_gpu_job_does_not_share_with_a_mem_job_either_way() -> None:
    gpus = [GpuView(0, 80 * GiB), GpuView(1, 80 * GiB)]
    holdings = [Holding(8, (0,), 1 * GiB), Holding(9, (1,), None)]

    plan = place([Request(1, 1, None), Request(2, 1, 1 * GiB)], gpus, holdings, 0.0)

    assert plan.decisions == []
    assert set(plan.waiting) == {1, 2}


def test_whole_gpu_job_skips_gpu_with_more_than_negligible_external_use() -> None:
    gpus = [
        GpuView(0, 80 * GiB, used=2 * GiB, external=2 * GiB),
        GpuView(1, 80 * GiB, used=GiB // 2, external=GiB // 2),
    ]

    plan = place([Request(1, 1, None), Request(2, 1, None)], gpus, [], 0.0)

    assert plan.decisions == [Decision(1, (1,))]
    assert 2 in plan.waiting


def test_unavailable_gpu_receives_no_job() -> None:
    gpus = [GpuView(0, 80 * GiB, available=False), GpuView(1, 80 * GiB)]

    plan = place([Request(1, 1, 10 * GiB), Request(2, 1, None), Request(3, 2, 1 * GiB)], gpus, [], 0.0)

    assert plan.decisions == [Decision(1, (1,))]
    assert "could ever" in plan.waiting[3]


def test_multi_gpu_job_gets_distinct_gpus() -> None:
    gpus = [GpuView(i, 80 * GiB) for i in range(4)]

    plan = place([Request(1, 3, 10 * GiB), Request(2, 2, None)], gpus, [], 0.0)

    assert len(plan.decisions) == 1
    first = plan.decisions[0]
    assert first.job_id == 1 and len(set(first.gpus)) == 3
    assert 2 in plan.waiting


def test_four_mem_jobs_spread_over_four_empty_gpus() -> None:
    gpus = [GpuView(i, 80 * GiB) for i in range(4)]

    plan = place([Request(i, 1, 10 * GiB) for i in range(1, 5)], gpus, [], 0.0)

    assert sorted(g for d in plan.decisions for g in d.gpus) == [0, 1, 2, 3]


def test_two_gpu_job_gets_an_nvlink_pair() -> None:
    gpus = [GpuView(i, 80 * GiB) for i in range(4)]

    plan = place([Request(1, 2, 10 * GiB)], gpus, [], 0.0, distance=nvlink_pairs)

    assert plan.decisions[0].gpus in {(0, 1), (2, 3)}


def test_two_gpu_job_prefers_an_nvlink_pair_over_the_emptiest_gpus() -> None:
    """Spreading alone would pick GPUs 0 and 2 (GPU 1 has a job); the linked pair 2-3 is better."""
    gpus = [GpuView(i, 80 * GiB) for i in range(4)]
    holdings = [Holding(9, (1,), 10 * GiB)]

    plan = place([Request(1, 2, None)], gpus, holdings, 0.0, distance=nvlink_pairs)

    assert plan.decisions == [Decision(1, (2, 3))]


@pytest.mark.parametrize("order", [(1, 2), (2, 1)])
def test_first_of_two_identical_jobs_gets_the_only_slot(order: tuple[int, int]) -> None:
    gpus = [GpuView(0, 80 * GiB), GpuView(1, 80 * GiB)]
    holdings = [Holding(9, (1,), None)]

    plan = place([Request(job_id, 1, 60 * GiB) for job_id in order], gpus, holdings, 0.0)

    assert plan.decisions == [Decision(order[0], (0,))]
    assert set(plan.waiting) == {order[1]}


def test_cpu_jobs_get_no_gpus_and_share_the_cpu_slots_with_running_ones() -> None:
    gpus = [GpuView(0, 80 * GiB)]
    pending = [Request(i, 0) for i in range(1, 5)]

    plan = place(pending, gpus, [], 0.0, Policy(cpu_slots=3), cpu_jobs_running=1)

    assert plan.decisions == [Decision(1, ()), Decision(2, ())]
    assert set(plan.waiting) == {3, 4}
    assert "CPU slot" in plan.waiting[3]


def test_cpu_jobs_are_unlimited_without_cpu_slots_and_need_no_gpu() -> None:
    plan = place([Request(i, 0) for i in range(1, 6)], [], [], 0.0, cpu_jobs_running=100)

    assert plan.decisions == [Decision(i, ()) for i in range(1, 6)]


def test_waiting_cpu_job_does_not_block_gpu_jobs_behind_it() -> None:
    gpus = [GpuView(0, 80 * GiB)]

    plan = place([Request(1, 0), Request(2, 1, 10 * GiB)], gpus, [], 0.0, Policy(cpu_slots=0))

    assert plan.decisions == [Decision(2, (0,))]


def test_job_that_can_never_fit_does_not_block_the_queue_and_says_why() -> None:
    gpus = [GpuView(0, 80 * GiB, used=30 * GiB, external=30 * GiB), GpuView(1, 40 * GiB)]

    plan = place([Request(1, 1, 60 * GiB), Request(2, 1, None), Request(3, 1, 10 * GiB)], gpus, [], 0.0)

    assert plan.decisions == [Decision(2, (1,)), Decision(3, (0,))]
    assert "could ever" in plan.waiting[1]


def test_job_needing_more_gpus_than_exist_does_not_block_the_queue() -> None:
    gpus = [GpuView(0, 80 * GiB), GpuView(1, 80 * GiB)]

    plan = place([Request(1, 3, None), Request(2, 2, None)], gpus, [], 0.0)

    assert plan.decisions == [Decision(2, (0, 1))]
    assert "could ever" in plan.waiting[1]


def test_every_waiting_job_has_a_reason() -> None:
    gpus = [GpuView(0, 80 * GiB), GpuView(1, 80 * GiB, available=False)]
    holdings = [Holding(9, (0,), 50 * GiB)]
    pending = [
        Request(1, 2, None),
        Request(2, 1, 40 * GiB),
        Request(3, 1, 40 * GiB),
        Request(4, 0),
        Request(5, 1, 99 * GiB),
    ]

    plan = place(pending, gpus, holdings, 0.0, Policy(cpu_slots=0))

    assert plan.decisions == []
    assert set(plan.waiting) == {1, 2, 3, 4, 5}
    assert all(reason.strip() for reason in plan.waiting.values())


# ----------------------------------------------------------------------------------------------------------
# The head of the queue: claims, backfill, starvation.


def test_small_jobs_do_not_take_the_gpu_a_waiting_two_gpu_head_claimed() -> None:
    gpus = [GpuView(i, 80 * GiB) for i in range(3)]
    holdings = [Holding(8, (1,), 10 * GiB), Holding(9, (2,), 10 * GiB)]

    plan = place([Request(1, 2, None), Request(2, 1, 10 * GiB), Request(3, 1, None)], gpus, holdings, 0.0)

    assert 0 not in {g for d in plan.decisions for g in d.gpus}, "GPU 0 is idle and claimed by job 1"
    assert "first in line" in plan.waiting[1]
    assert plan.waiting[3]


def test_small_job_may_share_a_claimed_gpu_when_the_heads_memory_stays_free() -> None:
    gpus = [GpuView(0, 80 * GiB), GpuView(1, 80 * GiB)]
    holdings = [Holding(9, (1,), 60 * GiB)]  # the head needs 2 x 40 GiB: GPU 0 fits now, GPU 1 later

    pending = [Request(1, 2, 40 * GiB), Request(2, 1, 30 * GiB), Request(3, 1, 10 * GiB)]
    plan = place(pending, gpus, holdings, 0.0, HALVES)

    # With 0.5 GiB margin and overhead: GPU 0 (claimed, 79 GiB usable) takes job 2 (30.5) and keeps the
    # head's 40.5; job 3 (10.5 more) would leave 38; GPU 1 (claimed, 19 usable) cannot spare 10.5 either.
    assert plan.decisions == [Decision(2, (0,))]
    assert set(plan.waiting) == {1, 3}


def test_two_gpu_head_starts_once_the_jobs_on_its_gpus_end_despite_a_stream_of_small_jobs() -> None:
    """No time limits: small jobs keep arriving and keep the unclaimed GPUs busy, the oldest running job
    ends each tick, and the head must still start as soon as its two claimed GPUs drain."""
    gpus = [GpuView(i, 80 * GiB) for i in range(4)]
    holdings = [Holding(-1 - i, (i,), 10 * GiB) for i in range(4)]
    head = Request(1, 2, None)
    pending, next_id, small_started = [head], 2, 0
    for tick in range(1, 50):
        pending += [Request(next_id, 1, 10 * GiB), Request(next_id + 1, 1, 10 * GiB)]
        next_id += 2
        holdings = holdings[1:]  # the oldest running job ends

        plan = place(pending, gpus, holdings, float(tick))

        check_plan(plan, pending, gpus, holdings, Policy(), 0)
        if any(d.job_id == head.job_id for d in plan.decisions):
            break
        small_started += len(plan.decisions)
        started, pending = start(plan, pending, float(tick))
        holdings += started
    else:
        raise AssertionError("the head never started")
    assert tick <= 4, f"the head waited {tick} ticks; the 4 jobs running when it arrived were gone by tick 4"
    assert small_started > 0, "the small jobs should have used the GPUs the head did not claim"


def blocked_head_world(blocker_ends_by: float | None) -> tuple[list[GpuView], list[Holding], Request]:
    """Two GPUs, each with one 10 GiB job; the head needs both to itself."""
    gpus = [GpuView(0, 80 * GiB), GpuView(1, 80 * GiB)]
    holdings = [Holding(8, (0,), 10 * GiB, blocker_ends_by), Holding(9, (1,), 10 * GiB, blocker_ends_by)]
    return gpus, holdings, Request(1, 2, None)


def test_short_job_backfills_onto_a_claimed_gpu_when_it_ends_before_the_head_could_start() -> None:
    gpus, holdings, head = blocked_head_world(blocker_ends_by=100.0)

    plan = place([head, Request(2, 1, 10 * GiB, time_limit=50.0)], gpus, holdings, 0.0)

    assert [d.job_id for d in plan.decisions] == [2]


def test_job_ending_exactly_when_the_head_could_start_may_backfill() -> None:
    gpus, holdings, head = blocked_head_world(blocker_ends_by=100.0)

    plan = place([head, Request(2, 1, 10 * GiB, time_limit=60.0)], gpus, holdings, 40.0)

    assert [d.job_id for d in plan.decisions] == [2]


@pytest.mark.parametrize("limit", [None, 101.0, 1000.0])
def test_job_outliving_the_heads_start_may_not_backfill_onto_its_gpus(limit: float | None) -> None:
    gpus, holdings, head = blocked_head_world(blocker_ends_by=100.0)

    plan = place([head, Request(2, 1, 10 * GiB, time_limit=limit)], gpus, holdings, 0.0)

    assert plan.decisions == []
    assert "held back for job 1" in plan.waiting[2]


# Regression: with a blocker that has no time limit the head's start is unknown (inf), and every
# time-limited job, however long, once counted as ending "before" it and backfilled onto claimed GPUs.


def test_no_backfill_onto_claimed_gpus_when_a_blocker_has_no_time_limit() -> None:
    gpus, holdings, head = blocked_head_world(blocker_ends_by=None)

    plan = place([head, Request(2, 1, 10 * GiB, time_limit=36_000.0)], gpus, holdings, 0.0)

    assert plan.decisions == [], "job 2 may hold GPU 0 ten hours after job 8 and 9 end"


def test_time_limited_job_does_not_take_the_idle_gpu_a_head_claimed_while_it_waits_on_an_unlimited_job() -> None:
    gpus = [GpuView(0, 80 * GiB), GpuView(1, 80 * GiB)]
    holdings = [Holding(9, (1,), 10 * GiB, ends_by=None)]

    plan = place([Request(1, 2, None), Request(2, 1, 10 * GiB, time_limit=36_000.0)], gpus, holdings, 0.0)

    assert plan.decisions == [], "job 2 would keep the head off GPU 0 for ten hours after job 9 ends"


def test_backfill_may_use_gpus_the_head_did_not_claim() -> None:
    """The head needs GPUs 0 and 1 (ending at 100); GPU 2's job never ends, so it is not claimed."""
    gpus = [GpuView(i, 80 * GiB) for i in range(3)]
    holdings = [Holding(7, (0,), 10 * GiB, 100.0), Holding(8, (1,), 10 * GiB, 100.0), Holding(9, (2,), 10 * GiB)]

    plan = place([Request(1, 2, None), Request(2, 1, 10 * GiB)], gpus, holdings, 0.0)

    assert plan.decisions == [Decision(2, (2,))]


def test_backfill_does_not_delay_a_mem_head_that_fits_once_its_first_blocker_ends() -> None:
    gpus = [GpuView(0, 80 * GiB)]
    holdings = [Holding(8, (0,), 30 * GiB, ends_by=10.0), Holding(9, (0,), 30 * GiB, ends_by=1000.0)]
    # Margin and overhead 0.5 GiB each: the head needs 40.5 of the 79.5 usable; it fits once job 8 ends at
    # t=10 (79.5 - 30.5 = 49), but with job 2 (10.5, until t=500) only 38.5 would be left then.
    head = Request(1, 1, 40 * GiB)

    plan = place([head, Request(2, 1, 10 * GiB, time_limit=500.0)], gpus, holdings, 0.0, HALVES)

    assert plan.decisions == [], "job 2 would delay the head from t=10 to t=500"


def test_whole_gpu_job_no_gpu_can_ever_hold_does_not_block_the_queue() -> None:
    # GPU 0: 1 GiB total, 768 MiB external (under the 1 GiB negligible) leaves 256 MiB < the 512 MiB margin.
    gpus = [GpuView(0, 1 * GiB, used=768 * MiB, external=768 * MiB), GpuView(1, 80 * GiB)]

    plan = place([Request(1, 2, None), Request(2, 1, 10 * GiB)], gpus, [], 0.0)

    assert plan.decisions == [Decision(2, (1,))]
    assert "could ever" in plan.waiting[1]


def test_plan_is_the_same_for_the_same_inputs() -> None:
    """Pure: no hidden state between calls."""
    gpus = [GpuView(i, 80 * GiB, used=i * GiB, external=i * GiB) for i in range(4)]
    holdings = [Holding(9, (1, 2), 20 * GiB, 50.0)]
    pending = [Request(1, 2, None), Request(2, 1, 30 * GiB, 10.0), Request(3, 0), Request(4, 3, 5 * GiB)]

    plans = [place(pending, gpus, holdings, 5.0, Policy(cpu_slots=1), nvlink_pairs) for _ in range(3)]

    assert plans[0] == plans[1] == plans[2]


# ----------------------------------------------------------------------------------------------------------
# Per-user GPU caps (a shared queue).


def test_job_over_its_users_cap_waits_and_says_so_while_another_users_job_starts() -> None:
    gpus = [GpuView(i, 80 * GiB) for i in range(3)]
    holdings = [Holding(9, (2,), None)]  # alice's
    pending = [Request(1, 1, None, user="alice"), Request(2, 1, None, user="bob")]

    plan = place(pending, gpus, holdings, 0.0, user_caps={"alice": 1}, user_gpus={"alice": 1})

    assert plan.decisions == [Decision(2, (0,))]
    assert plan.waiting == {1: "user cap: alice has 1 GPU in use (at most 1 at once)"}


def test_placements_within_a_pass_count_toward_the_cap() -> None:
    gpus = [GpuView(i, 80 * GiB) for i in range(4)]
    pending = [Request(i, 1, 10 * GiB, user="alice") for i in range(1, 4)]

    plan = place(pending, gpus, [], 0.0, user_caps={"alice": 2})

    assert [d.job_id for d in plan.decisions] == [1, 2]
    assert plan.waiting == {3: "user cap: alice has 2 GPUs in use (at most 2 at once)"}


def test_capped_job_does_not_become_the_head_and_claim_gpus_from_other_users() -> None:
    """Without the cap alice's 3-GPU job would be the head, claim GPUs 0 and 1 and hold bob's job back."""
    gpus = [GpuView(i, 80 * GiB) for i in range(4)]
    holdings = [Holding(8, (2,), None), Holding(9, (3,), None)]  # alice's, no time limits
    pending = [Request(1, 3, None, user="alice"), Request(2, 1, None, user="bob")]

    uncapped = place(pending, gpus, holdings, 0.0)
    capped = place(pending, gpus, holdings, 0.0, user_caps={"alice": 4}, user_gpus={"alice": 2})

    assert uncapped.decisions == []
    assert capped.decisions == [Decision(2, (0,))]
    assert capped.waiting == {1: "user cap: alice has 2 GPUs in use (at most 4 at once)"}


def test_job_needing_more_gpus_than_its_users_cap_says_it_never_fits_the_cap() -> None:
    plan = place(
        [Request(1, 3, None, user="alice")], [GpuView(i, 80 * GiB) for i in range(4)], [], 0.0, user_caps={"alice": 2}
    )

    assert plan.waiting == {1: "user cap: alice may hold at most 2 GPUs at once; this job needs 3"}


def test_cpu_jobs_and_users_without_a_cap_are_not_capped() -> None:
    gpus = [GpuView(0, 80 * GiB)]
    pending = [Request(1, 0, user="alice"), Request(2, 1, 10 * GiB, user="bob"), Request(3, 1, 10 * GiB)]

    plan = place(pending, gpus, [], 0.0, user_caps={"alice": 0}, user_gpus={"alice": 5})

    assert plan.decisions == [Decision(1, ()), Decision(2, (0,)), Decision(3, (0,))]


def test_packed_jobs_of_several_users_share_an_mps_gpu() -> None:
    """One MPS control daemon per (GPU, user) (daemon/controls.py): a GPU running alice's packed jobs takes
    bob's beside them, each behind its own user's server."""
    gib = 1 << 30
    gpus = [GpuView(0, 80 * gib, mps=True), GpuView(1, 80 * gib, mps=True)]
    holdings = [Holding(1, (0,), 4 * gib), Holding(2, (1,), None)]  # alice's packed job; GPU 1 taken whole
    plan = place([Request(10, 1, 4 * gib, user="bob"), Request(11, 1, 4 * gib, user="alice")], gpus, holdings, 0.0)
    assert [(d.job_id, d.gpus) for d in plan.decisions] == [(10, (0,)), (11, (0,))]


# ----------------------------------------------------------------------------------------------------------
# --gpu-ids (issue #39): a job pinned to given GPUs runs there or waits for them, and says which.


def test_a_pinned_job_runs_on_its_gpus_though_others_are_freer() -> None:
    gpus = [GpuView(i, 80 * GiB) for i in range(4)]
    plan = place([Request(1, 2, only=(2, 3))], gpus, [], now=0.0, distance=nvlink_pairs)
    assert plan.decisions == [Decision(1, (2, 3))]


def test_a_pinned_job_waits_for_its_gpus_and_others_pass_it_on_the_rest() -> None:
    gpus = [GpuView(i, 80 * GiB) for i in range(4)]
    busy = [Holding(9, (3,), None)]
    plan = place([Request(1, 1, only=(3,)), Request(2, 1), Request(3, 1, only=(1, 3))], gpus, busy, now=0.0)
    assert plan.waiting[1] == "waiting for GPU 3 to itself - first in line"
    # The head's claim is GPU 3 alone: the others start; job 3 on the one of its two GPUs that is free.
    assert plan.decisions == [Decision(2, (0,)), Decision(3, (1,))]


def test_a_pinned_job_on_a_lost_gpu_says_it_can_never_run_there() -> None:
    gpus = [GpuView(0, 80 * GiB), GpuView(1, 80 * GiB, available=False)]
    plan = place([Request(1, 2, only=(0, 1)), Request(2, 1, 20 * GiB, only=(5,))], gpus, [], now=0.0)
    assert plan.waiting[1].startswith("waiting for GPUs 0,1 to themselves: only 1 of 1 usable GPUs could ever")
    assert plan.waiting[2].startswith("waiting for GPU 5 with 20.0G free: only 0 of 0 usable GPUs")
    assert not plan.decisions
