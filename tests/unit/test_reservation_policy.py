"""Reservations' pure rules (launcher/policy/reserved.py) and the start-time grammar (jobs/reservations.py),
over plain values: no daemon, no clock."""

from __future__ import annotations

import datetime

import pytest

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.reservations import Ask, Reservation, clock, parse_start
from gpuq_scheduler.launcher.policy import reserved as rules
from gpuq_scheduler.launcher.policy.placement import GpuView, Request, place

UTC = datetime.timezone.utc
NOW = datetime.datetime(2026, 11, 29, 17, 0, tzinfo=UTC).timestamp()  # a Sunday, 17:00 UTC
HOUR = 3600.0
GiB = 1 << 30


def _alice(start: float = NOW + HOUR, hours: float = 3, gpus: tuple[int, ...] = (0, 1, 2, 3)) -> Reservation:
    return Reservation("deadline", "alice", 1001, gpus, start, start + hours * HOUR)


def _fence(
    requests: list[Request],
    booked: list[Reservation],
    now: float = NOW,
    named: dict[int, str] | None = None,
    preemptible: set[int] | None = None,
) -> tuple[list[Request], dict[int, str], dict[int, str]]:
    return rules.fence(
        requests, booked, now, list(range(8)), lambda j: (named or {}).get(j, ""), lambda j: j in (preemptible or set())
    )


def _gpus(count: int = 8) -> list[GpuView]:
    return [GpuView(i, 80 * GiB) for i in range(count)]


def test_before_the_start_a_job_that_ends_in_time_backfills_the_reserved_gpus() -> None:
    """Eight free GPUs, 0-3 reserved from an hour on: an 8-GPU job of 50 minutes starts on all of them."""
    placeable, waiting, _ = _fence([Request(1, 8, time_limit=50 * 60, user="bob")], [_alice()])
    assert not waiting and placeable[0].only == ()
    assert place(placeable, _gpus(), [], NOW).decisions[0].gpus == tuple(range(8))


def test_a_job_that_would_run_past_the_start_is_kept_off_the_reserved_gpus_and_told_why() -> None:
    booked = [_alice()]
    placeable, waiting, notes = _fence([Request(1, 8, time_limit=2 * HOUR, user="bob")], booked)
    assert waiting == {1: f"GPUs 0-3 are reserved for alice from {clock(NOW + HOUR, NOW)}"}
    # A 4-GPU job with no time limit goes on 4-7, and says nothing unless it waits.
    placeable, waiting, notes = _fence([Request(2, 4, user="bob")], booked)
    assert placeable[0].only == (4, 5, 6, 7) and not waiting
    assert place(placeable, _gpus(), [], NOW).decisions[0].gpus == (4, 5, 6, 7)
    # Were 4-7 busy, it waits, and its reason begins with the reservation.
    assert notes[2].startswith("GPUs 0-3 are reserved for alice from ")


def test_the_why_line_names_the_gpus_the_owner_and_the_start() -> None:
    start = datetime.datetime(2026, 11, 30, 9, 0).timestamp()  # local time: the words are the user's clock
    now = start - 16 * HOUR
    _, waiting, _ = _fence([Request(1, 8, user="bob")], [_alice(start)], now)
    assert waiting[1] == "GPUs 0-3 are reserved for alice from tomorrow 09:00"


def test_a_preemptible_job_may_use_reserved_gpus_before_the_start_because_it_steps_aside() -> None:
    placeable, waiting, _ = _fence([Request(1, 8, user="bob")], [_alice()], preemptible={1})
    assert not waiting and placeable[0].only == ()


def test_during_the_reservation_only_the_owners_jobs_that_name_it_run_on_its_gpus() -> None:
    booked = [_alice(start=NOW - 60)]
    requests = [
        Request(1, 2, user="alice"),
        Request(2, 2, user="alice"),
        Request(3, 2, user="bob"),
        Request(4, 1, user="bob", time_limit=60),
    ]
    placeable, waiting, _ = _fence(requests, booked, named={2: "deadline", 3: "deadline"})
    by_id = {r.job_id: r for r in placeable}
    assert by_id[1].only == (4, 5, 6, 7)  # alice's own job outside it: elsewhere, like anyone's
    assert by_id[2].only == (0, 1, 2, 3)  # in it: only there
    assert waiting[3] == "reservation deadline is alice's: only their jobs run in it"
    assert by_id[4].only == (4, 5, 6, 7)  # short, but the reservation is on: backfill is before the start only
    assert {d.job_id: d.gpus for d in place(placeable, _gpus(), [], NOW).decisions}[2] == (0, 1)


def test_a_job_naming_a_reservation_waits_for_its_start_and_one_naming_none_says_so() -> None:
    _, waiting, _ = _fence(
        [Request(1, 1, user="alice"), Request(2, 1, user="alice")], [_alice()], named={1: "deadline", 2: "typo"}
    )
    assert waiting[1] == f"waiting for reservation deadline, which starts at {clock(NOW + HOUR, NOW)}"
    assert waiting[2] == "reservation typo is not known here or has ended (`gpuq reserve --list`)"


def test_a_reservation_over_or_ended_bars_nothing() -> None:
    for booked in ([_alice(start=NOW - 4 * HOUR)], [_alice().but(ended="cancelled by alice", ended_at=NOW)]):
        placeable, waiting, _ = _fence([Request(1, 8, user="bob")], booked)
        assert not waiting and placeable[0].only == ()


def test_at_the_start_preemptible_work_on_its_gpus_steps_aside_and_the_rest_is_said_ahead() -> None:
    booked = _alice(start=NOW)
    running = [
        rules.Work(1, (0,), "bob", preemptible=True),
        rules.Work(2, (1,), "bob"),
        rules.Work(3, (2,), "bob", ends_by=NOW + 2 * HOUR),
        rules.Work(4, (5,), "bob", preemptible=True),
        rules.Work(5, (3,), "alice", reservation="deadline"),
    ]
    assert [(w.job_id, r.name) for w, r in rules.victims([booked], running, NOW)] == [(1, "deadline")]
    assert rules.victims([booked], running, NOW - 1) == []  # not before the start
    ahead = rules.conflicts(_alice(), running, list(range(8)), NOW)
    assert len(ahead) == 2  # job 2 (no time limit) and job 3 (ends after the start); not 1, 4 or 5
    assert ahead[0].startswith("job 2 (bob, not --preemptible) will still hold GPU 1 at ")
    assert ahead[0].endswith("it has no time limit")
    assert "job 3 " in ahead[1] and "its time limit ends" in ahead[1]
    assert rules.conflicts(_alice(), [], [0, 1, 2], NOW) == ["GPU 3 is gone from this machine (lost or removed)"]


def test_an_unused_reservation_is_released_after_the_idle_time_and_a_used_one_is_not() -> None:
    on = _alice(start=NOW - 31 * 60)
    assert rules.idle(on, NOW, busy=False, limit=30 * 60)
    assert not rules.idle(on, NOW, busy=True, limit=30 * 60)
    assert not rules.idle(on.but(used_at=NOW - 60), NOW, busy=False, limit=30 * 60)
    assert not rules.idle(on, NOW, busy=False, limit=None)
    assert not rules.idle(_alice(), NOW, busy=False, limit=1)  # not on yet


def test_gpus_are_chosen_free_of_overlapping_reservations_and_of_work_that_would_stay() -> None:
    booked = [_alice(gpus=(0, 1))]
    running = [rules.Work(1, (2,), "bob"), rules.Work(2, (3,), "bob", preemptible=True)]
    start, end = NOW + 2 * HOUR, NOW + 3 * HOUR
    assert rules.choose_gpus(2, list(range(6)), booked, running, start, end) == (4, 5)
    assert rules.choose_gpus(3, list(range(6)), booked, running, start, end) == (3, 4, 5)  # steps aside: before 2
    assert rules.choose_gpus(5, list(range(6)), booked, running, start, end) is None
    assert rules.choose_gpus(2, list(range(6)), booked, running, NOW + 5 * HOUR, NOW + 6 * HOUR) == (0, 1)


def test_the_daemon_wakes_at_the_next_start_or_end() -> None:
    assert rules.next_change([_alice()], NOW) == NOW + HOUR
    assert rules.next_change([_alice()], NOW + 2 * HOUR) == NOW + 4 * HOUR


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("+2h", NOW + 2 * HOUR),
        ("+90m", NOW + 90 * 60),
        ("18:30", NOW + 90 * 60),
        ("tomorrow 09:00", NOW + 16 * HOUR),
        ("tomorrow  9:05", NOW + 16 * HOUR + 300),
        ("2026-12-01 09:00", NOW + 40 * HOUR),
        ("2026-12-01T09:00:00+01:00", NOW + 39 * HOUR),
    ],
)
def test_the_start_grammar(text: str, expected: float) -> None:
    assert parse_start(text, NOW, UTC) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("09:00", "has passed today; say 'tomorrow 09:00'"),
        ("25:00", "no such time of day"),
        ("tomorrow", "cannot read --start"),
        ("next week", "cannot read --start"),
        ("+soon", "after + give"),
        ("2020-01-01 09:00", "is in the past"),
        ("tomorrow 9", "cannot read --start"),
    ],
)
def test_a_start_that_cannot_be_read_is_one_line_saying_what_to_write(text: str, words: str) -> None:
    with pytest.raises(BadInput) as err:
        parse_start(text, NOW, UTC)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_reserve_request_written_by_hand_is_held_to_the_same_rules() -> None:
    good = {"token": "a" * 32, "gpus": 2, "start": NOW, "end": NOW + HOUR, "name": "x", "user": ""}
    assert Ask.from_json(good).gpus == 2
    for bad in (
        {"gpus": 0},
        {"gpus": True},
        {"end": NOW},
        {"token": "zz"},
        {"name": "../x"},
        {"start": 1e300},
        {"admin": True},
        {"end": NOW + 365 * 86400},
    ):
        with pytest.raises(BadInput):
            Ask.from_json({**good, **bad})
