"""The fail-fast guard over an array (``lifecycle.guard``), with plain records: when the next wave waits."""

from __future__ import annotations

from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.launcher.policy.lifecycle import FAIL_FAST_SECONDS, Decided, Hold, Undecided, guard

SPEC = JobSpec(command=("train.py",), cwd="/", env={})


def member(index: int, state: JobState, started: float | None = None, ended: float | None = None) -> JobRecord:
    return JobRecord(
        index + 2,
        SPEC,
        0,
        "a",
        state,
        0.0,
        started_at=started,
        ended_at=ended,
        array_id=1,
        array_index=index,
        reason="exit code 1" if state is JobState.FAILED else "",
    )


def failed(index: int, started: float = 0.0, after: float = 1.0) -> JobRecord:
    return member(index, JobState.FAILED, started, started + after)


def pending(*indices: int) -> list[JobRecord]:
    return [member(i, JobState.PENDING) for i in indices]


def test_a_first_failure_makes_the_next_wave_wait_for_the_members_still_running() -> None:
    running = [member(i, JobState.RUNNING, started=float(i)) for i in (1, 2, 3)]
    verdict = guard([failed(0), *running, *pending(4, 5, 6, 7)])
    assert isinstance(verdict, Undecided) and verdict.wait is not None
    assert "1 failed within" in verdict.wait and verdict.until == 3.0 + FAIL_FAST_SECONDS


def test_three_fast_failures_hold_the_array() -> None:
    verdict = guard([failed(0), failed(1), failed(2), member(3, JobState.RUNNING, 0.0), *pending(4, 5)])
    assert isinstance(verdict, Hold) and "the first 3 members failed" in verdict.reason


def test_a_success_or_a_slow_failure_decides_for_good() -> None:
    done = member(1, JobState.SUCCEEDED, 0.0, 5.0)
    assert isinstance(guard([failed(0), done, member(2, JobState.RUNNING, 1.0), *pending(3)]), Decided)
    slow = failed(0, after=FAIL_FAST_SECONDS + 1)
    assert isinstance(guard([slow, member(1, JobState.RUNNING, 1.0), *pending(2, 3)]), Decided)


def test_nothing_waits_before_a_failure_or_when_nothing_runs_to_decide() -> None:
    first_wave = [member(i, JobState.RUNNING, 0.0) for i in range(4)]
    assert guard([*first_wave, *pending(4, 5)]) == Undecided()  # not handed off, but free to start
    assert guard([failed(0), *pending(1, 2)]) == Undecided()  # one GPU: the next member starts and shows
    assert isinstance(guard([failed(0)]), Decided)  # an array of one has no guard
