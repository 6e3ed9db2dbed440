"""Reservations, the pure rules (no I/O, no clock: ``now`` is given). The daemon's side is
``launcher.daemon.reserving``; what a reservation is, ``jobs.reservations``.

* **Before the start** (``fence``): a job may be placed on a reservation's GPUs only if it will be off them
  by the start: its time limit ends before it (backfill), or it is ``--preemptible`` (it steps aside at the
  start). Another waits, told why: "GPUs 0-3 are reserved for alice from 09:00".
* **During it**: only the owner's jobs that name it (``--reservation NAME``) run on its GPUs, and they run
  only there. Everyone else's jobs are placed on the other GPUs.
* **At the start** (``victims``): a job on its GPUs that is not in it steps aside: the daemon suspends a
  preemptible one (or requeues it where it cannot be suspended). A job that is not preemptible stays until it
  ends; its owner was told ahead (``conflicts``), at reserve time and whenever such work appears.
* **Unused** (``idle``): a reservation no job of which ran for the admin's idle time is released.
* **Choice of GPUs** (``choose_gpus``): GPUs free of other reservations over the window, those whose work is
  gone by the start (or steps aside) first, then the lowest numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpuq_scheduler.jobs.reservations import Reservation, clock, gpu_list
from gpuq_scheduler.launcher.policy.placement import Request


@dataclass(frozen=True)
class Work:
    """A running job, as the reservation rules see it."""

    job_id: int
    gpus: tuple[int, ...]
    user: str
    preemptible: bool = False
    ends_by: float | None = None  # start + time limit (+ time suspended); None: no limit
    reservation: str = ""  # the reservation it runs in (--reservation), if any


def live(reservations: Sequence[Reservation], now: float) -> list[Reservation]:
    """Those that still bear on placement: not ended, not over."""
    return [r for r in reservations if not r.over(now)]


def fence(
    requests: Sequence[Request],
    reservations: Sequence[Reservation],
    now: float,
    gpus: Sequence[int],
    reservation_of: Callable[[int], str],
    preemptible: Callable[[int], bool],
) -> tuple[list[Request], dict[int, str], dict[int, str]]:
    """The requests as placement may place them (``only`` narrowed to the GPUs each may use), the jobs that
    wait because of a reservation whatever the GPUs hold (-> why), and for each narrowed job the words to put
    before its reason should it wait."""
    current = live(reservations, now)
    placeable: list[Request] = []
    waiting: dict[int, str] = {}
    notes: dict[int, str] = {}
    for request in requests:
        name = reservation_of(request.job_id) if request.gpus else ""
        if name:
            allowed, why = _inside(request, name, current, now)
            candidates = [g for g in (request.only or gpus) if g in allowed]
        elif not current or not request.gpus:
            placeable.append(request)
            continue
        else:
            barred, why = _outside(request, current, now, preemptible(request.job_id))
            if not barred:
                placeable.append(request)
                continue
            candidates = [g for g in (request.only or gpus) if g not in barred]
        if len(candidates) < request.gpus:
            waiting[request.job_id] = why
            continue
        placeable.append(replace(request, only=tuple(candidates)))
        if why:
            notes[request.job_id] = why
    return placeable, waiting, notes


def _inside(request: Request, name: str, current: Sequence[Reservation], now: float) -> tuple[set[int], str]:
    """A job that names reservation ``name``: its GPUs while it is on and the job is its owner's; none else."""
    found = next((r for r in current if r.name == name), None)
    if found is None:
        return set(), f"reservation {name} is not known here or has ended (`gpuq reserve --list`)"
    if found.user != request.user:
        return set(), f"reservation {name} is {found.user}'s: only their jobs run in it"
    if found.upcoming(now):
        return set(), f"waiting for reservation {name}, which starts at {clock(found.start, now)}"
    if len(found.gpus) < request.gpus:
        return set(), f"reservation {name} holds {len(found.gpus)} GPU(s); this job needs {request.gpus}"
    return set(found.gpus), ""


def _outside(request: Request, current: Sequence[Reservation], now: float, steps_aside: bool) -> tuple[set[int], str]:
    """A job in no reservation: the GPUs it may not use (reserved now, or from a start it would run past,
    unless it steps aside then), and why."""
    barred: set[int] = set()
    words: list[str] = []
    ends = math.inf if request.time_limit is None else now + request.time_limit
    for reservation in current:
        if reservation.active(now):
            barred |= set(reservation.gpus)
            words.append(f"{_gpus(reservation)} reserved for {reservation.user} until {clock(reservation.end, now)}")
        elif ends > reservation.start and not steps_aside:
            barred |= set(reservation.gpus)
            words.append(f"{_gpus(reservation)} reserved for {reservation.user} from {clock(reservation.start, now)}")
    return barred, "; ".join(words)


def _gpus(reservation: Reservation) -> str:
    many = len(reservation.gpus) > 1
    return f"GPU{'s' if many else ''} {gpu_list(reservation.gpus)} {'are' if many else 'is'}"


def victims(reservations: Sequence[Reservation], running: Sequence[Work], now: float) -> list[tuple[Work, Reservation]]:
    """The running jobs that must step aside now: on an active reservation's GPUs, not in it, preemptible."""
    found = []
    for reservation in reservations:
        if not reservation.active(now):
            continue
        for work in running:
            if set(work.gpus) & set(reservation.gpus) and not _belongs(work, reservation) and work.preemptible:
                found.append((work, reservation))
    return found


def _belongs(work: Work, reservation: Reservation) -> bool:
    return work.reservation == reservation.name and work.user == reservation.user


def conflicts(reservation: Reservation, running: Sequence[Work], present: Sequence[int], now: float) -> list[str]:
    """What its owner must hear ahead of the start: a GPU of it gone, and work that will still be on its
    GPUs at the start and cannot step aside (not preemptible, and no time limit ending before then)."""
    if reservation.over(now):
        return []
    said = [f"GPU {g} is gone from this machine (lost or removed)" for g in reservation.gpus if g not in present]
    at = clock(reservation.start, now)
    for work in running:
        held = sorted(set(work.gpus) & set(reservation.gpus))
        if not held or _belongs(work, reservation) or work.preemptible:
            continue
        if work.ends_by is not None and work.ends_by <= reservation.start:
            continue
        until = "it has no time limit" if work.ends_by is None else f"its time limit ends {clock(work.ends_by, now)}"
        when = "now" if reservation.active(now) else f"at {at}"
        said.append(
            f"job {work.job_id} ({work.user}, not --preemptible) will still hold GPU {gpu_list(tuple(held))} {when}: "
            f"{until}"
        )
    return said


def idle(reservation: Reservation, now: float, busy: bool, limit: float | None) -> bool:
    """Release it now? On, no job of it running, and none ran for ``limit`` seconds (since its start)."""
    if limit is None or busy or not reservation.active(now):
        return False
    return now - max(reservation.start, reservation.used_at or 0.0) >= limit


def choose_gpus(
    count: int,
    gpus: Sequence[int],
    reservations: Sequence[Reservation],
    running: Sequence[Work],
    start: float,
    end: float,
) -> tuple[int, ...] | None:
    """``count`` GPUs free of every other reservation over [start, end), or None if there are not enough.
    Those whose jobs will be gone by the start come first, then those whose jobs step aside, then the rest."""
    free = free_gpus(gpus, reservations, start, end)
    if len(free) < count:
        return None

    def cost(gpu: int) -> tuple[int, int, int]:
        on = [w for w in running if gpu in w.gpus]
        staying = sum(1 for w in on if not w.preemptible and (w.ends_by is None or w.ends_by > start))
        return staying, sum(1 for w in on if w.preemptible), gpu

    return tuple(sorted(sorted(free, key=cost)[:count]))


def free_gpus(gpus: Sequence[int], reservations: Sequence[Reservation], start: float, end: float) -> list[int]:
    """The GPUs no reservation holds at any moment of [start, end)."""
    taken = {g for r in reservations if not r.ended and r.start < end and start < r.end for g in r.gpus}
    return [g for g in gpus if g not in taken]


def next_change(reservations: Sequence[Reservation], now: float) -> float:
    """The next moment a reservation starts or ends (inf if none): the daemon wakes then."""
    return min((t for r in reservations if not r.ended for t in (r.start, r.end) if t > now), default=math.inf)


def phase(reservations: Sequence[Reservation], now: float) -> tuple[tuple[str, bool], ...]:
    """What placement's result depends on besides the jobs and GPUs: which reservations are on now."""
    return tuple((r.name, r.active(now)) for r in live(reservations, now))
