"""Ingest: turn the spool's requests into table rows, in one transaction, and only then delete them.

Submits become pending jobs (or fail at once when they can never run here); cancels and controls are
applied (``launcher.daemon.requests``); files that are not requests are set aside with a note. In a shared
queue a submit's private part (command, cwd, environment) is written for its owner first, and the
per-user limit on queued jobs is enforced here, where no client can get around it. A shared queue's submits
get their ids here (``_number``) and their clients learn them once they are on disk (``answer``).

A request counts only for the user who wrote it (its file's owner, as the kernel says): a token already
given to another user's job is set aside, and nothing stored for a job that exists is written again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from typing import Protocol

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.accounts import user_name
from gpuq_scheduler.jobs.config import Shared
from gpuq_scheduler.jobs.errors import BadInput, StateDirError
from gpuq_scheduler.jobs.model import ArrayInfo, JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import Outcome
from gpuq_scheduler.jobs.store import notices, outbox, spool
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.events import Event, Rejected, Submitted
from gpuq_scheduler.jobs.store.private import PrivateSpecs
from gpuq_scheduler.jobs.store.queue import expand
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.jobs.submission import Inventory
from gpuq_scheduler.jobs.units import format_duration
from gpuq_scheduler.launcher.daemon import endings, requests
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.policy import hostlimits

log = logging.getLogger("gpuq.intake")

ANSWERS_KEPT = 3600.0  # seconds an answer waits for its client (who reads it within a second, or is gone)


class Answering(Protocol):
    """What answering a shared queue's clients asks of the state: its directory, the table (the tokens it
    keeps), and when answers/ was last pruned (monotonic)."""

    @property
    def state(self) -> StateDir: ...

    @property
    def table(self) -> JobTable: ...

    answers_pruned: float


def ingest(scheduler: SchedulerState, now: float, found: list[spool.Request] | None = None) -> None:
    """``found``: these requests (``launcher.daemon.isolation`` passes them one at a time), else the spool's.
    It takes the whole state: what it ingests is ended (``endings.finish``), cancelled or controlled
    (``requests``) there, steps that take the state whole, and a shared queue's ids are given from it."""
    state, shared, table = scheduler.state, scheduler.shared, scheduler.table
    found = spool.scan(state)[0] if found is None else found
    if not found:
        return
    events: list[Event] = []
    submits = [r for r in found if isinstance(r, spool.SubmitRequest)]
    named: list[tuple[str, int, int, float]] = []
    if shared is not None:
        submits, named = _number(scheduler, shared, [_with_default_time(shared, r) for r in submits], now, events)
    else:
        for request in [r for r in submits if r.token is not None]:
            reason = "is named by a token, as a shared queue's submits are; this personal queue's carry their ids"
            set_aside(state, spool.BadRequest(request.path, reason), now, events, answer=False)
        submits = [r for r in submits if r.token is None]
    if submits and shared is None:  # one query for all: ids already in the table are rare (a crash)
        taken = table.owners([r.job_id for r in submits])
        submits = [r for r in submits if r.job_id not in taken or not _clashes(table, state, r, now, events)]
    if scheduler.private is not None:
        given = {job_id for _, _, job_id, _ in named}
        for submit in submits:
            if submit.job_id in given:  # not a re-send of a job given its id before: its file stays as written
                _keep_private(scheduler.private, submit)
    submits = [_with_default_time(shared, r) for r in submits]
    fresh = [record for r in submits for record in expand(state, r)]
    arrays = [
        ArrayInfo(
            r.job_id,
            r.uid,
            user_name(r.uid),
            r.spec.display_name,
            len(r.array.indices),
            r.array.throttle,
            r.spec.env,
            r.spec.notify,
            r.submitted_at,
        )
        for r in submits
        if r.array is not None
    ]
    # Not fsynced here: the requests stay in the spool until the tick has sent its launches and synced the
    # table (``Scheduler.tick``), so a job submitted to an idle queue starts without waiting on the disk.
    inserted = set(table.insert_pending(fresh, arrays, durable=False, intake=named))
    for info in arrays:
        # Not its environment: the table has it, and the daemon's memory stays bounded by what placement
        # reads (an environment is kilobytes an array).
        scheduler.arrays.setdefault(info.id, dataclasses.replace(info, env={}))
    inventory = scheduler.inventory()
    for record in fresh:
        if record.id not in inserted:
            continue  # ingested before a crash that left its request behind
        events.append(Submitted(now, record.id, record.user))
        problem = _impossible(record, inventory)  # the caps, only a shared queue's, were checked in ``_number``
        if problem:
            endings.finish(scheduler, record, Outcome.rejected(problem), now, events)
        else:
            scheduler.lives.add(record)
    scheduler.ingested.extend(submits)
    for other in found:
        if isinstance(other, spool.CancelRequest):
            requests.cancel(scheduler, other, now, events)
            scheduler.ingested.append(other)  # removed once committed: a rolled-back cancel is read again
        elif isinstance(other, spool.ControlRequest):
            requests.control(scheduler, other, now, events)
            scheduler.ingested.append(other)
        elif isinstance(other, spool.BadRequest):
            set_aside(state, other, now, events, answer=shared is not None)
    scheduler.journal.extend(events)


def _number(
    scheduler: SchedulerState,
    shared: Shared,
    submits: list[spool.SubmitRequest],
    now: float,
    events: list[Event],
) -> tuple[list[spool.SubmitRequest], list[tuple[str, int, int, float]]]:
    """Give a shared queue's submits their ids: (the requests with their ids, (token, uid, id, now) of those
    given one now). A request its user sent again (read before a crash) keeps the id it was given then
    (``JobTable.intake_ids``). Set aside, their writers told: one that names its own id (a file written by
    hand: ids are the daemon's to give); one named by a token that another user's job was given (a request
    counts only for its writer); one its user's caps refuse (no row, no id: its client prints why). The state
    gives the ids (``next_id``) and knows the jobs each user has queued (``max_queued_per_user``)."""
    state = scheduler.state
    numbered: list[spool.SubmitRequest] = []
    for request in submits:
        if request.token is None:
            reason = "names its own job id; a shared queue's daemon gives ids: submit with `gpuq submit`"
            set_aside(state, spool.BadRequest(request.path, reason), now, events, answer=True)
        else:
            numbered.append(request)
    known = scheduler.table.intake_ids([r.token for r in numbered if r.token is not None])
    given: list[tuple[str, int, int, float]] = []
    out: list[spool.SubmitRequest] = []
    queued = _queued_by_user(shared.max_queued_per_user, scheduler.lives.pending)
    for request in sorted(numbered, key=lambda r: (r.submitted_at, r.path)):
        assert request.token is not None
        job_id, writer = known.get(request.token, (None, request.uid))
        if writer != request.uid:
            reason = "is named by a token that another user's job was submitted under; submit with `gpuq submit`"
            set_aside(state, spool.BadRequest(request.path, reason), now, events, answer=False)
            continue
        if job_id is None:
            problem = _request_over_cap(shared, request, queued)
            if problem:
                set_aside(state, spool.BadRequest(request.path, problem), now, events, answer=True)
                continue
            job_id = scheduler.next_id
            scheduler.next_id += 1 + (len(request.array.indices) if request.array else 0)
            given.append((request.token, request.uid, job_id, now))
        out.append(dataclasses.replace(request, job_id=job_id))
    return out, given


def answer(scheduler: Answering, ingested: list[spool.Request]) -> None:
    """Tell each shared queue's client the id its submit got, in ``answers/<token>``: root's directory, which
    nobody can list, so only the client that made the token finds it. Called once the jobs are on disk."""
    for request in ingested:
        if isinstance(request, spool.SubmitRequest) and request.token is not None:
            try:
                write_atomic(
                    scheduler.state.answer(request.token), f"{request.job_id}\n".encode(), durable=False, mode=0o644
                )
            except StateDirError as err:  # its client says the job is queued without an id; nothing is lost
                log.error("%s", err)
    now = time.monotonic()
    if now >= scheduler.answers_pruned + 60.0:
        scheduler.answers_pruned = now
        _prune_answers(scheduler.state, scheduler.table)


def _prune_answers(state: StateDir, table: JobTable) -> None:
    """Answers nobody read (their clients gave up or died), and the record of long-ingested tokens."""
    before = time.time() - ANSWERS_KEPT
    with contextlib.suppress(OSError), os.scandir(state.answers) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_mtime < before:
                    os.unlink(entry.path)
    table.forget_intake(before)


def _clashes(table: JobTable, state: StateDir, request: spool.SubmitRequest, now: float, events: list[Event]) -> bool:
    """A personal queue's submit whose id the table already holds: the same request ingested before a crash
    (no clash), or a *different* job because the id counter was rewound (by hand, or from a backup).
    Dropping that as "already ingested" would lose it silently: it is set aside, saying why, and the counter
    moved past every id."""
    existing = table.get(request.job_id)
    if existing is None or (existing.uid == request.uid and existing.submitted_at == request.submitted_at):
        return False
    reason = (
        f"claims job id {request.job_id}, which job {request.job_id} of {existing.user} already has "
        "(the id counter was rewound); submit it again"
    )
    set_aside(state, spool.BadRequest(request.path, reason), now, events, answer=False)
    outbox.raise_counter(state, table.max_id() + 1)
    return True


def _keep_private(private: PrivateSpecs, submit: spool.SubmitRequest) -> None:
    owner = accounts.account(submit.uid)
    private.write(submit.job_id, submit.spec, submit.uid, owner.gid if owner else submit.uid)


def set_aside(state: StateDir, bad: spool.BadRequest, now: float, events: list[Event], *, answer: bool) -> None:
    """Move a request out of ``state``'s spool, saying why in the log, the journal and to its owner (`gpuq
    status`). ``answer``: and to its client (``answers/<token>``): a shared queue's, whose clients wait there
    for their ids; not where the token is another user's, whose client may still be about to read the id its
    own request got."""
    try:
        owner: int | None = os.lstat(bad.path).st_uid
    except OSError:
        owner = None
    where = spool.set_aside(state, bad)
    name = os.path.basename(bad.path)
    token = spool.token_of(name)
    if token is not None and answer:  # its client waits: say why, not an id
        with contextlib.suppress(StateDirError):
            write_atomic(state.answer(token), outbox.REJECTED_ANSWER + bad.reason.encode(), durable=False, mode=0o644)
    log.warning("set aside %s: it %s (moved to %s)", name, bad.reason, where)
    events.append(Rejected(now, name, bad.reason, owner))
    if owner is not None:
        try:
            notices.set_aside(state, owner, name, bad.reason, now)
        except (OSError, StateDirError) as err:  # a full disk: the log and the journal still say it
            log.warning("cannot tell uid %d that %s was set aside: %s", owner, name, err)


def _queued_by_user(cap: int | None, pending: Mapping[int, JobRecord]) -> dict[str, int]:
    """Each user's pending jobs, counted only where ``cap`` (max_queued_per_user) limits them."""
    if cap is None:
        return {}
    counts: dict[str, int] = {}
    for record in pending.values():
        counts[record.user] = counts.get(record.user, 0) + 1
    return counts


def _with_default_time(shared: Shared | None, submit: spool.SubmitRequest) -> spool.SubmitRequest:
    """A shared queue's default_time for a job submitted without --time."""
    default = shared.default_time if shared else None
    if default is None or submit.spec.time_limit is not None:
        return submit
    return dataclasses.replace(submit, spec=dataclasses.replace(submit.spec, time_limit=default))


def _request_over_cap(shared: Shared, request: spool.SubmitRequest, queued: dict[str, int]) -> str:
    """Why a shared queue's new submit is refused by its user's caps ("" if it is not), counting it in
    ``queued`` when it is not: an array is one request, taken whole or refused whole. Refused before it
    has an id, it becomes no row: a flood over the cap costs a rename and a note each, and its client
    prints why (a personal queue, whose client prints the id first, has no caps)."""
    user = user_name(request.uid)
    members = len(request.array.indices) if request.array is not None else 1
    problem = _spec_over_cap(shared, request.spec)
    cap = shared.max_queued_per_user
    if not problem and cap is not None and queued.get(user, 0) + members > cap:
        problem = f"user cap: {user} already has {queued.get(user, 0)} jobs queued (max_queued_per_user = {cap})"
        if members > 1:
            problem += f"; this array adds {members}"
    if not problem:
        queued[user] = queued.get(user, 0) + members
    return problem


def _spec_over_cap(shared: Shared, spec: JobSpec) -> str:
    if too_many := hostlimits.over_cap(spec, shared.max_pids):
        return f"user cap: {too_many}"
    longest = shared.max_time
    limit = spec.time_limit
    if longest is not None and limit is not None and limit > longest:
        allowed = format_duration(longest)
        return f"user cap: --time {format_duration(limit)} is longer than this queue allows ({allowed}, max_time)"
    most = shared.max_gpus_per_user
    if most is not None and spec.gpus > most:
        return (
            f"user cap: a user may hold at most {most} GPUs at once (max_gpus_per_user); this job asks for {spec.gpus}"
        )
    return ""


def _impossible(record: JobRecord, inventory: Inventory | None) -> str:
    """Why a job can never run on this machine ("" if it can): it fails at once instead of waiting forever."""
    if inventory is None:
        return ""
    try:
        inventory.check(record.spec)
    except BadInput as err:  # the same words the submitting client would have printed
        return str(err)
    return ""
