"""The journal's typed events (jobs/store/events.py): each kind written by its one writer and read back by
its one reader, and a journal a real daemon wrote before events were typed read whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.fastsuspend import Fallback
from gpuq_scheduler.jobs.fastsuspend import Path as SuspendPath
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store import journal
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.store.events import (
    CLASS_OF,
    Again,
    ArrayHeld,
    Asked,
    Ended,
    Event,
    GpuLost,
    IdleReleased,
    Kind,
    PoolGivenBack,
    Preempted,
    QueueSet,
    Refused,
    Rejected,
    ReservationEnded,
    ReservationWarning,
    Reserved,
    Resumed,
    Started,
    StepFailed,
    Submitted,
    Suspended,
    Watchdog,
    from_json,
)

OLD_JOURNAL = Path(__file__).resolve().parents[1] / "fixtures" / "journal-1f61ec5" / "events.jsonl"
GiB = 1 << 30

ONE_OF_EACH: list[Event] = [
    Submitted(1.0, 1, "alice"),
    Started(2.0, 1, (0, 1)),
    Started(2.5, 2, (3,), after=1),
    *(Ended(3.0, kind, 1, "said", Cause.EXIT_CODE, exit_code=3, attempt=1) for kind in Ended.KINDS),
    Ended(3.1, Kind.CANCELLED, 2, "cancelled by bob", Cause.CANCELLED),
    Again(4.0, Kind.RETRY, 1, "retry 1 of 2 after: exit code 3"),
    Again(4.1, Kind.REQUEUED, 1, "CUDA out of memory", culprit=7),
    ArrayHeld(5.0, 10, "4 members failed"),
    *(Asked(6.0, kind, 1, "alice") for kind in Asked.KINDS if kind is not Kind.UPDATE),
    Asked(6.1, Kind.UPDATE, 1, "alice", {"priority": 5, "time_limit": 600.0}),
    *(QueueSet(7.0, kind, (0, 2), "root") for kind in QueueSet.KINDS),
    *(Refused(8.0, kind, "mallory", job=1) for kind in Refused.KINDS),
    Refused(8.1, Kind.SUSPEND_REFUSED, "alice", job=1, why="it holds no GPU memory"),
    Refused(8.2, Kind.UNRESERVE_REFUSED, "bob", why="no such reservation", name="later"),
    Suspended(
        9.0,
        1,
        40 * GiB,
        {"freeze": 0.1},
        {"spawned": 8.9},
        SuspendPath.DRIVER,
        Fallback.NOT_ASKED,
        "",
        {"fast_bytes": 0, "fast_seconds": 0.0},
    ),
    Suspended(9.1, 2, GiB),  # as gpuq wrote it before suspends had paths
    Resumed(10.0, 1, {"thaw": 0.2}, {"spawned": 9.9}),
    Resumed(10.1, 2, {"thaw": 0.2}, {"spawned": 9.9}, pool=60 << 30),
    PoolGivenBack(10.2, 2, 60 << 30, "GPUQ_FAST_POOL=off", (4242,)),
    StepFailed(11.0, Kind.RESUME_FAILED, 1, "no memory"),
    StepFailed(11.1, Kind.SUSPEND_UNDONE, 1, "the driver refused"),
    Rejected(12.0, "control-x.json", "is not JSON", 1000),
    Watchdog(13.0, 1, "past-share", "stop", 0, (123, 124), 22 * GiB, "held 22.0 GiB on GPU 0"),
    GpuLost(14.0, 1, "GPU 0 was lost"),
    IdleReleased(15.0, 1, 3600.5),
    Preempted(16.0, 1, "priority 10 > 0", preemptor=3),
    Preempted(16.1, 1, "it cannot end in time", reservation="deadline"),
    Preempted(16.2, 4, "job 4 is --preemptible", preemptor=3, requeue="it is an MPS client"),
    Reserved(17.0, "deadline", "alice", (0, 1), 100.0, 200.0, "alice", ("job 3 may not end in time",)),
    ReservationEnded(18.0, "deadline", "its time is up"),
    ReservationWarning(19.0, "deadline", "alice", ("job 4 may not end in time",)),
]


def test_every_kind_has_one_class_and_every_ending_state_and_action_its_kind() -> None:
    assert set(CLASS_OF) == set(Kind)
    assert {event.kind for event in ONE_OF_EACH} == set(Kind)  # the round trip below covers every kind
    assert {state.value for state in JobState if state.finished} == {kind.value for kind in Ended.KINDS}
    for action in Action:
        assert Kind.refused(action) in Refused.KINDS
        if action.on_pending or action.on_queue:
            assert Kind.done(action).value == action.value
        else:
            with pytest.raises(ValueError):
                Kind.done(action)


@pytest.mark.parametrize("event", ONE_OF_EACH, ids=lambda e: f"{e.kind.value}-{e.t}")
def test_each_event_reads_back_as_it_was_written(event: Event) -> None:
    line = json.dumps(event.to_json(), separators=(",", ":"))
    assert from_json(json.loads(line)) == event
    assert line.startswith('{"t":') and f'"event":"{event.kind.value}"' in line


def test_an_event_of_a_kind_its_class_does_not_stand_for_is_refused() -> None:
    with pytest.raises(ValueError, match="not an event of kind"):
        Asked(1.0, Kind.SUSPENDED, 1, "alice")
    with pytest.raises(ValueError, match="not an event of kind"):
        Submitted(1.0, 1, "alice", kind=Kind.STARTED)


@pytest.mark.parametrize(
    "line, said",
    [
        ({"t": 1.0, "job": 1, "event": "teleported"}, "unknown kind 'teleported'"),
        ({"t": 1.0, "job": "one", "event": "submitted", "user": "alice"}, "job must be int"),
        ({"t": 1.0, "job": 1, "event": "submitted"}, "without its user"),
        ({"t": 1.0, "job": 1, "event": "failed", "reason": "", "cause": "bad luck"}, "bad luck"),
    ],
)
def test_a_line_that_is_no_event_this_gpuq_knows_is_bad_input(line: dict[str, object], said: str) -> None:
    with pytest.raises(BadInput, match=said):
        from_json(line)


def test_a_journal_written_before_events_were_typed_is_read_whole() -> None:
    """tests/fixtures/journal-1f61ec5: a real daemon's, through the real CLI (its build.py says how)."""
    lines = [json.loads(line) for line in OLD_JOURNAL.read_text().splitlines()]
    read = list(journal.read(OLD_JOURNAL))
    assert len(read) == len(lines) == 33
    for line, event in zip(lines, read, strict=True):
        kept = {key: value for key, value in line.items() if value is not None or key == "fallback"}
        assert event.to_json() == kept  # null fields left out, but a suspend's fallback (readers look for it)
    assert {e.kind for e in read} >= {Kind.SUBMITTED, Kind.UPDATE, Kind.SUSPENDED, Kind.RESERVED, Kind.REJECTED}
    suspended = next(e for e in read if isinstance(e, Suspended))
    assert (suspended.path, suspended.fallback, suspended.detail) == (SuspendPath.DRIVER, Fallback.NOT_ASKED, "")
    assert suspended.bytes == 64961380352 and suspended.more == {"fast_bytes": 0, "fast_seconds": 0.0}
    update = next(e for e in read if isinstance(e, Asked) and e.kind is Kind.UPDATE)
    assert update.values == {"priority": 5, "time_limit": 600.0}
    timeout = next(e for e in read if isinstance(e, Ended) and e.state is JobState.TIMEOUT)
    assert timeout.cause is Cause.TIME_LIMIT and timeout.signal == 15 and timeout.exit_code is None


def test_the_journal_reads_the_kinds_and_job_asked_and_skips_what_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    journal.append(path, ONE_OF_EACH)
    with path.open("ab") as handle:
        handle.write(b'{"t": 20.0, "job": 1, "event": "from-a-newer-gpuq"}\n')
        handle.write(b'{"t": 21.0, "job": 1, "event": "suspe')  # a torn last line (a crash mid-write)
    assert list(journal.read(path)) == ONE_OF_EACH
    suspends = list(journal.read(path, (Kind.SUSPENDED, Kind.RESUMED), job=1))
    assert [(e.kind, e.t) for e in suspends] == [(Kind.SUSPENDED, 9.0), (Kind.RESUMED, 10.0)]
    assert list(journal.read(tmp_path / "none.jsonl")) == []
