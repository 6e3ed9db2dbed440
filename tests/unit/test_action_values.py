"""A control request's values, typed (jobs/store/action_values.py): the client writes each action's dataclass, the
spool reads it back as that dataclass, the request files older clients left read as they did, and a value that
breaks the rules is set aside in the words the checks always gave."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.reservations import Ask, Unreserve
from gpuq_scheduler.jobs.store import action_values, journal, outbox, spool
from gpuq_scheduler.jobs.store.action_values import CARRIES, Update
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.events import Asked, Kind
from gpuq_scheduler.jobs.store.statedir import StateDir
from tests.conftest import Gpuq, wait_for

OLD_SPOOL = Path(__file__).resolve().parents[1] / "fixtures" / "spool-b2bbccd"
START = 1796025600.0
ASK = Ask("0123456789abcdef0123456789abcdef", 2, START, START + 3 * 3600, "deadline", "")


@pytest.fixture
def state(tmp_path: Path) -> StateDir:
    made = StateDir(tmp_path / "state dir")
    made.ensure()
    return made


def _control(state: StateDir, action: str, values: Any, ids: list[int] | None = None) -> spool.Request:
    """A control request as a user may write one by hand, read back by the spool."""
    path = Path(state.control_request("a" * 32))
    body = {"schema": 1, "kind": "control", "action": action, "ids": [7] if ids is None else ids, "values": values}
    path.write_text(json.dumps(body))
    return spool.read_request(path)


@pytest.mark.parametrize(
    "action, values",
    [
        (Action.UPDATE, Update(priority=5, time_limit=600.0)),
        (Action.UPDATE, Update(priority=-3)),
        (Action.UPDATE, Update(time_limit=7200.0)),
        (Action.RESERVE, ASK),
        (Action.UNRESERVE, Unreserve("deadline")),
        (Action.HOLD, None),
        (Action.SUSPEND, None),
    ],
)
def test_each_action_reads_back_as_the_values_its_client_wrote(
    state: StateDir, action: Action, values: action_values.ActionValues | None
) -> None:
    ids = [] if action.on_reservations else [7]
    request = spool.read_request(outbox.write_control(state, action, ids, values))
    assert isinstance(request, spool.ControlRequest), request
    assert request.action is action and request.values == values
    if values is not None:
        assert request.values_as(type(values)) == values


def test_control_requests_an_older_client_left_in_the_spool_read_as_typed_values(state: StateDir) -> None:
    """tests/fixtures/spool-b2bbccd: written by the client at b2bbccd, which wrote values as dicts (its build.py
    says how); the files on disk are laid out as they always were, and this gpuq's client writes the same."""
    for old in OLD_SPOOL.glob("control-*.json"):
        shutil.copy(old, state.at("spool", old.name))
    read = {Path(r.path).name: r for r in spool.scan(state)[0]}
    assert all(isinstance(r, spool.ControlRequest) for r in read.values()), read
    assert {name: (r.action, r.ids, r.values) for name, r in read.items() if isinstance(r, spool.ControlRequest)} == {
        "control-update.json": (Action.UPDATE, (7,), Update(5, 600.0)),
        "control-update-priority.json": (Action.UPDATE, (7, 8), Update(priority=-3)),
        "control-reserve.json": (Action.RESERVE, (), ASK),
        "control-unreserve.json": (Action.UNRESERVE, (), Unreserve("deadline")),
        "control-hold.json": (Action.HOLD, (7,), None),
        "control-drain.json": (Action.DRAIN, (0, 1), None),
    }
    for old in OLD_SPOOL.glob("control-*.json"):  # the same bytes from today's writer, typed values in
        request = read[old.name]
        assert isinstance(request, spool.ControlRequest)
        written = outbox.write_control(state, request.action, list(request.ids), request.values)
        assert Path(written).read_bytes() == old.read_bytes()


def test_a_time_limit_written_by_hand_as_a_duration_reads_as_seconds(state: StateDir) -> None:
    request = _control(state, "update", {"time_limit": "2h"})
    assert isinstance(request, spool.ControlRequest) and request.values == Update(time_limit=7200.0)


@pytest.mark.parametrize(
    "action, values, said",
    [
        ("update", {}, "updates nothing; gpuq update changes only priority and time_limit"),
        ("update", {"gpus": 4}, "updates 'gpus'; gpuq update changes only priority and time_limit"),
        ("update", {"priority": None}, "updates nothing; gpuq update changes only priority and time_limit"),
        ("update", {"priority": 1.5}, "updates priority to something that is not a whole number"),
        ("update", {"priority": True}, "updates priority to something that is not a whole number"),
        ("update", {"time_limit": [1]}, "updates time_limit to something that is not a duration"),
        ("update", {"priority": 10**9}, "--priority 1000000000: give a number from"),
        ("update", {"time_limit": -1}, "--time -1s: give a positive duration of at most"),
        ("hold", {"priority": 1}, "gives values to hold, which takes none"),
        ("drain", {"x": 1}, "gives values to drain, which takes none"),
        ("reserve", {**ASK.to_json(), "admin": True}, "gives 'admin' to reserve, which takes token"),
        ("reserve", {**ASK.to_json(), "token": "zz"}, "gives reserve a token that is not 32 hex digits"),
        ("reserve", {**ASK.to_json(), "gpus": 0}, "--gpus takes a number of GPUs from 1 to 1023"),
        ("reserve", {**ASK.to_json(), "end": START}, "--duration must be more than zero, like 3h"),
        ("unreserve", {"name": 3}, "gives unreserve something other than a reservation's name"),
        ("unreserve", {"name": "../x"}, "reservation name '../x': use 1-64 letters"),
    ],
)
def test_values_that_break_the_rules_set_the_request_aside_in_one_line(
    state: StateDir, action: str, values: dict[str, Any], said: str
) -> None:
    request = _control(state, action, values, ids=[] if action in ("reserve", "unreserve") else None)
    assert isinstance(request, spool.BadRequest), request
    assert request.reason.startswith(said) and "\n" not in request.reason, request.reason


def test_a_reservation_request_that_names_jobs_is_set_aside_before_its_values_are_read(state: StateDir) -> None:
    request = _control(state, "unreserve", {"name": 3}, ids=[7])
    assert (
        isinstance(request, spool.BadRequest) and request.reason == "names jobs or GPUs in unreserve, which takes none"
    )


def test_each_action_that_carries_values_has_one_type_and_the_rest_carry_none() -> None:
    assert set(CARRIES) == {Action.UPDATE} | {a for a in Action if a.on_reservations}
    for action in Action:
        if action not in CARRIES:
            assert action_values.read(action, {}) is None
    with pytest.raises(BadInput):
        action_values.read(Action.UPDATE, {})


def test_values_asked_as_another_type_are_a_bug_said_as_one(state: StateDir) -> None:
    request = spool.read_request(outbox.write_control(state, Action.UPDATE, [7], Update(priority=1)))
    assert isinstance(request, spool.ControlRequest)
    with pytest.raises(TypeError, match="this update request carries Update, not Ask"):
        request.values_as(Ask)


def test_the_daemon_applies_an_update_from_its_typed_values_and_journals_them(gpuq: Gpuq) -> None:
    """`gpuq update` through the real daemon, and an update an older client left with its time limit as a duration:
    each applied from the values the spool typed, and journalled as the request's JSON has always laid them."""
    go = gpuq.cwd / "go"
    blocker = gpuq.submit("--gpus", "4", "sh", "-c", 'while [ ! -e "$1" ]; do sleep 0.02; done', "sh", str(go))
    gpuq.wait_state(blocker, "running")  # before the update: a priority of 5 would put it ahead of the blocker
    waiting = gpuq.submit("--gpus", "4", "true")
    gpuq.run("update", str(waiting), "--priority", "5", "--time", "10m")
    wait_for(lambda: (gpuq.job(waiting)["priority"], gpuq.job(waiting)["time_limit"]) == (5, 600.0), 30, "the update")
    state = StateDir(gpuq.home)
    body = {"schema": 1, "kind": "control", "action": "update", "ids": [waiting], "values": {"time_limit": "2h"}}
    write_atomic(state.control_request("b" * 32), json.dumps(body).encode())
    outbox.poke(state)
    wait_for(lambda: gpuq.job(waiting)["time_limit"] == 7200.0, 30, "the hand-written update")
    assert gpuq.job(waiting)["priority"] == 5  # left as it was: the request did not name it
    updates = [e for e in journal.read(gpuq.home / "events.jsonl", [Kind.UPDATE]) if isinstance(e, Asked)]
    assert [(e.job, dict(e.values)) for e in updates] == [
        (waiting, {"priority": 5, "time_limit": 600.0}),
        (waiting, {"time_limit": 7200.0}),
    ]
    go.touch()
    gpuq.run("wait", str(blocker), str(waiting))
