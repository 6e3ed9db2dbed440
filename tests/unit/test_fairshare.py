"""launcher.policy.fairshare: decaying usage, the fair-share order, and how it works with placement's user caps.

The order is checked against its rules with plain values; then queues of several users go through
``fair_order`` and ``place`` tick after tick, checked with test_placement's oracle (which knows caps).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq_scheduler.launcher.policy.fairshare import (
    CHARGE,
    HOUR,
    Queued,
    Usage,
    decayed,
    fair_order,
    held_gpus,
    recent_use,
    why_behind,
)
from gpuq_scheduler.launcher.policy.placement import GiB, GpuView, Holding, Policy, Request, place
from tests.unit.test_placement import SIM, check_no_overcommit, check_plan, start

DAY = 24 * HOUR


def keyed(priorities: Mapping[int, int]) -> Callable[[Request], Queued]:
    """fair_order's key for placement's Requests, with each job's --priority kept beside them."""

    def key(request: Request) -> Queued:
        assert request.user is not None
        return request.user, request.gpus, priorities.get(request.job_id, 0), request.job_id

    return key


by_fields = keyed({})


def array(user: str, first_id: int, count: int, gpus: int = 1) -> list[Request]:
    return [Request(first_id + i, gpus, None, user=user) for i in range(count)]


def ids(jobs: list[Request]) -> list[int]:
    return [job.job_id for job in jobs]


# ----------------------------------------------------------------------------------------------------------
# Decay and usage.


def test_decay_halves_every_half_life() -> None:
    assert decayed(8.0, 0.0, DAY) == 8.0
    assert decayed(8.0, DAY, DAY) == pytest.approx(4.0)
    assert decayed(8.0, 3 * DAY, DAY) == pytest.approx(1.0)
    assert decayed(8.0, DAY / 2, DAY) == pytest.approx(8.0 / 2**0.5)


def test_decay_of_a_negative_age_is_none_and_an_infinite_half_life_keeps_everything() -> None:
    assert decayed(8.0, -DAY, DAY) == 8.0, "an end time after now (a clock step back) must not grow usage"
    assert decayed(8.0, 100 * DAY, float("inf")) == 8.0


@pytest.mark.parametrize("half_life", [0.0, -1.0, float("nan")])
def test_usage_refuses_a_half_life_that_is_not_positive(half_life: float) -> None:
    with pytest.raises(ValueError, match="half_life"):
        Usage(half_life)


def test_a_run_counts_its_gpu_seconds_decayed_from_its_end() -> None:
    usage = Usage.from_history([("alice", 2, 0.0, 3 * HOUR), ("bob", 1, 0.0, HOUR)], now=3 * HOUR + DAY, half_life=DAY)

    assert usage.of("alice") == pytest.approx(3 * HOUR)  # 6 GPU-h a day ago
    assert usage.of("bob") == pytest.approx(0.5 * 2 ** -(2 / 24) * HOUR)
    assert usage.of("carol") == 0.0


runs = st.lists(
    st.tuples(
        st.sampled_from(["alice", "bob", "carol"]),
        st.integers(0, 8),
        st.floats(0, 10 * DAY),  # started
        st.floats(0, 2 * DAY),  # ran for
        st.floats(0, HOUR),  # noticed this long after it ended
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(runs, st.sampled_from([HOUR, DAY, 7 * DAY]), st.floats(0, 5 * DAY))
def test_charging_runs_as_they_end_equals_building_from_history(
    rows: list[tuple[str, int, float, float, float]], half_life: float, later: float
) -> None:
    ended = sorted(((user, gpus, s, s + d, s + d + late) for user, gpus, s, d, late in rows), key=lambda r: r[4])
    usage = Usage(half_life)
    for user, gpus, started, end, noticed in ended:
        usage = usage.charge(user, gpus, started, end, noticed)
    now = max((r[4] for r in ended), default=0.0) + later

    from_history = Usage.from_history([r[:4] for r in ended], now, half_life)

    assert usage.at(now).now == now == from_history.now
    for user in ("alice", "bob", "carol"):
        assert usage.at(now).of(user) == pytest.approx(from_history.of(user), rel=1e-9, abs=1e-6)


def test_usage_is_a_value_and_never_moves_back_in_time() -> None:
    usage = Usage(DAY, 10 * DAY, {"alice": 100.0})

    assert usage.charge("bob", 1, 0.0, HOUR, 11 * DAY).of("bob") > 0
    assert usage.of("bob") == 0.0
    assert usage.at(5 * DAY) is usage


def test_recent_use_adds_running_jobs_time_so_far_and_held_counts_their_gpus() -> None:
    usage = Usage(DAY, 0.0, {"alice": 2 * HOUR})
    running = [("alice", 2, 0.0), ("bob", 1, HOUR), ("bob", 3, DAY)]

    used = recent_use(usage, running, DAY)

    assert used["alice"] == pytest.approx(HOUR + 2 * DAY)
    assert used["bob"] == pytest.approx(DAY - HOUR)
    assert held_gpus(running) == {"alice": 2, "bob": 4}


# ----------------------------------------------------------------------------------------------------------
# The order.


def test_one_users_order_is_exactly_the_single_user_order() -> None:
    rng = random.Random(5)
    jobs = [Request(i, rng.choice([0, 1, 2]), None, user="solo") for i in rng.sample(range(1, 100_000), 10_000)]
    priority = {job.job_id: rng.randint(-3, 3) for job in jobs}

    order = fair_order(jobs, keyed(priority), used={"solo": 50 * HOUR}, held={"solo": 3})

    assert ids(order) == [j.job_id for j in sorted(jobs, key=lambda j: (-priority[j.job_id], j.job_id))]


def test_equal_history_two_arrays_alternate_and_the_first_four_placements_are_two_and_two() -> None:
    """The issue's "fair-share interleaves two users' arrays": alice submitted her 20 first."""
    jobs = array("alice", 1, 20) + array("bob", 21, 20)
    used = {"alice": 5 * HOUR, "bob": 5 * HOUR}

    order = fair_order(jobs, by_fields, used=used, held={})
    plan = place(order, [GpuView(i, 80 * GiB) for i in range(4)], [], 0.0)

    assert ids(order) == [job for pair in zip(range(1, 21), range(21, 41), strict=True) for job in pair]
    assert [d.job_id for d in plan.decisions] == [1, 21, 2, 22]


def test_gpus_held_now_count_as_use() -> None:
    """Bob already holds 2 GPUs: alice gets the next two before they alternate."""
    jobs = array("alice", 1, 5) + array("bob", 11, 5)

    order = fair_order(jobs, by_fields, used={}, held={"bob": 2})

    assert ids(order)[:6] == [1, 2, 3, 11, 4, 12]  # tie at 2 GPUs each: the lower id (alice's 3) first


def test_heavy_recent_user_waits_until_the_other_catches_up() -> None:
    jobs = array("alice", 1, 40) + array("bob", 41, 40)
    used = {"alice": 31 * HOUR}

    order = fair_order(jobs, by_fields, used=used, held={})

    assert ids(order)[:31] == list(range(41, 72)), "bob's 31 GPU-hours of catching up come first"
    assert ids(order)[31:37] == [1, 72, 2, 73, 3, 74], "then, loads equal, they alternate (lower id on a tie)"
    plan = place(order, [GpuView(i, 80 * GiB) for i in range(4)], [], 0.0)
    assert [d.job_id for d in plan.decisions] == [41, 42, 43, 44]
    ahead = [job.user or "" for job in order[: order.index(jobs[0])]]
    assert why_behind("alice", ahead, used) == "fair-share: alice used 31.0 GPU-h recently (bob 0.0)"


def test_multi_gpu_jobs_are_charged_per_gpu_and_cpu_jobs_not_at_all() -> None:
    jobs = [Request(1, 4, None, user="alice"), Request(2, 0, user="alice"), Request(3, 1, None, user="alice")]
    jobs += array("bob", 11, 5)

    order = fair_order(jobs, by_fields, used={}, held={})

    # alice's 4-GPU job (load 0 -> 4 h); bob catches up with 4 jobs (tie at 4: alice's id 2 first);
    # her CPU job leaves her at 4, so her id 3 goes next too, then bob's.
    assert ids(order) == [1, 11, 12, 13, 14, 2, 3, 15]


def test_admin_priority_beats_any_load() -> None:
    jobs = array("alice", 1, 3) + array("bob", 11, 3) + array("carol", 21, 3)

    order = fair_order(jobs, by_fields, used={"alice": 1000 * HOUR}, held={"alice": 8}, user_priority={"alice": 1})

    assert ids(order)[:3] == [1, 2, 3]
    assert ids(order)[3:] == [11, 21, 12, 22, 13, 23]
    assert why_behind("bob", ["alice", "carol"], {}, {"alice": 1}) == "user priority: alice (1) goes before bob (0)"


def test_negative_admin_priority_goes_last() -> None:
    jobs = array("alice", 1, 2) + array("bob", 11, 2)

    order = fair_order(jobs, by_fields, used={"bob": 100 * HOUR}, held={}, user_priority={"alice": -1})

    assert ids(order) == [11, 12, 1, 2]


def test_job_priority_orders_only_its_own_users_jobs() -> None:
    jobs = array("alice", 1, 3) + array("bob", 11, 3)
    order = fair_order(jobs, keyed({3: 100, 13: -5}), used={"alice": HOUR / 2}, held={})

    # bob is lighter, so he goes first despite alice's --priority 100; her job 3 leads her own jobs,
    # his -5 job goes after his others, and the users alternate throughout.
    assert ids(order) == [11, 3, 12, 1, 13, 2]


def test_fair_order_takes_any_job_type_through_its_key() -> None:
    jobs = [("j1", "alice"), ("j2", "alice"), ("j3", "bob")]

    order = fair_order(jobs, lambda job: (job[1], 1, 0, int(job[0][1:])), used={"alice": 0.0}, held={"alice": 1})

    assert order == [("j3", "bob"), ("j1", "alice"), ("j2", "alice")]  # alice holds a GPU: bob is lighter
    assert fair_order([], by_fields, used={}, held={}) == []


def test_ten_thousand_jobs_of_five_users_are_ordered_in_a_few_milliseconds() -> None:
    rng = random.Random(1)
    users = ["alice", "bob", "carol", "dave", "erin"]
    keys = [(rng.choice(users), rng.choice([0, 1, 1, 2, 4]), rng.randint(-2, 2), i) for i in range(10_000)]
    used = {u: rng.uniform(0, 50) * HOUR for u in users}
    held = {u: rng.randint(0, 4) for u in users}

    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        order = fair_order(keys, lambda k: k, used=used, held=held)
        best = min(best, time.perf_counter() - began)

    assert sorted(order) == sorted(keys)
    assert best < 0.05, f"{best * 1000:.1f} ms"  # about 5 ms where measured; generous for a slow CI box


def test_projected_loads_never_get_out_of_step_by_more_than_one_job() -> None:
    """At every point of the order, a user whose next job was passed over had the lower or equal load."""
    rng = random.Random(2)
    keys = [(rng.choice("abc"), rng.choice([1, 2, 4]), 0, i) for i in range(300)]
    used = {"a": 3 * HOUR, "b": 0.0, "c": 10 * HOUR}
    load = dict(used)
    left = {u: sum(1 for k in keys if k[0] == u) for u in "abc"}

    for user, gpus, _, _ in fair_order(keys, lambda k: k, used=used, held={}):
        others = [u for u in "abc" if u != user and left[u]]
        assert all(load[user] <= load[u] for u in others), (user, load)
        load[user] += CHARGE * gpus
        left[user] -= 1


# ----------------------------------------------------------------------------------------------------------
# Reasons.


def test_why_behind_names_the_users_ahead_lightest_first_in_one_short_line() -> None:
    used = {"alice": 31.04 * HOUR, "bob": 2 * HOUR, "carol": 0.25 * HOUR, "dave": 7 * HOUR, "erin": HOUR}

    reason = why_behind("alice", ["bob", "alice", "dave", "carol", "erin", "bob"], used)

    assert reason == "fair-share: alice used 31.0 GPU-h recently (carol 0.2, erin 1.0, bob 2.0, 1 more)"
    assert why_behind("alice", ["alice", "alice"], used) is None
    assert why_behind("alice", [], used) is None


# ----------------------------------------------------------------------------------------------------------
# Fair share and caps together, over simulated time.


def test_two_arrays_interleave_and_caps_hold_until_both_are_done() -> None:
    """Every job runs an hour; each tick is an hour. Alice is capped at 1 GPU, bob at 3: she never holds
    more than 1, and her cap never leaves a GPU idle that bob's jobs could use."""
    gpus = [GpuView(i, 80 * GiB) for i in range(4)]
    caps = {"alice": 1, "bob": 3}
    pending = array("alice", 1, 20) + array("bob", 21, 20)
    usage = Usage(DAY)
    for tick in range(40):
        now = tick * HOUR
        order = fair_order(pending, by_fields, used=recent_use(usage, [], now), held={})

        plan = place(order, gpus, [], now, user_caps=caps, user_gpus={})

        check_plan(plan, order, gpus, [], Policy(), 0, caps, {})
        users = [next(r.user for r in pending if r.job_id == d.job_id) for d in plan.decisions]
        assert users.count("alice") <= 1 and users.count("bob") <= 3
        assert len(users) == min(4, sum(min(caps[u], sum(r.user == u for r in pending)) for u in caps))
        for user in users:
            usage = usage.charge(user or "", 1, now, now + HOUR, now + HOUR)
        _, pending = start(plan, pending, now)
        if not pending:
            break
    assert not pending


users = st.sampled_from(["alice", "bob", "carol"])
shared_requests = st.builds(
    Request,
    job_id=st.just(0),
    gpus=st.sampled_from([0, 1, 1, 1, 2, 2, 3]),
    mem_per_gpu=st.sampled_from([None, 4 * GiB, 20 * GiB, 40 * GiB, 70 * GiB]),
    time_limit=st.sampled_from([None, 5.0, 30.0]),
    user=users,
)


@pytest.mark.slow  # many simulated ticks: seconds, out of the everyday unit run
@settings(SIM, max_examples=500)
@given(st.data())
def test_caps_hold_and_a_capped_user_never_blocks_the_others_tick_after_tick(data: st.DataObject) -> None:
    """Random queues of three users, random caps (sometimes changed by an admin) and priorities, fair order
    then placement, several ticks: no user's GPUs grow past their cap, and check_plan's work conservation
    (which skips jobs over their user's cap) holds, so a capped user's job never holds back a fitting job
    of a user under their cap."""
    count = data.draw(st.integers(1, 5), "GPUs")
    gpus = [GpuView(i, data.draw(st.sampled_from([24 * GiB, 80 * GiB]), "size")) for i in range(count)]
    caps = data.draw(st.dictionaries(users, st.integers(0, 4)), "caps")
    user_priority = data.draw(st.dictionaries(users, st.integers(-1, 1)), "user priorities")
    usage = Usage(DAY)
    running: list[tuple[Holding, str, float]] = []  # (holding, user, started)
    pending: list[Request] = []
    priority: dict[int, int] = {}  # job id -> --priority
    now, next_id = 0.0, 1
    for _tick in range(data.draw(st.integers(1, 6), "ticks")):
        for request in data.draw(st.lists(shared_requests, max_size=5), "arrivals"):
            pending.append(dataclasses.replace(request, job_id=next_id))
            priority[next_id] = data.draw(st.integers(-1, 1), "priority")
            next_id += 1
        ends = data.draw(st.lists(st.booleans(), min_size=len(running), max_size=len(running)), "ends")
        for (holding, user, started), ended in zip(running, ends, strict=True):
            if ended:
                usage = usage.charge(user, len(holding.gpus), started, now, now)
        running = [r for r, ended in zip(running, ends, strict=True) if not ended]
        if data.draw(st.integers(0, 3), "an admin changes the caps") == 0:
            caps = data.draw(st.dictionaries(users, st.integers(0, 4)), "caps")  # may leave a user over theirs
        runs = [(user, len(h.gpus), started) for h, user, started in running]
        holdings = [h for h, _, _ in running]
        held = held_gpus(runs)

        order = fair_order(
            pending, keyed(priority), used=recent_use(usage, runs, now), held=held, user_priority=user_priority
        )
        plan = place(order, gpus, holdings, now, user_caps=caps, user_gpus=held)

        check_plan(plan, order, gpus, holdings, Policy(), 0, caps, held)
        by_id = {r.job_id: r for r in pending}
        started_now, pending = start(plan, pending, now)
        running += [(h, by_id[h.job_id].user or "", now) for h in started_now]
        check_no_overcommit(gpus, [h for h, _, _ in running], Policy())
        for user, total in held_gpus([(u, len(h.gpus), s) for h, u, s in running]).items():
            assert total <= max(caps.get(user, total), held.get(user, 0)), (user, total, caps)
        now += data.draw(st.sampled_from([60.0, HOUR]), "elapsed")
