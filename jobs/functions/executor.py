"""Python functions as gpuq jobs, the way submitit runs them on Slurm::

    from gpuq_scheduler import Executor

    executor = Executor(gpus=1, mem="auto")
    job = executor.submit(train, config)             # a Job; train(config) runs on a GPU gpuq picks
    print(job.result())                              # its return value, or its exception raised here
    jobs = executor.map_array(train, configs, throttle=8)   # one gpuq array, not len(configs) submits

The function and its arguments are pickled with cloudpickle (lambdas and functions from ``__main__`` or a
notebook go by value) into a folder of the submitter's own (mode 0700): ``<state dir>/functions`` when
the state directory is the caller's, else ``$XDG_STATE_HOME/gpuq/functions`` (a shared queue's state
directory belongs to root). The job runs them with the caller's interpreter, cwd and environment
(``jobs.functions.runner``). With ``on="lab"`` the same calls go to that Slurm cluster; its nodes must see
the folder, as they must see the state directory (give ``folder=`` a shared path otherwise).

Unpickling runs code, so a result is only ever unpickled when the file belongs to the caller.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import time as clock
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs import api
from gpuq_scheduler.jobs.errors import BadInput, GpuqError, NoIdYet, NotPermitted
from gpuq_scheduler.jobs.functions import runner
from gpuq_scheduler.jobs.functions.runner import Resubmit as Resubmit
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.options import SUBMIT
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.statedir import StateDir


class JobFailed(GpuqError):
    """The job ended without a result to return: out of memory, a time limit, a cancel, a lost GPU, or a
    process that died. The message is the outcome gpuq recorded."""

    def __init__(self, record: JobRecord) -> None:
        why = record.reason or (f"exit code {record.exit_code}" if record.exit_code is not None else "no reason")
        super().__init__(f"job {record.id} {record.state.value} without a result: {why}")
        self.record = record


class RemoteTraceback(Exception):
    """The traceback of an exception raised inside a job: set as the ``__cause__`` of the exception that
    ``Job.result()`` raises, so a traceback printed here shows where it happened there."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]) if self.args else ""


def default_folder(home: str | os.PathLike[str] | None = None) -> Path:
    """Where the pickles go unless ``folder=`` says: beside the queue when it is the caller's own, else in
    the caller's own state home (a shared queue's state directory is root's)."""
    state = Path(home).absolute() if home is not None else StateDir.from_env().root
    try:
        if state.stat().st_uid == os.getuid():
            return state / "functions"
    except FileNotFoundError:
        return state / "functions"  # made on the first submit, by the caller
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "gpuq" / "functions"


class Executor:
    """Submits Python callables as gpuq jobs. The options are ``gpuq submit``'s, named as in the CLI:
    ``gpus``, ``mem`` (a size, ``"auto"`` or None for whole GPUs), ``time`` (a time limit), ``name``,
    ``retries``, ``on`` (a cluster), and any other ``submit`` keyword (``priority``, ``mode``, ``env``,
    ``after``, ``oom_retry``, ``notify``, ``cpus``, ``ram``...: ``jobs.options`` declares them). ``home``
    picks the queue, ``folder`` where the pickles go."""

    def __init__(
        self,
        gpus: int = 1,
        mem: str | int | None = None,
        time: str | float | None = None,
        name: str | None = None,
        retries: int = 0,
        on: str | None = None,
        *,
        home: str | os.PathLike[str] | None = None,
        folder: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        own = {"gpus", "mem", "time_limit", "name", "retries", "on"}  # this signature's (time_limit: ``time``)
        known = {option.dest for option in SUBMIT if option.api} - own
        unknown = set(options) - known
        if unknown:
            raise BadInput(f"Executor() got unknown option(s) {', '.join(sorted(unknown))}: use gpuq submit's names")
        self.home = home
        self.folder = Path(folder).absolute() if folder is not None else default_folder(home)
        self.options: dict[str, Any] = {"gpus": gpus, "mem": mem, "time_limit": time, "retries": retries, "on": on}
        self.options.update(options)
        self.name = name

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Job:
        """Queue ``fn(*args, **kwargs)`` as one job."""
        with self._new_folder() as folder:
            _pickle_call(folder, "0", fn, args, kwargs)
            words = runner.command(sys.executable, folder, "0")
            job_id = api.submit(words, name=self.name or name_of(fn), home=self.home, **self.options)
        return Job(job_id, home=self.home)

    def map_array(self, fn: Callable[..., Any], /, *iterables: Iterable[Any], throttle: int | None = None) -> list[Job]:
        """Queue ``fn(*items)`` for each tuple of items, as ``map`` pairs them, as one gpuq array (at most
        ``throttle`` running at once); the Jobs come back in the order of the items."""
        calls = list(zip(*iterables, strict=False)) if iterables else []
        if not calls:
            raise BadInput("map_array needs at least one item to call the function with")
        return self.submit_batch([(fn, items, {}) for items in calls], throttle=throttle)

    def submit_batch(
        self, calls: Sequence[tuple[Callable[..., Any], Sequence[Any], dict[str, Any]]], throttle: int | None = None
    ) -> list[Job]:
        """Queue each ``(fn, args, kwargs)`` as one member of one gpuq array (at most ``throttle`` running at
        once), whatever its function: the runner reads each member's own call. Named after the first."""
        if not calls:
            raise BadInput("an array of calls needs at least one call")
        with self._new_folder() as folder:
            for index, (fn, args, kwargs) in enumerate(calls):
                _pickle_call(folder, str(index), fn, args, kwargs)
            words = runner.command(sys.executable, folder, "{index}")
            _, members = api.array(
                words,
                range(len(calls)),
                throttle=throttle,
                name=self.name or name_of(calls[0][0]),
                home=self.home,
                **self.options,
            )
        return [Job(job_id, home=self.home) for job_id in members]

    @contextlib.contextmanager
    def _new_folder(self) -> Iterator[Path]:
        """A new folder for one submit's pickles; gone again if the submit is refused (it changes nothing)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = self.folder / secrets.token_hex(8)
        folder.mkdir(mode=0o700)
        try:
            yield folder
        except NoIdYet:
            raise  # queued all the same (a shared queue whose daemon is down): its pickles must stay
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise


class Job:
    """A function job, here or rebuilt from its id in another process: ``Job(17).result()``."""

    def __init__(self, job_id: int, *, home: str | os.PathLike[str] | None = None) -> None:
        self.id = job_id
        self.home = home
        self._where: tuple[Path, str] | None = None

    def __repr__(self) -> str:
        return f"Job({self.id})"

    def record(self) -> JobRecord:
        (record,) = api.status([self.id], home=self.home)
        return record

    @property
    def state(self) -> JobState:
        return self.record().state

    def done(self) -> bool:
        return self.record().state.finished

    def cancel(self) -> bool:
        """Cancel it (pending: never runs; running: SIGTERM, then SIGKILL). False if it had already ended."""
        return bool(api.cancel([self.id], home=self.home))

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the job and return what the function returned, or raise what it raised (with the job's
        traceback as its cause), or ``JobFailed`` naming what gpuq recorded when it left no result."""
        outcome = self._outcome(timeout)
        if outcome[0] == "value":
            return outcome[1]
        if outcome[0] == "error" and isinstance(outcome[1], BaseException):
            raise outcome[1] from RemoteTraceback(outcome[2])
        raise JobFailed(self.record())

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """What ``result()`` would raise, or None when it would return."""
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except Exception as err:  # the job's own exception, or JobFailed
            return err
        return None

    def stdout(self) -> str:
        """Everything the job printed: gpuq keeps stdout and stderr in one log, interleaved as written."""
        try:
            return Path(self.record().log).read_text(errors="replace")
        except OSError:
            return ""

    def stderr(self) -> str:
        """What the job's Python code wrote to sys.stderr alone (its tracebacks, warnings, logging)."""
        folder, index = self.location()
        try:
            return runner.stderr_path(folder, index).read_text(errors="replace")
        except OSError:
            return ""

    def location(self) -> tuple[Path, str]:
        """Where its call, result and stderr are: (the submit's folder, its index there), from its command line."""
        if self._where is None:
            found = runner.parse_command(api.details(self.id, home=self.home).spec.command)
            if found is None:
                raise BadInput(f"job {self.id} is not a function job (its command is not gpuq's function runner)")
            self._where = found
        return self._where

    def _outcome(self, timeout: float | None) -> tuple[Any, ...]:
        """("value", v), ("error", exception, traceback text), or ("failed",) when the job left no result."""
        folder, index = self.location()
        (record,) = api.wait([self.id], timeout=timeout, home=self.home)
        path = runner.result_path(folder, index)
        if record.state not in (JobState.SUCCEEDED, JobState.FAILED) or not path.exists():
            return ("failed",)
        owner = path.stat().st_uid
        if owner != os.getuid():  # unpickling runs code: only ever what the caller's own job wrote
            raise NotPermitted(f"{path} belongs to uid {owner}, not to you: it is not unpickled")
        import cloudpickle

        return tuple(cloudpickle.loads(path.read_bytes()))


def wait_all(jobs: Sequence[Job], timeout: float | None = None) -> list[Job]:
    """Block until every job has ended (raises TimeoutError after ``timeout`` seconds); returns them."""
    by_home: dict[Any, list[int]] = {}
    for job in jobs:
        by_home.setdefault(job.home, []).append(job.id)
    deadline = None if timeout is None else clock.monotonic() + timeout
    for home, ids in by_home.items():
        left = None if deadline is None else max(0.0, deadline - clock.monotonic())
        api.wait(ids, timeout=left, home=home)
    return list(jobs)


def as_completed(jobs: Sequence[Job], timeout: float | None = None) -> Iterator[Job]:
    """Yield each job as it ends, first ended first (raises TimeoutError after ``timeout`` seconds)."""
    waiting = {job.id: job for job in jobs}
    deadline = None if timeout is None else clock.monotonic() + timeout
    delay = 0.02
    while waiting:
        homes = {job.home for job in waiting.values()}
        ended = [
            r
            for home in homes
            for r in api.status([j.id for j in waiting.values() if j.home == home], home=home)
            if r.state.finished
        ]
        for record in sorted(ended, key=lambda r: (r.ended_at or 0.0, r.id)):
            yield waiting.pop(record.id)
        if not waiting:
            return
        if deadline is not None and clock.monotonic() > deadline:
            raise TimeoutError(f"{len(waiting)} job(s) still active after {timeout}s")
        clock.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _pickle_call(folder: Path, index: str, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    import cloudpickle

    try:
        data = cloudpickle.dumps((fn, tuple(args), kwargs))
    except Exception as err:
        raise BadInput(f"cannot send {name_of(fn)} to a job: {type(err).__name__}: {err}") from None
    path = runner.call_path(folder, index)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def name_of(fn: Callable[..., Any]) -> str:
    """A job's name for a callable: its qualified name, its class's for an object, <lambda> for a lambda."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return "<lambda>" if name.endswith("<lambda>") else str(name)
