"""What a control request's ``values`` carry, typed: one frozen dataclass per action that carries any (an
update's ``Update``; a reservation's ``Ask`` and ``Unreserve``, from ``jobs.reservations``), each with one writer
(``to_json``, which ``jobs.store.outbox`` puts in the request) and one reader (``from_json``), and ``read``, which
the spool calls to hand the daemon typed values or a one-line BadInput saying what is wrong.

The request's JSON is the one clients have always written: an object of the names below, ``{}`` for an action
that carries nothing, so requests already in a spool read as they did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.reservations import Ask, Unreserve
from gpuq_scheduler.jobs.rules import check_update
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.units import parse_duration

UPDATABLE = ("priority", "time_limit")


@dataclass(frozen=True)
class Update:
    """`gpuq update`'s new values for the pending jobs it names; None leaves that one as it is."""

    priority: int | None = None
    time_limit: float | None = None  # seconds

    def to_json(self) -> dict[str, Any]:
        written: dict[str, Any] = {}
        if self.priority is not None:
            written["priority"] = self.priority
        if self.time_limit is not None:
            written["time_limit"] = self.time_limit
        return written

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Update:
        """By the rules a submit's values follow (``jobs.rules.check_update``). A time limit may be written as
        a duration ("2h"), as a request written by hand once could; it is read as seconds."""
        unknown = sorted(set(data) - set(UPDATABLE))
        if unknown or not data:
            shown = ", ".join(map(repr, unknown))[:80] or "nothing"
            raise BadInput(f"updates {shown}; gpuq update changes only priority and time_limit")
        priority, limit = data.get("priority"), data.get("time_limit")
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
            raise BadInput("updates priority to something that is not a whole number")
        if isinstance(limit, str):
            limit = parse_duration(limit)
        if limit is not None and (not isinstance(limit, (int, float)) or isinstance(limit, bool)):
            raise BadInput("updates time_limit to something that is not a duration")
        if priority is None and limit is None:  # only nulls: it would change nothing
            raise BadInput("updates nothing; gpuq update changes only priority and time_limit")
        seconds = None if limit is None else float(limit)
        check_update(priority, seconds)
        return cls(priority, seconds)


ActionValues = Update | Ask | Unreserve

# The values each action carries; an action not named here carries none (its request's values are {}).
CARRIES: dict[Action, type[Update] | type[Ask] | type[Unreserve]] = {
    Action.UPDATE: Update,
    Action.RESERVE: Ask,
    Action.UNRESERVE: Unreserve,
}


def read(action: Action, data: Mapping[str, Any]) -> ActionValues | None:
    """The values of a request for ``action``, as its type, or BadInput saying what is wrong with them."""
    kind = CARRIES.get(action)
    if kind is None:
        if data:
            raise BadInput(f"gives values to {action}, which takes none")
        return None
    return kind.from_json(data)
