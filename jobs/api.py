"""The Python API for sweeps written in Python::

    from gpuq_scheduler import submit, wait, status

    ids = [submit(["train.py", "--seed", str(s)], gpus=1, mem="4G") for s in range(8)]
    for record in wait(ids):
        print(record.id, record.state.value, record.exit_code)

Everything here works through the state directory; a daemon is started when none is running.
``on="lab"`` sends a job to the cluster named ``lab`` in the config instead (see ``jobs.slurm.clusters``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.options import SUBMIT, check_keywords
from gpuq_scheduler.jobs.rules import MODES, check_array
from gpuq_scheduler.jobs.store.outbox import ANSWER_PATIENCE, keep_daemon
from gpuq_scheduler.jobs.store.outbox import ensure_daemon as ensure_daemon
from gpuq_scheduler.jobs.store.outbox import start_daemon as start_daemon
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.spool import ArrayPlan
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.submission import capture_spec


def _state(home: str | os.PathLike[str] | None) -> StateDir:
    return StateDir(Path(home).absolute()) if home is not None else StateDir.from_env()


def submit(command: str | Sequence[str], *, home: str | os.PathLike[str] | None = None, **options: Any) -> int:
    """Queue a job and return its id. ``command`` is a list of words (a string is split on whitespace).

    Takes ``gpuq submit``'s options by their Python names, as the CLI reads them (listed below), plus
    ``home`` (the queue). ``mem`` is a size ("20G"), "auto" or bytes; ``time_limit`` a duration ("2h") or
    seconds; ``env`` a mapping; ``after`` job ids; ``on`` a cluster of the config; ``cpus`` and ``ram`` are
    host limits (docs/containment.md).

    The job runs with this process's environment (plus ``env``) and ``cwd`` (default: the current one);
    a ``*.py`` command runs with this process's interpreter, which has the packages this sweep imports.

    In a shared queue the daemon gives the id: when it is not running, the job is queued durably all the
    same and ``NoIdYet`` is raised (its ``request`` names the request); do not submit it again.
    """
    check_keywords("submit", options)
    words = command.split() if isinstance(command, str) else list(command)
    on = options.pop("on", None)
    spec = JobSpec.from_json(_capture(words, options))
    state = _state(home)
    job_id = queue_job(state, spec, on=on)
    if on is None:
        ensure_daemon(state)
    return job_id


submit.__doc__ = (
    (submit.__doc__ or "").rstrip()
    + "\n\n    Options (``jobs.options`` declares them):\n\n"
    + "\n".join(
        f"    - ``{option.dest}`` (``{option.flag}``): {option.help or 'one of ' + ', '.join(MODES) + '.'}"
        for option in SUBMIT
        if option.api
    )
)


def _capture(words: list[str], options: dict[str, Any], *, array: bool = False) -> dict[str, Any]:
    """``capture_spec`` for the API: its ``cwd`` may be a path, and its ``python`` is this process's."""
    cwd = options.pop("cwd", None)
    options.setdefault("python", sys.executable)
    return capture_spec(
        words,
        environ=os.environ,
        cwd=None if cwd is None else os.fspath(cwd),
        env=options.pop("env", None) or {},
        array=array,
        **options,
    )


def queue_job(
    state: StateDir,
    spec: JobSpec,
    array: ArrayPlan | None = None,
    *,
    on: str | None = None,
    patience: float | None = ANSWER_PATIENCE,
) -> int:
    """Send a job where it was asked to run: to the cluster named ``on``, else to this machine's queue.

    A shared queue's daemon gives the id: NoIdYet if it is not running (the job is queued all the same) or
    has not answered within ``patience`` seconds (None: wait for it however long it takes)."""
    if on is not None:
        from gpuq_scheduler.jobs.slurm import clusters  # Slurm's code loads only for cluster jobs

        return clusters.submit(state, on, spec, array)
    if spec.after and state.clusters_db.exists():
        from gpuq_scheduler.jobs.slurm import clusters

        clusters.refuse_cluster_dependencies(state, spec.after)
    return Queue(state).submit(spec, array=array, patience=patience)


def readers(state: StateDir) -> Queue:
    """The queue to read (and cancel) jobs through: with the cluster jobs when any were sent from here."""
    if not state.clusters_db.exists():
        return Queue(state)
    from gpuq_scheduler.jobs.slurm.clusters import Everywhere

    return Everywhere(state)


def local_ids(state: StateDir, job_ids: Iterable[int]) -> list[int]:
    """Those of ``job_ids`` that are this machine's (and want its daemon), not a cluster's."""
    if not state.clusters_db.exists():
        return list(job_ids)
    from gpuq_scheduler.jobs.slurm.clusters import remote_ids

    ids = list(job_ids)
    remote = remote_ids(state, ids)
    return [i for i in ids if i not in remote]


def status(job_ids: Iterable[int] | None = None, *, home: str | os.PathLike[str] | None = None) -> list[JobRecord]:
    """The records of ``job_ids``, or of every job in the queue."""
    queue = readers(_state(home))
    if job_ids is None:
        return queue.records()
    return [queue.get(job_id) for job_id in job_ids]


def details(job_id: int, *, home: str | os.PathLike[str] | None = None) -> JobRecord:
    """One job's record with its command, cwd and environment, where the caller may read them (in a shared
    queue they are the owner's and the admins' alone)."""
    return readers(_state(home)).details(job_id)


def cancel(job_ids: Iterable[int], *, home: str | os.PathLike[str] | None = None) -> list[int]:
    state = _state(home)
    cancelled = readers(state).cancel(job_ids)
    if local_ids(state, cancelled):
        ensure_daemon(state)
    return cancelled


def array(
    command: str | Sequence[str],
    indices: Iterable[int],
    *,
    throttle: int | None = None,
    home: str | os.PathLike[str] | None = None,
    **options: Any,
) -> tuple[int, list[int]]:
    """Queue an array: one member per index, ``{index}`` in the command replaced by it, at most
    ``throttle`` running at once. Takes the options of ``submit`` (``on`` too). Returns (array id, member ids)."""
    words = command.split() if isinstance(command, str) else list(command)
    plan = ArrayPlan(tuple(sorted(set(indices))), throttle)
    if not plan.indices:
        raise BadInput("an array needs at least one index")
    check_array(plan.indices, plan.throttle)
    on = options.pop("on", None)
    spec = JobSpec.from_json(_capture(words, options, array=True))
    state = _state(home)
    array_id = queue_job(state, spec, plan, on=on)
    if on is None:
        ensure_daemon(state)
    return array_id, list(plan.member_ids(array_id))


def wait(
    job_ids: Iterable[int] | None = None,
    *,
    timeout: float | None = None,
    home: str | os.PathLike[str] | None = None,
    on_progress: Callable[[list[JobRecord]], None] | None = None,
) -> list[JobRecord]:
    """Block until the jobs (default: every job active now) have finished; return their records.

    An array id stands for all its members. Raises TimeoutError after ``timeout`` seconds. Restarts the
    daemon if it dies while we wait. ``on_progress`` gets the records each time they are read.
    """
    state = _state(home)
    queue = readers(state)
    # Unknown ids fail now, not after a long wait.
    chosen = queue.records(active_only=True) if job_ids is None else queue.resolve(job_ids)
    ids = [r.id for r in chosen]
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.01
    wanted = set(ids)
    said = False  # that a shared queue's daemon is down, said once
    while True:
        records = [r for r in queue.records() if r.id in wanted]
        if len(records) < len(wanted):  # not in the table yet, and a shared queue's spool cannot be listed:
            seen = {r.id for r in records}  # our own requests are read by name
            records += queue.resolve([i for i in ids if i not in seen])
        if on_progress is not None:
            on_progress(records)
        if all(r.state.finished for r in records):
            return records
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"jobs still active after {timeout}s")
        if any(r.cluster is None and not r.state.finished for r in records):
            said = keep_daemon(state, said)  # not for cluster jobs alone: a login node needs no gpuq daemon
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)
