"""Reservations, the daemon's side: requests to reserve and cancel, and once a pass, what their times ask.

The rules are pure (``launcher.policy.reserved``); here the daemon applies them:

* **Requests** (``request``): `gpuq reserve` and `gpuq reserve --cancel` travel through the spool as control
  requests (``reserve``, ``unreserve``); the requester is the file's owner. Only an admin reserves for
  another user or cancels another's reservation; a user's reservations still ahead count against the
  shared queue's ``reservation_quota`` (GPU-hours). The daemon picks the GPUs, writes ``reservations.json``
  (its only writer), and answers a refusal there under the request's token.
* **Each pass** (``step``, before suspends advance and placement looks): a reservation whose end passed is
  dropped and its victims resume; an unused one is released after the idle time (its owner reads why in
  `gpuq status`); at the start, the preemptible jobs on its GPUs are suspended as preemption suspends them
  (``daemon.suspension.suspending``; requeued where they cannot be, ``preempting.requeue``), their pause files naming
  the reservation, so a restarted daemon knows whose they are; work that cannot step aside is said ahead.
* **Placement** (``fence``) and the wake-up (``next_change``) read the calendar in memory.
"""

from __future__ import annotations

import logging
import pwd
import time
from collections.abc import Mapping

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.accounts import user_name
from gpuq_scheduler.jobs.config import Shared
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.options import RESERVATION as RESERVE_OPTION
from gpuq_scheduler.jobs.outcome import JobState, in_host_memory
from gpuq_scheduler.jobs.reservations import Ask, Reservation, Unreserve, clock, gpu_list
from gpuq_scheduler.jobs.store import calendar, spool
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.store.events import (
    Event,
    Kind,
    Preempted,
    Refused,
    ReservationEnded,
    ReservationWarning,
    Reserved,
)
from gpuq_scheduler.jobs.units import format_duration, parse_duration
from gpuq_scheduler.launcher.daemon import handoff, preempting
from gpuq_scheduler.launcher.daemon.lives import Running
from gpuq_scheduler.launcher.daemon.owned import Booked
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.daemon.suspension import pausefiles, suspending
from gpuq_scheduler.launcher.policy import reserved as rules
from gpuq_scheduler.launcher.policy.placement import Holding, Request

log = logging.getLogger("gpuq.reserve")

LOOK_EVERY = 2.0  # seconds between looks for work a reservation's owner must hear of


def settings(shared: Shared | None, environ: Mapping[str, str]) -> tuple[float | None, float | None]:
    """(idle time, quota in GPU-hours): a shared queue's [shared] reservation_idle and reservation_quota; a
    personal queue's GPUQ_RESERVATION_IDLE (default 1h, "off": never released), no quota."""
    if shared is not None:
        return shared.reservation_idle, shared.reservation_quota
    idle = environ.get("GPUQ_RESERVATION_IDLE", "1h")
    try:
        return (None if idle == "off" else parse_duration(idle)), None
    except BadInput as err:
        raise BadInput(f"GPUQ_RESERVATION_IDLE={idle!r}: {err} (or off)") from None


FIELD = RESERVE_OPTION.field


def reservation_of(record: JobRecord) -> str:
    """The reservation the job runs in (--reservation), or "". Read from the spec's kept options directly:
    placement asks it of every pending job, and ``spec.value`` cost 0.3 us a job more (10,000 in a pass)."""
    return str(record.spec.options.get(FIELD) or "")


def request(scheduler: SchedulerState, request: spool.ControlRequest, now: float, events: list[Event]) -> None:
    """A `gpuq reserve` (``reserve``) or `gpuq reserve --cancel` (``unreserve``)."""
    if request.action is Action.UNRESERVE:
        _cancel(scheduler, request.uid, request.values_as(Unreserve).name, now, events)
        return
    ask = request.values_as(Ask)
    book = scheduler.booked
    if not scheduler.last_snapshot:  # a request read before the daemon's first look at the GPUs
        scheduler.snapshot()
    why = _refusal(scheduler, request.uid, ask.user, ask.gpus, ask.start, ask.end, ask.name, now)
    gpus: tuple[int, ...] | None = ()
    owner = ask.user or user_name(request.uid)
    if not why:
        present = [g.index for g in scheduler.last_snapshot if not g.lost and g.index not in scheduler.drained]
        gpus = rules.choose_gpus(ask.gpus, present, book.calendar.reservations, _work(scheduler), ask.start, ask.end)
        if gpus is None:
            free = rules.free_gpus(present, book.calendar.reservations, ask.start, ask.end)
            why = (
                f"only {len(free)} GPU(s) are free of other reservations from {clock(ask.start, now)} to "
                f"{clock(ask.end, now)}; `gpuq reserve --list` shows them"
            )
    if why or gpus is None:
        log.warning("refused a reservation from %s: %s", user_name(request.uid), why)
        book.calendar.refused.append({"token": ask.token, "uid": request.uid, "why": why, "t": now})
        events.append(Refused(now, Kind.RESERVE_REFUSED, user_name(request.uid), why=why))
        _save(scheduler)
        return
    uid = request.uid if not ask.user else pwd.getpwnam(ask.user).pw_uid
    name = ask.name or _fresh_name(scheduler, owner)
    made = Reservation(name, owner, uid, gpus, ask.start, ask.end, now, ask.token)
    made = made.but(said=tuple(rules.conflicts(made, _work(scheduler), _present(scheduler), now)))
    book.calendar.reservations.append(made)
    by = user_name(request.uid)
    events.append(Reserved(now, name, owner, tuple(gpus), ask.start, ask.end, by, made.said))
    log.info("reserved GPU(s) %s for %s as %s", gpu_list(gpus), owner, name)
    for job_id in list(scheduler.staged):  # staged behind a running job, one may start past its start: back
        handoff.withdraw(scheduler, job_id)
    scheduler.changes.mark()
    _save(scheduler)


def _refusal(
    scheduler: SchedulerState, uid: int, user: str, gpus: int, start: float, end: float, name: str, now: float
) -> str:
    """Why this reserve request is refused ("" if it is not)."""
    admin = accounts.may_act(uid, -1, scheduler.admins, scheduler.state.owner())
    if user and user != user_name(uid) and not admin:
        return "only an admin reserves GPUs for another user"
    if user:
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"no user {user!r} on this machine"
    if end <= now:
        return "it would be over before it starts"
    if name and scheduler.booked.calendar.named(name) is not None:
        return f"a reservation named {name} exists; pick another --name"
    present = [g.index for g in scheduler.last_snapshot if not g.lost]
    if gpus > len(present):
        return f"this machine has {len(present)} usable GPU(s); --gpus {gpus} cannot be reserved"
    quota = scheduler.booked.quota
    owner = user or user_name(uid)
    if quota is not None and not admin:
        held = sum(r.gpu_hours for r in scheduler.booked.calendar.reservations if r.user == owner and not r.over(now))
        asked = gpus * (end - start) / 3600.0
        if held + asked > quota:
            return (
                f"{owner} would hold {held + asked:.1f} GPU-hours reserved ahead; this queue allows {quota:g} "
                "(reservation_quota): shorten it or cancel another"
            )
    return ""


def _cancel(scheduler: SchedulerState, uid: int, name: str, now: float, events: list[Event]) -> None:
    found = scheduler.booked.calendar.named(name)
    who = user_name(uid)
    if found is None:
        events.append(Refused(now, Kind.UNRESERVE_REFUSED, who, why="no such reservation", name=name))
        return
    if not accounts.may_act(uid, found.uid, scheduler.admins, scheduler.state.owner()):
        log.warning("refused cancel of reservation %s (owner %s) from %s", name, found.user, who)
        events.append(Refused(now, Kind.UNRESERVE_REFUSED, who, name=name))
        return
    _end(scheduler, found, f"cancelled by {who}", now, events)


def _end(scheduler: SchedulerState, reservation: Reservation, why: str, now: float, events: list[Event]) -> None:
    """It ends early (cancelled, released unused) or on time; its victims resume once their GPUs are free."""
    book = scheduler.booked
    book.calendar.reservations = [r for r in book.calendar.reservations if r is not reservation]
    if why:  # kept a day, so its owner reads why in `gpuq status`
        book.calendar.reservations.append(reservation.but(ended=why, ended_at=now))
    for job_id, marks in scheduler.lives.marked():
        if marks.victim_of == reservation.name:
            marks.victim_of = None
            pausefiles.forget_reservation(scheduler.state, job_id)
            marks.returning = True  # its place is kept until it resumes (``holdings``)
            if job_id in scheduler.suspended:  # before suspends advance: it resumes in this very pass
                marks.resume_wanted = marks.resume_wanted or "gpuq"
    events.append(ReservationEnded(now, reservation.name, why or "its time is up"))
    log.info("reservation %s ended: %s", reservation.name, why or "its time is up")
    scheduler.changes.mark()
    _save(scheduler)


def step(scheduler: SchedulerState, now: float) -> None:
    """Once a pass: ends, idle releases, victims at a start, what owners must hear ahead."""
    book = scheduler.booked
    events = scheduler.journal
    for reservation in list(book.calendar.reservations):
        if reservation.ended and now - (reservation.ended_at or now) > calendar.KEEP_ENDED:
            book.calendar.reservations.remove(reservation)
            book.dirty = True
        elif not reservation.ended and now >= reservation.end:
            _end(scheduler, reservation, "", now, events)
    busy = {reservation_of(job.record) for job in scheduler.running.values() if reservation_of(job.record)}
    for reservation in list(book.calendar.reservations):
        if reservation.name in busy and reservation.active(now):
            if reservation.used_at is None or now - reservation.used_at > 60:  # written a minute apart at most
                _replace(book, reservation, reservation.but(used_at=now))
        elif rules.idle(reservation, now, reservation.name in busy, book.idle):
            idle = book.idle or 0.0
            _end(scheduler, reservation, f"released: no job ran in it for {format_duration(idle)}", now, events)
    _move_victims(scheduler, now, events)
    if now >= book.next_look:
        book.next_look = now + LOOK_EVERY
        _say_ahead(scheduler, now, events)
    if book.dirty:
        _save(scheduler)


def _move_victims(scheduler: SchedulerState, now: float, events: list[Event]) -> None:
    """At (and after) a start: suspend the preemptible jobs still on its GPUs, or requeue them."""
    book = scheduler.booked
    for job_id, marks in scheduler.lives.marked():  # a victim whose suspend was undone (a restart) or failed
        job = scheduler.running.get(job_id)
        name = marks.victim_of
        if name is None or job is None or job_id in scheduler.acting or job_id in scheduler.stopped_for:
            continue  # not a victim, or one suspended, being suspended or stopped
        marks.victim_of = None
        pausefiles.forget_reservation(scheduler.state, job_id)
        if marks.undone:  # the second time: requeued instead, as preemption does
            preempting.requeue(scheduler, job, name, "its suspend for the reservation failed twice", now)
        marks.undone = True  # the first: suspended again below
    for work, reservation in rules.victims(book.calendar.reservations, _work(scheduler), now):
        job = scheduler.running.get(work.job_id)
        if job is None or work.job_id in scheduler.acting or work.job_id in scheduler.stopped_for:
            continue  # being suspended or stopped already (a requeued one too)
        why = f"reserved for {reservation.user} until {clock(reservation.end, now)}"
        if suspending.refusal(scheduler, job):
            preempting.requeue(scheduler, job, reservation.name, why, now)
            continue
        scheduler.lives.marks(work.job_id).victim_of = reservation.name
        pausefiles.note_reservation(scheduler.state, work.job_id, reservation.name)
        suspending.begin_suspend(scheduler, job, f"reservation {reservation.name}", now)
        events.append(Preempted(now, work.job_id, why, reservation=reservation.name))
        log.info("suspending job %d for reservation %s", work.job_id, reservation.name)


def label(scheduler: SchedulerState, now: float) -> None:
    """Once suspends have settled in this pass: a victim suspended says for which reservation, until when (in
    the same transaction as its state, so no reader sees one without the other)."""
    book = scheduler.booked
    marked = scheduler.lives.marked()
    for job_id, marks in marked:  # one still suspending when its reservation ended: resumes once suspended
        if not marks.returning or job_id in scheduler.acting:
            continue
        if job_id in scheduler.suspended:
            marks.resume_wanted = marks.resume_wanted or "gpuq"
        else:
            marks.returning = False  # running again (resumed, or its suspend undone)
    for job_id, marks in marked:
        name = marks.victim_of
        job = scheduler.suspended.get(job_id)
        if name is None:
            continue
        found = book.calendar.named(name)
        if job is None or found is None or job.record.reason.startswith("suspended for reservation"):
            continue
        until = clock(found.end, now)
        reason = f"suspended for reservation {name} ({found.user}, until {until}); "
        reason += in_host_memory(job.record.host_bytes or 0)
        scheduler.table.set_reasons({job_id: reason}, state=JobState.SUSPENDED)
        job.record = job.record.replace(reason=reason)


def _say_ahead(scheduler: SchedulerState, now: float, events: list[Event]) -> None:
    """Work that will still be on a reservation's GPUs at its start, or a GPU of it gone: its owner is told
    (its `said`, shown with it, and a journal event) as soon as that is known, not at the start."""
    book = scheduler.booked
    work, present = _work(scheduler), _present(scheduler)
    for reservation in list(book.calendar.reservations):
        if reservation.ended:
            continue
        said = tuple(rules.conflicts(reservation, work, present, now))
        if said != reservation.said:
            new = [line for line in said if line not in reservation.said]
            if new:
                events.append(ReservationWarning(now, reservation.name, reservation.user, tuple(new)))
            _replace(book, reservation, reservation.but(said=said))


def fence(
    scheduler: SchedulerState, requests: list[Request], now: float, gpus: list[int]
) -> tuple[list[Request], dict[int, str], dict[int, str]]:
    """Placement's requests narrowed by the reservations (``rules.fence``)."""
    found = scheduler.booked.calendar.reservations
    named = {r.id: name for r in scheduler.pending.values() if (name := r.spec.options.get(FIELD))}
    if not named and not rules.live(found, now):
        return requests, {}, {}
    pending = scheduler.pending

    def preemptible(job_id: int) -> bool:
        record = pending.get(job_id)
        return record is not None and record.spec.preemptible

    return rules.fence(requests, found, now, gpus, lambda job_id: named.get(job_id, ""), preemptible)


def holdings(scheduler: SchedulerState) -> list[Holding]:
    """Placement's view of the places kept for the victims of a reservation that is over, until they resume:
    nothing placed meanwhile takes the room they resume into."""
    return [
        Holding(job_id, job.record.gpus, job.record.spec.mem_per_gpu, None)
        for job_id, marks in scheduler.lives.marked()
        if marks.returning and (job := scheduler.suspended.get(job_id)) is not None
    ]


def next_change(scheduler: SchedulerState, now: float) -> float:
    return rules.next_change(scheduler.booked.calendar.reservations, now)


def live(scheduler: SchedulerState, now: float) -> bool:
    """Whether a reservation is on or to come."""
    return bool(rules.live(scheduler.booked.calendar.reservations, now))


def phase(scheduler: SchedulerState, now: float) -> object:
    """What placement's answer depends on in the calendar (its skip key): which are on, and the calendar."""
    return len(scheduler.booked.calendar.reservations), rules.phase(scheduler.booked.calendar.reservations, now)


def recover(scheduler: SchedulerState) -> None:
    """At start-up: the suspended jobs an earlier daemon suspended for a reservation (their pause files say
    which) wait for it to be over; those whose reservation is over resume."""
    book = scheduler.booked
    now = time.time()
    for job_id in list(scheduler.suspended) + list(scheduler.running):
        name = pausefiles.read(scheduler.state, job_id).get(pausefiles.RESERVATION)
        if not isinstance(name, str):
            continue
        found = book.calendar.named(name)
        marks = scheduler.lives.marks(job_id)
        if found is not None and not found.over(now):
            marks.victim_of = name
        else:
            pausefiles.forget_reservation(scheduler.state, job_id)
            marks.returning = True
            if job_id in scheduler.suspended:
                marks.resume_wanted = marks.resume_wanted or "gpuq"


def _work(scheduler: SchedulerState) -> list[rules.Work]:
    return [_as_work(job) for job in scheduler.running.values() if job.record.gpus]


def _as_work(job: Running) -> rules.Work:
    record = job.record
    limit, started = record.spec.time_limit, record.started_at
    ends = None if limit is None or started is None else started + limit + record.suspended_for
    return rules.Work(record.id, record.gpus, record.user, record.spec.preemptible, ends, reservation_of(record))


def _present(scheduler: SchedulerState) -> list[int]:
    return [g.index for g in scheduler.last_snapshot if not g.lost]


def _fresh_name(scheduler: SchedulerState, owner: str) -> str:
    taken = {r.name for r in scheduler.booked.calendar.reservations}
    n = 1
    while f"{owner}-{n}" in taken:
        n += 1
    return f"{owner}-{n}"


def _replace(book: Booked, old: Reservation, new: Reservation) -> None:
    book.calendar.reservations = [new if r is old else r for r in book.calendar.reservations]
    book.dirty = True


def _save(scheduler: SchedulerState) -> None:
    """Written at once: a request is answered only once, so what it made must be on disk before its spool
    file goes (ingest commits, then removes it)."""
    book = scheduler.booked
    book.dirty = False
    calendar.write(scheduler.state, book.calendar)
