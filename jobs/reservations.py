"""What a reservation is (GPUs held for one user over a window of wall-clock time) and how users write one:
the start-time grammar, names, and the checks a reserve request is held to. Pure: no disk, no clock (``now``
and the local time zone come from the caller), so both the client and the daemon use it.

A reservation's window is calendar time (``time.time()``), not a duration: "tomorrow 09:00" is a moment
on the wall clock, as for ``at`` or Slurm's ``scontrol create reservation``.
"""

from __future__ import annotations

import datetime
import string
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.units import parse_duration

SCHEMA = 1
MOST_GPUS = 1024  # as --gpu-ids: no machine has more
LONGEST = 30 * 86400.0  # a reservation's longest window
AHEAD = 366 * 86400.0  # how far ahead one may start
NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")
GRAMMAR = "give HH:MM, 'tomorrow HH:MM', a date and time (2026-12-01 09:00) or +DURATION (+2h)"


@dataclass(frozen=True)
class Reservation:
    """``gpus`` held for ``user`` from ``start`` to ``end`` (wall time). ``said``: what its owner was told
    ahead of time (work that will still be on its GPUs at the start, a GPU gone). ``ended``: why it ended
    early (cancelled, released unused), at ``ended_at``; kept a while so its owner reads it in `gpuq status`."""

    name: str
    user: str
    uid: int
    gpus: tuple[int, ...]
    start: float
    end: float
    created: float = 0.0
    token: str = ""  # the request's: its client finds its answer by it
    used_at: float | None = None  # when a job of it last ran (its idle time counts from then)
    said: tuple[str, ...] = ()
    ended: str = ""
    ended_at: float | None = None

    def active(self, now: float) -> bool:
        return not self.ended and self.start <= now < self.end

    def upcoming(self, now: float) -> bool:
        return not self.ended and now < self.start

    def over(self, now: float) -> bool:
        return bool(self.ended) or now >= self.end

    @property
    def gpu_hours(self) -> float:
        return len(self.gpus) * (self.end - self.start) / 3600.0

    def but(self, **changes: Any) -> Reservation:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "user": self.user,
            "uid": self.uid,
            "gpus": list(self.gpus),
            "start": self.start,
            "end": self.end,
            "created": self.created,
            "token": self.token,
            "used_at": self.used_at,
            "said": list(self.said),
            "ended": self.ended,
            "ended_at": self.ended_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Reservation:
        return cls(
            str(data["name"]),
            str(data["user"]),
            int(data["uid"]),
            tuple(int(g) for g in data["gpus"]),
            float(data["start"]),
            float(data["end"]),
            float(data.get("created") or 0.0),
            str(data.get("token") or ""),
            None if data.get("used_at") is None else float(data["used_at"]),
            tuple(str(s) for s in data.get("said") or ()),
            str(data.get("ended") or ""),
            None if data.get("ended_at") is None else float(data["ended_at"]),
        )


@dataclass(frozen=True)
class Ask:
    """A reserve request's values (the control request ``reserve``; ``jobs.store.action_values``)."""

    token: str
    gpus: int
    start: float
    end: float
    name: str = ""  # "" : the daemon names it (user-N)
    user: str = ""  # "" : the requester

    def to_json(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "gpus": self.gpus,
            "start": self.start,
            "end": self.end,
            "name": self.name,
            "user": self.user,
        }

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> Ask:
        """A reserve request's values, checked whole (the client holds its own to this first); BadInput says
        what is wrong."""
        unknown = sorted(set(values) - {"token", "gpus", "start", "end", "name", "user"})
        if unknown:
            raise BadInput(f"gives {unknown[0]!r} to reserve, which takes token, gpus, start, end, name and user")
        token, gpus = values.get("token"), values.get("gpus")
        name, user = values.get("name", ""), values.get("user", "")
        if not isinstance(token, str) or len(token) != 32 or not set(token) <= set("0123456789abcdef"):
            raise BadInput("gives reserve a token that is not 32 hex digits")
        if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 < gpus < MOST_GPUS:
            raise BadInput(f"--gpus takes a number of GPUs from 1 to {MOST_GPUS - 1}")
        start, end = _time(values.get("start"), "start"), _time(values.get("end"), "end")
        if not isinstance(name, str) or not isinstance(user, str):
            raise BadInput("gives reserve a name or user that is not text")
        check_window(start, end)
        return cls(token, gpus, start, end, check_name(name) if name else "", check_user(user))


@dataclass(frozen=True)
class Unreserve:
    """An unreserve request's values: the reservation to cancel, by name."""

    name: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name}

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> Unreserve:
        if set(values) != {"name"} or not isinstance(values["name"], str):
            raise BadInput("gives unreserve something other than a reservation's name")
        return cls(check_name(values["name"]))


def check_name(name: str) -> str:
    if not name or len(name) > 64 or not set(name) <= NAME_CHARS or name[0] in ".-":
        raise BadInput(f"reservation name {name[:70]!r}: use 1-64 letters, digits, '_', '.' or '-' (not first)")
    return name


def check_user(user: str) -> str:
    if user and (len(user) > 64 or not set(user) <= NAME_CHARS | {"$"}):
        raise BadInput(f"--user {user[:70]!r} is not a user name")
    return user


def check_window(start: float, end: float) -> None:
    if not end > start:
        raise BadInput("--duration must be more than zero, like 3h")
    if end - start > LONGEST:
        raise BadInput(f"--duration is longer than a reservation may be ({LONGEST / 86400:.0f} days)")


def _time(value: Any, what: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1 << 33:
        raise BadInput(f"gives reserve a {what} time no clock gives")
    return float(value)


def parse_start(text: str, now: float, tz: datetime.tzinfo | None = None) -> float:
    """When a reservation starts, from the user's words; ``tz`` is the local zone (None: the system's).

    The whole grammar: ``now``; ``+DURATION`` (``+2h``, ``+90m``); ``HH:MM`` (today; a time that has passed
    today is refused, not moved to tomorrow: say so); ``tomorrow HH:MM``; a date and time, ISO 8601
    (``2026-12-01 09:00``, ``2026-12-01T09:00:00``, an offset like ``+01:00`` allowed). The past is refused.
    """
    words = " ".join(text.split())
    lowered = words.lower()
    if lowered == "now":
        return now
    if lowered.startswith("+"):
        try:
            return now + parse_duration(words[1:])
        except BadInput:
            raise BadInput(f"--start {text!r}: after + give a duration, like +2h or +30m") from None
    local = datetime.datetime.fromtimestamp(now, tz).astimezone(tz)
    if lowered.startswith("tomorrow "):
        clock = _clock(words[len("tomorrow ") :], text)
        day = (local + datetime.timedelta(days=1)).date()
        return _at(day, clock, local.tzinfo)
    if ":" in words and len(words) <= 5 and "-" not in words:
        clock = _clock(words, text)
        when = _at(local.date(), clock, local.tzinfo)
        if when <= now:
            raise BadInput(f"--start {text!r} has passed today; say 'tomorrow {clock[0]:02d}:{clock[1]:02d}'")
        return when
    try:
        moment = datetime.datetime.fromisoformat(words)
    except ValueError:
        raise BadInput(f"cannot read --start {text[:60]!r}: {GRAMMAR}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=local.tzinfo)
    when = moment.timestamp()
    if when < now - 60:
        raise BadInput(f"--start {text!r} is in the past; {GRAMMAR}")
    if when - now > AHEAD:
        raise BadInput(f"--start {text!r} is more than a year ahead")
    return max(when, now)


def _clock(words: str, text: str) -> tuple[int, int]:
    hours, colon, minutes = words.partition(":")
    if not (colon and hours.isdigit() and minutes.isdigit() and len(minutes) == 2 and len(hours) <= 2):
        raise BadInput(f"cannot read --start {text[:60]!r}: {GRAMMAR}")
    if not (int(hours) < 24 and int(minutes) < 60):
        raise BadInput(f"--start {text!r}: no such time of day (00:00 to 23:59)")
    return int(hours), int(minutes)


def _at(day: datetime.date, clock: tuple[int, int], tz: datetime.tzinfo | None) -> float:
    return datetime.datetime(day.year, day.month, day.day, clock[0], clock[1], tzinfo=tz).timestamp()


def gpu_list(gpus: tuple[int, ...]) -> str:
    """0-3 for 0,1,2,3; 0,2 otherwise."""
    if len(gpus) > 2 and list(gpus) == list(range(gpus[0], gpus[0] + len(gpus))):
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(map(str, gpus))


def clock(when: float, now: float) -> str:
    """A moment as people read it beside ``now``: 09:00 today, 'tomorrow 09:00', or 'Dec 01 09:00'."""
    moment, today = datetime.datetime.fromtimestamp(when), datetime.datetime.fromtimestamp(now).date()
    if moment.date() == today:
        return moment.strftime("%H:%M")
    if moment.date() == today + datetime.timedelta(days=1):
        return moment.strftime("tomorrow %H:%M")
    return moment.strftime("%b %d %H:%M")
