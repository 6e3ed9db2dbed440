"""What the readers say of reservations (``reservations.json``, ``jobs.store.calendar``): one line of those
on now or to come for `gpuq status`, its owner's notes (work that will still be on its GPUs at the start, a
reservation released early and why), and the plain data `gpuq top` and the dashboard draw."""

from __future__ import annotations

import time

from gpuq_scheduler.jobs.reservations import Reservation, clock, gpu_list
from gpuq_scheduler.jobs.store import calendar
from gpuq_scheduler.jobs.store.statedir import StateDir

RECENT = 86400.0  # an early end is news for a day


def current(state: StateDir, now: float) -> list[Reservation]:
    """The reservations on now or to come, soonest first."""
    found = [r for r in calendar.read(state).reservations if not r.over(now)]
    return sorted(found, key=lambda r: (r.start, r.name))


def words(r: Reservation, now: float) -> str:
    """'deadline (alice, GPUs 0-3) on until 12:00' or '... from tomorrow 09:00 to 12:00'."""
    gpus = f"GPU{'s' if len(r.gpus) > 1 else ''} {gpu_list(r.gpus)}"
    when = f"on until {clock(r.end, now)}" if r.active(now) else f"from {clock(r.start, now)} to {clock(r.end, now)}"
    return f"{r.name} ({r.user}, {gpus}) {when}"


def status_line(state: StateDir, now: float | None = None) -> str | None:
    """`gpuq status`'s line of reservations, or None when there are none."""
    now = time.time() if now is None else now
    found = current(state, now)
    return ("reservations: " + "; ".join(words(r, now) for r in found)) if found else None


def notes(state: StateDir, uid: int, now: float | None = None) -> list[str]:
    """What the owner ``uid`` must read about their reservations."""
    now = time.time() if now is None else now
    said: list[str] = []
    for r in calendar.read(state).reservations:
        if r.uid != uid:
            continue
        if r.ended and now - (r.ended_at or now) < RECENT:
            said.append(f"your reservation {r.name} ended at {clock(r.ended_at or now, now)}: {r.ended}")
        elif not r.over(now):
            said.extend(f"your reservation {r.name}: {line}" for line in r.said)
    return said


def outside_lines(state: StateDir) -> list[str]:
    """Who holds GPU memory outside gpuq, as the daemon last saw it (``jobs.store.outside``)."""
    from gpuq_scheduler.jobs.store import outside
    from gpuq_scheduler.launcher.gpus.holders import Holder, lines

    found = []
    for entry in outside.read(state):
        try:
            found.append(Holder.from_json(entry))
        except (KeyError, TypeError, ValueError):
            continue
    return lines(found)
