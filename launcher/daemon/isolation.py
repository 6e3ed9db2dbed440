"""One user's input never stops the queue (STYLE.md 11): a request or a job that makes a pass fail is set
aside, with its reason, and the pass goes on for everyone else.

``jobs.store.checks`` keeps what it can recognise out of the table; this is the net under it. Ingest runs as
one transaction; if it raises an error that means bad input, it is rolled back and run again one request at
a time, and the request that still raises alone is set aside (its owner reads why in `gpuq status`).
Placement likewise: a pending job that makes planning raise is tried alone, and fails with the reason,
instead of failing every pass. Errors of the machine (a full disk, an unreadable spool) are not input: they
propagate, the pass fails, the daemon says so (``jobs.store.notices``) and keeps every request.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import Outcome
from gpuq_scheduler.jobs.store import spool
from gpuq_scheduler.jobs.store.events import Event
from gpuq_scheduler.jobs.store.statedir import SPOOL, StateDir
from gpuq_scheduler.launcher.daemon import endings, intake
from gpuq_scheduler.launcher.daemon.lives import Lives
from gpuq_scheduler.launcher.daemon.state import SchedulerState

log = logging.getLogger("gpuq.isolation")

# What a value can raise on its way into SQLite or through the policy: the marks of bad input, not of a
# broken machine (OSError, sqlite3.OperationalError) or of a stop (KeyboardInterrupt, SystemExit).
INPUT_ERRORS: tuple[type[BaseException], ...] = (
    ArithmeticError,
    ValueError,
    TypeError,
    LookupError,
    AttributeError,
    RecursionError,
    BadInput,
    sqlite3.InterfaceError,
    sqlite3.DataError,
    sqlite3.IntegrityError,
    sqlite3.ProgrammingError,
)


def describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err)[:200]}"


def ingest(scheduler: SchedulerState, now: float, reload: Callable[[], None]) -> None:
    """``intake.ingest`` over the spool as one transaction, or, if that raises on bad input, one request at
    a time, setting aside each request that raises alone. ``reload``: the scheduler's, to forget in memory
    what a rolled-back attempt did. It takes the whole state for ``intake.ingest``, which does."""
    sweep_leftovers(scheduler.state, now)
    # A shared queue reads a bounded number of each user's requests a pass (``spool.scan``): what is left
    # waits for the next pass, which follows at once (``Scheduler.next_wakeup``).
    found, scheduler.spool_left = spool.scan(scheduler.state, PER_OWNER if scheduler.shared is not None else None)
    if not found:
        return
    try:
        _attempt(scheduler, now, found, reload)
        return
    except INPUT_ERRORS as err:
        log.warning("ingest failed (%s); ingesting one request at a time", describe(err))
    for request in found:
        try:
            _attempt(scheduler, now, [request], reload)
        except INPUT_ERRORS as err:
            reason = f"made the daemon's pass fail ({describe(err)}); fix it and submit again"
            events: list[Event] = []
            bad = spool.BadRequest(request.path, reason)
            intake.set_aside(scheduler.state, bad, now, events, answer=scheduler.shared is not None)
            scheduler.journal.extend(events)


PER_OWNER = 50  # requests of one user a shared queue's pass reads (bench/flood_cap.py measured what it saves)
LEFTOVER_AGE = 3600.0  # a dot-file this old in the spool is an interrupted write, not one in progress
SWEEP_EVERY = 600.0  # seconds (monotonic) between sweeps of the spool for such leftovers
_next_sweep = [0.0]


def sweep_leftovers(state: StateDir, now: float) -> list[str]:
    """Remove the spool's dot-files (temp files of interrupted writes: a client killed mid-submit, a full
    disk) older than ``LEFTOVER_AGE``, at most every ``SWEEP_EVERY``; the names removed. `gpuq doctor`
    reports those younger ones that linger. A request is never a dot-file: nothing a user meant is lost."""
    clock = time.monotonic()
    if clock < _next_sweep[0]:
        return []
    _next_sweep[0] = clock + SWEEP_EVERY
    spool_dir, removed = state.at(SPOOL), []
    try:
        entries = list(os.scandir(spool_dir))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith("."):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime > LEFTOVER_AGE and not entry.is_dir(
                follow_symlinks=False
            ):
                os.unlink(entry.path)  # unlink never follows a link: root removes the name, not its target
                removed.append(entry.name)
        except OSError:
            continue  # renamed in or removed meanwhile
    if removed:
        log.info("removed %d leftover temp file(s) from the spool: %s", len(removed), " ".join(removed[:5]))
    return removed


def _attempt(scheduler: SchedulerState, now: float, found: list[spool.Request], reload: Callable[[], None]) -> None:
    """One transaction; on failure the table, the jobs in memory and what waited on the commit are as before."""
    ingested, journal = len(scheduler.ingested), len(scheduler.journal)
    after, undo = len(scheduler.after_commit), len(scheduler.on_rollback)
    try:
        with scheduler.table.batch():
            intake.ingest(scheduler, now, found)
    except BaseException:
        for action in scheduler.on_rollback[undo:]:
            action()
        del scheduler.ingested[ingested:]  # their rows are gone: their requests must stay in the spool
        del scheduler.journal[journal:]
        del scheduler.after_commit[after:]
        del scheduler.on_rollback[undo:]
        reload()
        raise


def unplaceable(lives: Lives, attempt: Callable[[], object]) -> list[tuple[JobRecord, BaseException]]:
    """The pending jobs that make ``attempt`` (the scheduler's eligibility and planning) raise on their own, each
    tried with the lives narrowed to it. What an attempt legitimately did to a job (a learned reservation, an
    end because a dependency failed) stays done."""
    found = []
    for record in list(lives.pending.values()):
        if record.id not in lives.pending:
            continue  # ended by an earlier one's attempt
        with lives.narrowed(record.id):
            try:
                attempt()
            except INPUT_ERRORS as err:
                found.append((record, err))
    return found


def fail(scheduler: SchedulerState, bad: list[tuple[JobRecord, BaseException]], now: float) -> None:
    """End each job that placement cannot take, saying why; the others go on (the state is
    ``endings.finish_pending``'s, which takes it whole)."""
    events: list[Event] = []
    endings.finish_pending(
        scheduler,
        [(record, Outcome.rejected(f"could not be placed ({describe(err)})")) for record, err in bad],
        now,
        events,
    )
    scheduler.journal.extend(events)
    for record, err in bad:
        log.error("job %d failed: placement raised %s", record.id, describe(err))
