"""The GPU watchdog's rules with plain values (``launcher.policy.watchdog_rules``): no processes, no daemon."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq_scheduler.launcher.policy.watchdog_rules import (
    TOLERANCE,
    Action,
    Finding,
    Given,
    Rule,
    Seen,
    Settings,
    check,
    past,
    to_stop,
)

GiB = 1 << 30
MiB = 1 << 20
DEFAULT = Settings()


def test_a_packed_liar_past_its_share_is_found_and_named_with_what_it_held() -> None:
    seen = [Seen(0, 100, int(22.4 * GiB)), Seen(0, 200, 2 * GiB), Seen(0, 300, 2 * GiB)]
    owners = {100: 4, 200: 5, 300: 6}
    running = {4: Given((0,), 4 * GiB), 5: Given((0,), 4 * GiB), 6: Given((0,), 4 * GiB)}
    found = check(seen, owners, running, DEFAULT)
    assert [(f.job, f.rule, f.action) for f in found] == [(4, Rule.PAST_SHARE, Action.STOP)]
    assert found[0].what() == "held 22.4 GiB on GPU 0 against its 4.0G share"
    assert to_stop(found) == {4: found[0]}


def test_a_job_on_a_gpu_it_was_not_given_is_found() -> None:
    found = check([Seen(1, 100, 3 * GiB)], {100: 7}, {7: Given((0,))}, DEFAULT)
    assert [(f.job, f.rule, f.gpu) for f in found] == [(7, Rule.OTHER_GPU, 1)]
    assert found[0].what() == "used GPU 1, which it was not given"


def test_a_cpu_job_that_finds_a_gpu_was_given_none() -> None:
    found = check([Seen(0, 100, 600 * MiB)], {100: 3}, {3: Given(())}, DEFAULT)
    assert [f.rule for f in found] == [Rule.OTHER_GPU]


def test_a_process_of_a_job_that_is_not_running_is_a_leftover() -> None:
    found = check([Seen(2, 100, 2 * GiB), Seen(2, 101, GiB)], {100: 9, 101: 9}, {}, DEFAULT)
    assert [(f.job, f.rule, f.pids, f.held) for f in found] == [(9, Rule.LEFTOVER, (100, 101), 3 * GiB)]
    assert found[0].what() == "process 100, 101 was still on GPU 2 after the job ended"
    assert to_stop(found) == {}  # a leftover ends its processes; there is no running job to stop


def test_processes_of_no_job_are_left_alone() -> None:
    """A teammate's notebook, gpuq's own MPS server: placement counts them as outside use; no rule applies."""
    seen = [Seen(0, 100, 70 * GiB), Seen(0, 200, 60 * GiB)]
    assert check(seen, {100: None}, {1: Given((0,), GiB)}, DEFAULT) == []


def test_a_whole_gpu_job_has_no_share_to_pass() -> None:
    assert check([Seen(0, 100, 79 * GiB)], {100: 1}, {1: Given((0,))}, DEFAULT) == []


def test_the_share_counts_the_context_and_the_tolerance_before_a_job_is_past_it() -> None:
    share = 4 * GiB
    edge = share + DEFAULT.overhead + TOLERANCE
    running = {1: Given((0,), share)}
    assert check([Seen(0, 100, edge)], {100: 1}, running, DEFAULT) == []
    assert [f.rule for f in check([Seen(0, 100, edge + 1)], {100: 1}, running, DEFAULT)] == [Rule.PAST_SHARE]
    assert not past(share, edge, DEFAULT) and past(share, edge + 1, DEFAULT)


def test_a_jobs_processes_on_one_gpu_count_together() -> None:
    """torchrun's workers, a DataLoader that touched CUDA: the job's share is of the GPU, not per process."""
    seen = [Seen(0, 100, 3 * GiB), Seen(0, 101, 3 * GiB)]
    found = check(seen, {100: 1, 101: 1}, {1: Given((0,), 4 * GiB)}, DEFAULT)
    assert [(f.rule, f.pids, f.held) for f in found] == [(Rule.PAST_SHARE, (100, 101), 6 * GiB)]


def test_a_multi_gpu_packed_job_is_held_to_its_share_on_each_gpu() -> None:
    seen = [Seen(0, 100, 4 * GiB), Seen(1, 100, 9 * GiB)]
    found = check(seen, {100: 1}, {1: Given((0, 1), 4 * GiB)}, DEFAULT)
    assert [(f.rule, f.gpu) for f in found] == [(Rule.PAST_SHARE, 1)]


def test_warn_mode_finds_the_same_but_stops_nothing() -> None:
    warn = Settings(other_gpu=Action.WARN, past_share=Action.WARN, leftover=Action.WARN)
    seen = [Seen(0, 100, 22 * GiB), Seen(1, 200, GiB), Seen(0, 300, GiB)]
    owners = {100: 1, 200: 2, 300: 3}
    running = {1: Given((0,), 4 * GiB), 2: Given((0,))}
    found = check(seen, owners, running, warn)
    assert [(f.job, f.rule, f.action) for f in found] == [
        (1, Rule.PAST_SHARE, Action.WARN),
        (2, Rule.OTHER_GPU, Action.WARN),
        (3, Rule.LEFTOVER, Action.WARN),
    ]
    assert to_stop(found) == {}


def test_each_rule_has_its_own_setting() -> None:
    mixed = Settings(other_gpu=Action.WARN)
    seen = [Seen(1, 100, GiB), Seen(0, 200, 22 * GiB)]
    found = check(seen, {100: 1, 200: 2}, {1: Given((0,)), 2: Given((0,), 4 * GiB)}, mixed)
    assert {f.job: f.action for f in found} == {1: Action.WARN, 2: Action.STOP}
    assert list(to_stop(found)) == [2]


def test_a_job_that_breaks_two_rules_is_stopped_for_the_first_and_both_are_found() -> None:
    seen = [Seen(0, 100, 22 * GiB), Seen(1, 100, GiB)]
    found = check(seen, {100: 1}, {1: Given((0,), 4 * GiB)}, DEFAULT)
    assert [(f.rule, f.gpu) for f in found] == [(Rule.OTHER_GPU, 1), (Rule.PAST_SHARE, 0)]
    assert to_stop(found)[1].rule is Rule.OTHER_GPU


def test_a_tighter_tolerance_finds_sooner() -> None:
    tight = Settings(tolerance=0)
    seen = [Seen(0, 100, 5 * GiB + MiB)]  # its share, the 1 GiB context allowance and 1 MiB
    assert check(seen, {100: 1}, {1: Given((0,), 4 * GiB)}, DEFAULT) == []
    assert [f.rule for f in check(seen, {100: 1}, {1: Given((0,), 4 * GiB)}, tight)] == [Rule.PAST_SHARE]


def test_a_finding_of_a_rule_it_does_not_know_is_an_error() -> None:
    try:
        Finding(1, "nonsense", Action.STOP, 0, (1,), 0).what()  # type: ignore[arg-type]
    except ValueError:
        return
    raise AssertionError("an unknown rule was rendered")


_gpus = st.integers(0, 3)
_jobs = st.integers(1, 6)


@pytest.mark.slow  # hundreds of generated findings: seconds, out of the everyday unit run
@settings(max_examples=2000, deadline=None)
@given(
    rows=st.lists(st.tuples(_gpus, st.integers(1, 40), st.integers(0, 30 * GiB)), max_size=20),
    owner_of=st.dictionaries(st.integers(1, 40), st.one_of(st.none(), _jobs)),
    given_jobs=st.dictionaries(
        _jobs,
        st.tuples(st.lists(_gpus, max_size=3, unique=True), st.one_of(st.none(), st.integers(GiB, 20 * GiB))),
    ),
)
def test_every_finding_is_justified_and_every_breach_is_found(
    rows: list[tuple[int, int, int]],
    owner_of: dict[int, int | None],
    given_jobs: dict[int, tuple[list[int], int | None]],
) -> None:
    """Thousands of samples: a finding exactly for each (job, GPU) that breaks a rule, never for another."""
    seen = [Seen(gpu, pid, used) for gpu, pid, used in rows]
    running = {job: Given(tuple(gpus), share) for job, (gpus, share) in given_jobs.items()}
    found = check(seen, owner_of, running, DEFAULT)
    held: dict[tuple[int, int], int] = {}
    for row in seen:
        job = owner_of.get(row.pid)
        if job is not None:
            held[(job, row.gpu)] = held.get((job, row.gpu), 0) + row.used
    expected = set()
    for (job, gpu), total in held.items():
        if job not in running:
            expected.add((job, gpu, Rule.LEFTOVER))
        elif gpu not in running[job].gpus:
            expected.add((job, gpu, Rule.OTHER_GPU))
        elif running[job].share is not None and total > running[job].share + DEFAULT.overhead + TOLERANCE:
            expected.add((job, gpu, Rule.PAST_SHARE))
    assert {(f.job, f.gpu, f.rule) for f in found} == expected
    assert len(found) == len(expected)
    assert all(f.held == held[(f.job, f.gpu)] for f in found)
    assert found == sorted(found, key=lambda f: (f.job, list(Rule).index(f.rule), f.gpu))
    assert set(to_stop(found)) == {f.job for f in found if f.rule is not Rule.LEFTOVER}


def test_the_daemons_settings_come_from_the_config_and_gpuq_watchdog_sets_every_rule() -> None:
    from gpuq_scheduler.jobs.config import Watchdog
    from gpuq_scheduler.jobs.errors import BadInput
    from gpuq_scheduler.launcher.daemon.watching.watchdog import settings as daemon_settings

    config = Watchdog(past_share="warn", tolerance=64 * MiB)
    chosen = daemon_settings(config, {}, overhead=GiB)
    assert chosen == Settings(past_share=Action.WARN, tolerance=64 * MiB, overhead=GiB)
    every = daemon_settings(config, {"GPUQ_WATCHDOG": "warn"}, overhead=GiB)
    assert {every.other_gpu, every.past_share, every.leftover} == {Action.WARN}
    try:
        daemon_settings(config, {"GPUQ_WATCHDOG": "kill"}, overhead=GiB)
    except BadInput as err:
        assert str(err) == "GPUQ_WATCHDOG='kill': choose stop (the default) or warn"
    else:
        raise AssertionError("GPUQ_WATCHDOG=kill was taken")
