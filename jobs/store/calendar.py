"""``reservations.json``: the queue's reservations, written by the daemon alone (from ``reserve`` and
``unreserve`` requests through the spool), read by everyone (`gpuq reserve --list`, status, top, serve).

One small file, rewritten whole (temp name, fsync, rename) on each change: a queue holds a handful of
reservations, and readers never need the daemon. It also keeps the daemon's answers to refused requests,
by the request's token and its writer's uid, so the client that asked can say why in one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpuq_scheduler.jobs.reservations import SCHEMA, Reservation
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import StateDir

FILE = "reservations.json"
KEEP_REFUSED = 50  # the latest refusals: each client reads its answer within seconds
KEEP_ENDED = 86400.0  # a reservation that ended early stays listed a day, so its owner learns why


@dataclass
class Calendar:
    reservations: list[Reservation] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)  # {"token", "uid", "why", "t"}

    def named(self, name: str) -> Reservation | None:
        return next((r for r in self.reservations if r.name == name and not r.ended), None)

    def answer(self, token: str, uid: int) -> Reservation | str | None:
        """The reservation made from request ``token``, or why it was refused, or None (not read yet)."""
        for reservation in self.reservations:  # a token is 128 random bits: only its writer knows it
            if reservation.token == token:
                return reservation
        for refusal in self.refused:
            if refusal.get("token") == token and refusal.get("uid") == uid:
                return str(refusal.get("why"))
        return None


def read(state: StateDir) -> Calendar:
    """The calendar as last written; empty if there is none (or it cannot be read: nothing is reserved)."""
    try:
        with open(state.at(FILE), "rb") as handle:
            data = json.loads(handle.read(8 << 20))
    except (OSError, ValueError, RecursionError):
        return Calendar()
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return Calendar()
    found = []
    for item in data.get("reservations") or []:
        try:
            found.append(Reservation.from_json(item))
        except (KeyError, TypeError, ValueError):
            continue  # one entry this gpuq cannot read: the others still count
    refused = [r for r in data.get("refused") or [] if isinstance(r, dict)]
    return Calendar(found, refused)


def write(state: StateDir, calendar: Calendar) -> None:
    """The daemon's write (readable by all, as the job table is)."""
    body = {
        "schema": SCHEMA,
        "reservations": [r.to_json() for r in calendar.reservations],
        "refused": calendar.refused[-KEEP_REFUSED:],
    }
    write_atomic(state.at(FILE), json.dumps(body).encode(), mode=0o644)
