"""``gpuq doctor``: a read-only consistency check of a state directory.

It reads what the daemon and the clients wrote (the job table, the spool, ``next_id``, ``gpus.json``,
``run/``, ``logs/``, the owners of ``private/``) and reports what does not add up, each problem as one line
saying what is wrong and what to do (``doctor_findings``). It needs no daemon and changes nothing. Its checks
live in three rooms: the job table opened and parsed (``doctor_table``), the jobs it holds (``doctor_jobs``)
and the files beside it (``doctor_files``); here they run in an order that lets a daemon work meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.views import doctor_files, doctor_jobs
from gpuq_scheduler.launcher.views.doctor_findings import ERROR, WARNING, Problem
from gpuq_scheduler.launcher.views.doctor_table import StoredRow, highest_array_id, open_table, read_rows

T = TypeVar("T")


def check(state: StateDir, *, now: float | None = None) -> list[Problem]:
    """Every problem found in ``state``, errors first. Never raises, never writes.

    The table is read before the spool and the spool before ``next_id`` (ids are allocated, then spooled,
    then ingested): a daemon working at the same time cannot cause a false alarm."""
    now = time.time() if now is None else now
    if not state.root.exists():
        return [Problem(WARNING, f"there is no state directory at {state.root}; check GPUQ_HOME if you expected one")]
    if not state.spool.is_dir():
        return [Problem(ERROR, f"{state.root} is not a gpuq state directory (it has no spool/); check GPUQ_HOME")]
    problems: list[Problem] = []
    db = open_table(state, problems)
    rows: list[StoredRow] = []
    highest_array = 0
    if db is not None:
        try:
            rows = _guard(problems, "the job table", lambda: read_rows(db, state.db, problems)) or []
            highest_array = _guard(problems, "arrays", lambda: highest_array_id(db)) or 0
            _guard(problems, "running jobs", lambda: problems.extend(doctor_jobs.running(state, db, rows)))
            _guard(problems, "job records", lambda: problems.extend(doctor_jobs.records(rows)))
            _guard(problems, "GPU reservations", lambda: problems.extend(doctor_jobs.gpus(state, rows)))
            _guard(problems, "idle batch jobs", lambda: problems.extend(doctor_jobs.idle_batch(state, db)))
            _guard(problems, "job cgroups", lambda: problems.extend(doctor_jobs.stray_processes(state, db)))
            _guard(problems, "private files", lambda: problems.extend(doctor_jobs.private_files(state, db)))
        finally:
            db.close()
    spooled = _guard(problems, "the spool", lambda: doctor_files.spool(state, rows, problems))
    if not state.is_shared():  # a shared queue's daemon gives ids: it has no counter
        ids = spooled or set()
        _guard(problems, "next_id", lambda: problems.extend(doctor_files.next_id(state, rows, highest_array, ids)))
    _guard(problems, "temp files", lambda: problems.extend(doctor_files.stale_temps(state, now)))
    _guard(problems, "rejected requests", lambda: problems.extend(doctor_files.rejected(state)))
    _guard(problems, "the daemon's passes", lambda: problems.extend(doctor_files.failing_pass(state)))
    _guard(problems, "MPS control daemons", lambda: problems.extend(doctor_files.mps_quits(state)))
    return sorted(problems, key=lambda p: p.severity != ERROR)


def render(problems: list[Problem], state: StateDir) -> str:
    """What ``gpuq doctor`` prints: one line per problem, or one line saying all is well."""
    if not problems:
        return f"no problems found in {state.root}"
    errors = sum(1 for p in problems if p.severity == ERROR)
    lines = [f"{p.severity}: {p.message}" for p in problems]
    lines.append(f"{errors} error(s), {len(problems) - errors} warning(s) in {state.root}")
    return "\n".join(lines)


def containment(state: StateDir) -> str:
    """Which containment this queue's jobs are under, as its daemon last recorded it (docs/containment.md)."""
    from gpuq_scheduler.launcher.supervisor.containment import read_record

    found = read_record(str(state.inventory))
    return f"containment: {found.describe() if found else 'not known until a daemon has run here'}"


def exit_code(problems: list[Problem]) -> int:
    """0 when nothing is wrong enough to act on, 1 when there is at least one error."""
    return 1 if any(p.severity == ERROR for p in problems) else 0


def _guard(problems: list[Problem], what: str, step: Callable[[], T]) -> T | None:
    """Run one group of checks; a failure inside it is reported, never raised: a doctor must not crash."""
    try:
        return step()
    except Exception as err:  # whatever the state directory holds, the remaining checks still run
        problems.append(Problem(ERROR, f"could not check {what}: {type(err).__name__}: {err}"))
        return None
