# One module past 400 lines on purpose: every check reads one look at the state directory, for one report.
"""``gpuq doctor``: a read-only consistency check of a state directory.

It reads what the daemon and the clients wrote (the job table, the spool, ``next_id``, ``gpus.json``,
``run/``, ``logs/``, the owners of ``private/``) and reports what does not add up, each problem as one line
saying what is wrong and what to do. It needs no daemon and changes nothing: the table is opened through a read-only
connection (no checkpoint, no repair; SQLite may create its empty -wal and -shm side files, as for any
reader), and its raw columns are parsed here, so that a record the normal readers would choke on
becomes a problem to report instead of a traceback.

Checks are ordered so that a daemon working at the same time cannot cause a false alarm: the table is
read before the spool and the spool before ``next_id`` (ids are allocated, then spooled, then ingested),
and a running job whose supervisor is gone is looked up again after its exit file was looked for.
"""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from gpuq_scheduler.jobs import causes
from gpuq_scheduler.jobs.errors import GpuqError
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.shown import shown
from gpuq_scheduler.jobs.store import private, spool
from gpuq_scheduler.jobs.store.notices import read_idle_batch
from gpuq_scheduler.jobs.store.queue import Queue, expand
from gpuq_scheduler.jobs.store.schema import LIVE_STATES, TABLE_VERSION, states
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.units import format_size
from gpuq_scheduler.launcher.gpus.mps import CONTROL, Mps
from gpuq_scheduler.launcher.views import daemon_health

Severity = Literal["error", "warning"]
ERROR: Severity = "error"
WARNING: Severity = "warning"

STALE_TEMP_AGE = 3600.0  # a temp file this old belongs to a write that was interrupted, not one in progress

T = TypeVar("T")
_COLUMNS = "id, state, spec, submitted_at, started_at, ended_at, gpus, log, shim_pid, shim_start, boot_id"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the state directory: ``message`` says what, and what to do about it."""

    severity: Severity
    message: str

    def to_json(self) -> dict[str, str]:
        return {"severity": self.severity, "message": self.message}


@dataclass(frozen=True)
class _Row:
    """A job as stored, parsed just enough to check it. ``spec`` is None when it cannot be read."""

    id: int
    state: str
    spec: JobSpec | None
    submitted_at: float | None
    started_at: float | None
    ended_at: float | None
    gpus: tuple[int, ...]
    log: str
    shim_pid: int | None
    shim_start: float | None
    boot_id: str | None


def check(state: StateDir, *, now: float | None = None) -> list[Problem]:
    """Every problem found in ``state``, errors first. Never raises, never writes."""
    now = time.time() if now is None else now
    if not state.root.exists():
        return [Problem(WARNING, f"there is no state directory at {state.root}; check GPUQ_HOME if you expected one")]
    if not state.spool.is_dir():
        return [Problem(ERROR, f"{state.root} is not a gpuq state directory (it has no spool/); check GPUQ_HOME")]
    problems: list[Problem] = []
    db = _open(state, problems)
    rows: list[_Row] = []
    highest_array = 0
    if db is not None:
        try:
            rows = _guard(problems, "the job table", lambda: _rows(db, state.db, problems)) or []
            highest_array = _guard(problems, "arrays", lambda: _highest_array_id(db)) or 0
            _guard(problems, "running jobs", lambda: problems.extend(_running(state, db, rows)))
            _guard(problems, "job records", lambda: problems.extend(_records(rows)))
            _guard(problems, "GPU reservations", lambda: problems.extend(_gpus(state, rows)))
            _guard(problems, "idle batch jobs", lambda: problems.extend(_idle_batch(state, db)))
            _guard(problems, "job cgroups", lambda: problems.extend(_stray_processes(state, db)))
            _guard(problems, "private files", lambda: problems.extend(_private_files(state, db)))
        finally:
            db.close()
    spooled = _guard(problems, "the spool", lambda: _spool(state, rows, problems))
    if not state.is_shared():  # a shared queue's daemon gives ids: it has no counter
        _guard(problems, "next_id", lambda: problems.extend(_next_id(state, rows, highest_array, spooled or set())))
    _guard(problems, "temp files", lambda: problems.extend(_stale_temps(state, now)))
    _guard(problems, "rejected requests", lambda: problems.extend(_rejected(state)))
    _guard(problems, "the daemon's passes", lambda: problems.extend(_failing_pass(state)))
    _guard(problems, "MPS control daemons", lambda: problems.extend(_mps_quits(state)))
    return sorted(problems, key=lambda p: p.severity != ERROR)


def render(problems: list[Problem], state: StateDir) -> str:
    """What ``gpuq doctor`` prints: one line per problem, or one line saying all is well."""
    if not problems:
        return f"no problems found in {state.root}"
    errors = sum(1 for p in problems if p.severity == ERROR)
    lines = [f"{p.severity}: {p.message}" for p in problems]
    lines.append(f"{errors} error(s), {len(problems) - errors} warning(s) in {state.root}")
    return "\n".join(lines)


def _stray_processes(state: StateDir, db: sqlite3.Connection) -> Iterator[Problem]:
    """A job that is not running has no process left in its cgroup: containment ends them all with it. The
    job's state is read after its cgroup was, so a job starting meanwhile is not taken for one that ended."""
    from gpuq_scheduler.launcher.supervisor.containment import occupied, read_record

    recorded = read_record(str(state.inventory))
    if recorded is None or not recorded.group:
        return
    for job_id, count in occupied(recorded.group).items():
        found = db.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
        if found is None or found[0] != "running":
            where = f"{recorded.group}/job-{job_id}"
            yield Problem(
                WARNING, f"job {job_id} is not running, but {count} process(es) are still in its cgroup {where}; "
                f"`echo 1 > {where}/cgroup.kill` ends them"
            )  # fmt: skip


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


# -- the job table -----------------------------------------------------------------------------------------


def _open(state: StateDir, problems: list[Problem]) -> sqlite3.Connection | None:
    path = state.db
    if not path.exists():
        return None  # nothing was ever ingested here: an empty queue
    damaged = (
        f"stop the daemon (`gpuq daemon stop`), save what can be saved (`sqlite3 {_quote(path)} .recover | "
        "sqlite3 recovered.db`) and put recovered.db in its place, or move it aside to start an empty table"
    )
    try:
        db = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True, timeout=10, isolation_level=None)
    except sqlite3.Error as err:
        problems.append(Problem(ERROR, f"cannot open the job table {path}: {err}; check its permissions"))
        return None
    try:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        verdict = [" ".join(str(line).split()) for (line,) in db.execute("PRAGMA quick_check(3)")]
    except (sqlite3.Error, UnicodeDecodeError) as err:  # a damaged schema's text need not even be UTF-8
        db.close()
        said = " ".join(str(err).split())  # SQLite quotes the damaged schema, newlines and all: one line
        problems.append(Problem(ERROR, f"the job table {path} cannot be read ({said}): {damaged}"))
        return None
    if version > TABLE_VERSION:
        problems.append(
            Problem(ERROR, f"the job table {path} has version {version}, newer than this gpuq reads "
                           f"({TABLE_VERSION}); upgrade gpuq")
        )  # fmt: skip
    elif version < 1 or "jobs" not in tables:
        problems.append(
            Problem(ERROR, f"{path} is not a gpuq job table (version {version}, tables {sorted(tables)}); "
                           "move it aside: the daemon creates a new one")
        )  # fmt: skip
    if verdict != ["ok"]:
        problems.append(Problem(ERROR, f"the job table {path} is damaged ({'; '.join(verdict)}): {damaged}"))
    if version > TABLE_VERSION or "jobs" not in tables or verdict != ["ok"]:  # its records cannot be trusted
        db.close()
        return None
    return db


def _rows(db: sqlite3.Connection, path: Path, problems: list[Problem]) -> list[_Row]:
    rows = []
    for raw in db.execute(f"SELECT {_COLUMNS} FROM jobs ORDER BY id"):
        row = _parse_row(raw)
        if row is None:
            look = f"sqlite3 {_quote(path)} 'SELECT * FROM jobs WHERE id={raw[0]}'"
            problems.append(
                Problem(ERROR, f"the record of job {raw[0]} cannot be read, so `gpuq status` fails on it; "
                               f"stop the daemon and look at it: {look}")
            )  # fmt: skip
            continue
        if row.spec is None:
            problems.append(Problem(ERROR, f"job {row.id} has an unreadable job spec; it can neither run nor be shown"))
        rows.append(row)
    return rows


def _parse_row(raw: tuple[Any, ...]) -> _Row | None:
    try:
        job_id, job_state, spec_text, submitted, started, ended, gpus_text, log, shim_pid, shim_start, boot = raw
        gpus = json.loads(gpus_text)
        if not isinstance(job_id, int) or not isinstance(gpus, list) or not all(isinstance(g, int) for g in gpus):
            return None
        try:
            spec_data = json.loads(spec_text)
            spec: JobSpec | None = JobSpec.from_json({**spec_data, "env": {}})
        except (GpuqError, ValueError, TypeError, RecursionError):
            spec = None
        return _Row(
            job_id, str(job_state), spec, _number(submitted), _number(started), _number(ended), tuple(gpus),
            str(log or ""), shim_pid if isinstance(shim_pid, int) else None, _number(shim_start),
            None if boot is None else str(boot),
        )  # fmt: skip
    except (ValueError, TypeError, RecursionError):
        return None


def _private_files(state: StateDir, db: sqlite3.Connection) -> Iterator[Problem]:
    """A shared queue's live job whose private file (its command) is missing or not its owner's: the daemon
    refuses such a file (``jobs.store.private``), so the job fails at its start rather than run what another
    user wrote. Only names and owners are looked at: anyone may run this, as anyone may run doctor."""
    live = db.execute(
        f"SELECT COALESCE(array_id, id), uid, MIN(id) FROM jobs WHERE {LIVE_STATES}"
        " AND json_extract(spec, '$.command') = json_array(?) GROUP BY COALESCE(array_id, id), uid",
        (private.HIDDEN,),
    ).fetchall()
    for owner_id, uid, job_id in live:
        path = state.private_file(int(owner_id))
        try:
            problem = private.not_owned(os.lstat(path), int(uid))
        except FileNotFoundError:
            problem = "is missing"
        except OSError as err:
            problem = f"cannot be looked at ({err.strerror})"
        if problem:
            yield Problem(
                ERROR, f"the private part of job {job_id} ({_quote(Path(path))}) {problem}: the daemon refuses it "
                       f"and the job fails when it would start; `gpuq cancel {job_id}` as an admin and ask its "
                       "owner to submit it again",
            )  # fmt: skip


def _highest_array_id(db: sqlite3.Connection) -> int:
    """The last id an array took: its own id, then one per member."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='arrays'").fetchone() is None:
        return 0
    return int(db.execute("SELECT COALESCE(MAX(id + size), 0) FROM arrays").fetchone()[0])


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _running(state: StateDir, db: sqlite3.Connection, rows: list[_Row]) -> Iterator[Problem]:
    """Each running job must be supervised (its shim alive) or have left its outcome in an exit file."""
    from gpuq_scheduler.launcher.supervisor import processes

    boot = processes.boot_id()
    for row in rows:
        if row.state != JobState.RUNNING.value or row.started_at is None:
            continue
        if row.boot_id is not None and row.boot_id != boot:
            yield Problem(
                ERROR, f"job {row.id} was running when the machine restarted; start the daemon "
                       "(`gpuq daemon start`): it records the job as lost and frees its GPUs",
            )  # fmt: skip
            continue
        if row.shim_pid is not None and processes.is_alive(row.shim_pid, row.shim_start):
            continue
        if os.path.exists(state.exit_file(row.id)):
            continue  # it ended; the daemon collects the outcome when it next runs
        still = db.execute("SELECT state FROM jobs WHERE id=?", (row.id,)).fetchone()
        if still is None or still[0] != JobState.RUNNING.value:
            continue  # a daemon recorded its end while we looked
        yield Problem(
            ERROR, f"job {row.id} is recorded as running, but its gpuq supervisor (pid {row.shim_pid}) is gone "
                   "and left no exit file; start the daemon (`gpuq daemon start`): it records the job as lost "
                   "or queues it again",
        )  # fmt: skip


def _records(rows: list[_Row]) -> Iterator[Problem]:
    """Each record's fields must match its state."""
    known = {s.value for s in JobState}
    for row in rows:
        if row.state not in known:
            yield Problem(ERROR, f"job {row.id} has an unknown state {row.state!r}; a newer gpuq may have written it")
            continue
        job_state = JobState(row.state)
        if job_state.finished:
            if row.ended_at is None:
                yield Problem(ERROR, f"job {row.id} is {row.state} but has no end time; its record was cut short")
            if row.started_at is not None and row.log and not os.path.exists(row.log):
                yield Problem(WARNING, f"the log of job {row.id} ({row.log}) is missing; it was deleted or moved")
        elif job_state is JobState.RUNNING:
            if row.started_at is None:
                yield Problem(
                    ERROR, f"job {row.id} is running but has no start time; cancel it (`gpuq cancel {row.id}`)"
                )
            wanted = None if row.spec is None else row.spec.gpus
            if wanted and not row.gpus:
                yield Problem(
                    ERROR, f"job {row.id} is running without GPUs although it asked for {wanted}; "
                           f"cancel it (`gpuq cancel {row.id}`) and submit it again",
                )  # fmt: skip
            elif wanted is not None and row.gpus and len(row.gpus) != wanted:
                yield Problem(ERROR, f"job {row.id} asked for {wanted} GPU(s) but runs on {len(row.gpus)}; cancel it")
        elif row.started_at is not None or row.gpus or row.ended_at is not None:
            yield Problem(
                ERROR, f"job {row.id} is pending but has a start or end time or GPUs; cancel it "
                       f"(`gpuq cancel {row.id}`) and submit it again",
            )  # fmt: skip


def _gpus(state: StateDir, rows: list[_Row]) -> Iterator[Problem]:
    """No GPU shared by a whole-GPU job, no GPU promised more memory than it has."""
    from gpuq_scheduler.launcher.policy.placement import Policy

    inventory = Queue(state).inventory()
    if inventory is None and state.inventory.exists():
        yield Problem(
            WARNING, f"{state.inventory} cannot be read; the daemon rewrites it at its next look at the GPUs "
                     "(`gpuq daemon start`)",
        )  # fmt: skip
    overhead = Policy().overhead
    holders: dict[int, list[_Row]] = defaultdict(list)
    for row in rows:
        if row.state == JobState.RUNNING.value and row.spec is not None:
            for gpu in row.gpus:
                holders[gpu].append(row)
    for gpu, jobs in sorted(holders.items()):
        ids = ", ".join(str(j.id) for j in jobs)
        whole = [j for j in jobs if j.spec is not None and j.spec.mem_per_gpu is None]
        if whole and len(jobs) > 1:
            yield Problem(
                ERROR, f"GPU {gpu} is shared by jobs {ids}, although job {whole[0].id} should have it to itself; "
                       f"cancel one of them (`gpuq cancel {jobs[-1].id}`)",
            )  # fmt: skip
            continue
        if inventory is None:
            continue
        if gpu >= len(inventory.totals):
            yield Problem(
                WARNING, f"jobs {ids} run on GPU {gpu}, which the GPU inventory ({len(inventory.totals)} GPUs) "
                         "does not list; check `gpuq gpus`",
            )  # fmt: skip
            continue
        total = inventory.totals[gpu]
        promised = sum(j.spec.mem_per_gpu + overhead for j in jobs if j.spec is not None and j.spec.mem_per_gpu)
        if not whole and promised > total:
            yield Problem(
                ERROR, f"GPU {gpu} has {format_size(promised)} promised to jobs {ids} (with "
                       f"{format_size(overhead)} overhead each), more than its {format_size(total)}; "
                       f"cancel one of them (`gpuq cancel {jobs[-1].id}`)",
            )  # fmt: skip


# -- the spool and the id counter --------------------------------------------------------------------------


def _spool(state: StateDir, rows: list[_Row], problems: list[Problem]) -> set[int]:
    """The ids of the jobs waiting in the spool; reports ids that the table already holds."""
    recorded = {row.id: row for row in rows}
    spooled: set[int] = set()
    for request in spool.scan(state)[0]:
        if isinstance(request, spool.BadRequest):
            if os.path.exists(request.path):  # not just ingested and deleted while we looked
                problems.append(
                    Problem(WARNING, f"{request.path} {request.reason}; the daemon sets it aside when it next runs")
                )
            continue
        if not isinstance(request, spool.SubmitRequest) or request.token is not None:
            continue  # a shared queue's submit has no id until the daemon reads it
        spooled.update(record.id for record in expand(state, request))  # an array: its members too
        row = recorded.get(request.job_id)
        if row is None or not os.path.exists(request.path):
            continue
        if row.submitted_at == request.submitted_at:
            name = os.path.basename(request.path)
            problems.append(
                Problem(WARNING, f"job {row.id} is in the table and still in the spool ({name}), left by "
                                 "a crash after it was recorded; the daemon deletes the request when it next runs")
            )  # fmt: skip
        else:
            problems.append(
                Problem(ERROR, f"{request.path} asks for job {row.id}, but the table holds a different job "
                               f"{row.id}: the id was handed out twice and the daemon will drop this request; move "
                               "it aside and submit its command again once next_id is above every job id")
            )  # fmt: skip
    return spooled


def _next_id(state: StateDir, rows: list[_Row], highest_array: int, spooled: set[int]) -> Iterator[Problem]:
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
    fix = f"stop submitting and write {highest + 1} into it: `echo {highest + 1} > {_quote(state.next_id)}`"
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
            ERROR, f"{state.next_id} says the next job id is {counter}, but id {highest_recorded} is taken: "
                   f"the next submit would reuse an id and be dropped; {fix}",
        )  # fmt: skip
    elif counter <= highest_spooled:
        yield Problem(
            WARNING, f"{state.next_id} says the next job id is {counter}, but the spool holds job {highest_spooled}; "
                     f"submits skip past it, but it should not happen: {fix}",
        )  # fmt: skip


# -- leftovers ---------------------------------------------------------------------------------------------


def _stale_temps(state: StateDir, now: float) -> Iterator[Problem]:
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
            names = " ".join(_quote(directory / name) for name in sorted(stale)[:3])
            more = f" and {len(stale) - 3} more" if len(stale) > 3 else ""
            yield Problem(
                WARNING, f"{len(stale)} temp file(s) older than an hour in {directory}, left by interrupted "
                         f"writes; delete them: rm {names}{more}",
            )  # fmt: skip


def _rejected(state: StateDir) -> Iterator[Problem]:
    count = Queue(state).rejected()
    if count:
        yield Problem(
            WARNING, f"{count} request file(s) were set aside as unreadable in {state.rejected}; read the .why "
                     "file beside each, then delete them",
        )  # fmt: skip


def _idle_batch(state: StateDir, db: sqlite3.Connection) -> Iterator[Problem]:
    """Batch jobs holding GPUs that have done no work for hours: the daemon's typed notice of them, for the
    jobs still running (a job that ended since is no one's problem)."""
    idle = read_idle_batch(state)
    if not idle:
        return
    marks = ",".join("?" * len(idle))
    query = f"SELECT id, user FROM jobs WHERE {states(JobState.RUNNING)} AND id IN ({marks}) ORDER BY id"
    for job_id, user in db.execute(query, list(idle)).fetchall():
        yield Problem(
            WARNING, f"job {job_id} of {shown(str(user))} holds GPUs that did no work: "
                     f"{causes.idle_batch(idle[job_id])}; ask them, or `gpuq cancel {job_id}` as an admin",
        )  # fmt: skip


def _failing_pass(state: StateDir) -> Iterator[Problem]:
    failing = daemon_health.failing_pass(state)
    if failing:
        yield Problem(ERROR, failing)


def _mps_quits(state: StateDir) -> Iterator[Problem]:
    """A control daemon whose quit failed is kept, not forgotten (``launcher.daemon.controls``): say so."""
    mps = Mps(state.mps)
    for key, why in sorted(mps.failures().items(), key=lambda item: str(item[0])):
        pipe = _quote(mps.pipe(key))
        yield Problem(
            WARNING, f"the MPS control daemon of uid {key.uid} on GPU {key.uuid} did not quit ({why}); the gpuq "
                     f"daemon tries again while it runs; to end it by hand: echo quit | CUDA_MPS_PIPE_DIRECTORY={pipe} "
                     f"{CONTROL}, then rm -r {_quote(mps.folder(key))} {_quote(mps.note(key))}",
        )  # fmt: skip


def _quote(path: Path) -> str:
    return shlex.quote(str(path))
