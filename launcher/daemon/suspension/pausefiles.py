"""A job's pause file (``run/<id>.paused``): what a suspend leaves for the job's shim and for a later daemon.

Its keys: ``since`` (monotonic: suspended since then; its time limit does not run meanwhile) and ``total`` (the
seconds it spent suspended before), which the shim reads (``shim.suspended_for``); ``child`` (the helper acting
on it, as pid and start time: a later daemon waits for it first); ``for``, ``why`` and ``preemptions`` (the
job that preempted it and why, and how often it was: a later daemon resumes it in turn,
``daemon.preempting``); and the reservation it was suspended for (``daemon.reserving``). Only the daemon writes
it; a file it cannot read is an empty record.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import StateDir, read_bytes

RESERVATION = "reservation"  # the key a victim's pause file names its reservation by


def read(state: StateDir, job_id: int) -> dict[str, Any]:
    """The job's pause file (empty if it has none, or one that is not a record)."""
    try:
        data = json.loads(read_bytes(state.pause_file(job_id)))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write(state: StateDir, job_id: int, paused: dict[str, Any]) -> None:
    write_atomic(state.pause_file(job_id), json.dumps(paused).encode(), durable=False)


def unpause(state: StateDir, job_id: int) -> None:
    """The job runs again: its time limit counts on from where it stopped; preempted no more (its count of
    preemptions stays)."""
    paused = read(state, job_id)
    since = paused.pop("since", None)
    if since is not None:
        paused["total"] = float(paused.get("total") or 0.0) + max(0.0, time.monotonic() - float(since))
    for key in ("child", "for", "why"):
        paused.pop(key, None)
    write(state, job_id, paused)


def note_preemption(state: StateDir, job_id: int, preemptor: int, why: str, times: int) -> None:
    """It is suspended for ``preemptor``: a later daemon resumes it once that one is not running (its place is
    kept meanwhile)."""
    paused = read(state, job_id)
    paused.update({"for": preemptor, "why": why, "preemptions": times})
    write(state, job_id, paused)


def note_reservation(state: StateDir, job_id: int, name: str) -> None:
    """It is suspended for the reservation ``name``: a later daemon resumes it once that is over."""
    paused = read(state, job_id)
    paused[RESERVATION] = name
    write(state, job_id, paused)


def forget_reservation(state: StateDir, job_id: int) -> None:
    """Its reservation is over (or its suspend for it failed): no later daemon waits for it."""
    paused = read(state, job_id)
    if paused.pop(RESERVATION, None) is not None and os.path.exists(state.pause_file(job_id)):
        write(state, job_id, paused)
