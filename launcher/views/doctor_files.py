"""``gpuq doctor``'s checks of the files beside the job table: the spool against the table, the id counter
against both, temp files of interrupted writes, requests set aside, the daemon's failing passes and MPS control
daemons that did not quit.

The table is read before the spool and the spool before ``next_id`` (ids are allocated, then spooled, then
ingested), so a daemon working at the same time causes no false alarm.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from gpuq_scheduler.jobs.store import spool as spooled_requests
from gpuq_scheduler.jobs.store.queue import Queue, expand
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.gpus.mps import CONTROL, Mps
from gpuq_scheduler.launcher.views import daemon_health
from gpuq_scheduler.launcher.views.doctor_findings import ERROR, WARNING, Problem, quote
from gpuq_scheduler.launcher.views.doctor_table import StoredRow

STALE_TEMP_AGE = 3600.0  # a temp file this old belongs to a write that was interrupted, not one in progress


def spool(state: StateDir, rows: list[StoredRow], problems: list[Problem]) -> set[int]:
    """The ids of the jobs waiting in the spool; reports ids that the table already holds."""
    recorded = {row.id: row for row in rows}
    spooled: set[int] = set()
    for request in spooled_requests.scan(state)[0]:
        if isinstance(request, spooled_requests.BadRequest):
            if os.path.exists(request.path):  # not just ingested and deleted while we looked
                problems.append(
                    Problem(WARNING, f"{request.path} {request.reason}; the daemon sets it aside when it next runs")
                )
            continue
        if not isinstance(request, spooled_requests.SubmitRequest) or request.token is not None:
            continue  # a shared queue's submit has no id until the daemon reads it
        spooled.update(record.id for record in expand(state, request))  # an array: its members too
        row = recorded.get(request.job_id)
        if row is None or not os.path.exists(request.path):
            continue
        if row.submitted_at == request.submitted_at:
            name = os.path.basename(request.path)
            problems.append(
                Problem(
                    WARNING,
                    f"job {row.id} is in the table and still in the spool ({name}), left by "
                    "a crash after it was recorded; the daemon deletes the request when it next runs",
                )
            )
        else:
            problems.append(
                Problem(
                    ERROR,
                    f"{request.path} asks for job {row.id}, but the table holds a different job "
                    f"{row.id}: the id was handed out twice and the daemon will drop this request; move "
                    "it aside and submit its command again once next_id is above every job id",
                )
            )
    return spooled


def next_id(state: StateDir, rows: list[StoredRow], highest_array: int, spooled: set[int]) -> Iterator[Problem]:
    """The counter must be above every id in use, or the next submit reuses one (and is dropped)."""
    highest_recorded = max(max((row.id for row in rows), default=0), highest_array)
    highest_spooled = max(spooled, default=0)
    highest = max(highest_recorded, highest_spooled)
    try:
        raw = state.next_id.read_bytes().strip()
    except FileNotFoundError:
        raw = None
    except OSError as err:
        yield Problem(ERROR, f"cannot read {state.next_id}: {err.strerror}; check its permissions")
        return
    fix = f"stop submitting and write {highest + 1} into it: `echo {highest + 1} > {quote(state.next_id)}`"
    if raw is None or not raw.isdigit():
        what = "is missing" if raw is None else f"holds {raw[:20]!r}, not a number"
        if highest_recorded:
            yield Problem(ERROR, f"{state.next_id} {what}, so the next submit would reuse id 1; {fix}")
        elif raw is not None:
            yield Problem(WARNING, f"{state.next_id} {what}; ids start again from 1 (no job has one yet)")
        return
    counter = int(raw)
    if counter <= highest_recorded:
        yield Problem(
            ERROR,
            f"{state.next_id} says the next job id is {counter}, but id {highest_recorded} is taken: "
            f"the next submit would reuse an id and be dropped; {fix}",
        )
    elif counter <= highest_spooled:
        yield Problem(
            WARNING,
            f"{state.next_id} says the next job id is {counter}, but the spool holds job {highest_spooled}; "
            f"submits skip past it, but it should not happen: {fix}",
        )


def stale_temps(state: StateDir, now: float) -> Iterator[Problem]:
    """Temp files of atomic writes that never got renamed in (a client killed mid-submit, say)."""
    for directory in (state.spool, state.root, state.run, state.rejected, state.answers, state.private):
        stale = []
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
                continue
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_AGE:
                    stale.append(entry.name)
            except OSError:
                continue  # renamed or removed while we looked: not stale
        if stale:
            names = " ".join(quote(directory / name) for name in sorted(stale)[:3])
            more = f" and {len(stale) - 3} more" if len(stale) > 3 else ""
            yield Problem(
                WARNING,
                f"{len(stale)} temp file(s) older than an hour in {directory}, left by interrupted "
                f"writes; delete them: rm {names}{more}",
            )


def rejected(state: StateDir) -> Iterator[Problem]:
    count = Queue(state).rejected()
    if count:
        yield Problem(
            WARNING,
            f"{count} request file(s) were set aside as unreadable in {state.rejected}; read the .why "
            "file beside each, then delete them",
        )


def failing_pass(state: StateDir) -> Iterator[Problem]:
    failing = daemon_health.failing_pass(state)
    if failing:
        yield Problem(ERROR, failing)


def mps_quits(state: StateDir) -> Iterator[Problem]:
    """A control daemon whose quit failed is kept, not forgotten (``launcher.daemon.controls``): say so."""
    mps = Mps(state.mps)
    for key, why in sorted(mps.failures().items(), key=lambda item: str(item[0])):
        pipe = quote(mps.pipe(key))
        yield Problem(
            WARNING,
            f"the MPS control daemon of uid {key.uid} on GPU {key.uuid} did not quit ({why}); the gpuq "
            f"daemon tries again while it runs; to end it by hand: echo quit | CUDA_MPS_PIPE_DIRECTORY={pipe} "
            f"{CONTROL}, then rm -r {quote(mps.folder(key))} {quote(mps.note(key))}",
        )
