"""submitit's executors and jobs over gpuq's Executor (``jobs.functions.executor``): the same calls, the jobs
in gpuq's queue on this workstation, or on a Slurm cluster of the config through gpuq's backend.

Where jobs go is the executor's ``cluster``: ``None`` reads ``$GPUQ_ON`` (so ``GPUQ_ON=lab python train.py``
sends an unchanged script to the cluster ``lab``) and is this workstation's queue without it; ``"local"``
is the workstation; a cluster's name (``"lab"``) is that cluster; ``"slurm"`` is ``$GPUQ_ON`` or the one
cluster the config has. ``executor.cluster`` then says ``"local"`` or ``"slurm"``, as in submitit, and
``executor.on`` the cluster's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs import config
from gpuq_scheduler.jobs.errors import BadInput, NotPermitted
from gpuq_scheduler.jobs.functions import executor as functions
from gpuq_scheduler.jobs.functions import runner
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.outbox import ensure_daemon
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.submission import host_limits
from gpuq_scheduler.submitit import parameters
from gpuq_scheduler.submitit.helpers import DelayedSubmission, Requeueable, checkpointable


class IgnoredParameter(UserWarning):
    """A submitit parameter gpuq accepts but that does nothing where the jobs go: said once per executor."""


class UncompletedJobError(functions.JobFailed):
    """submitit's name for a job that ended without a result (cancelled, out of time or memory, lost): gpuq's
    JobFailed, its message what gpuq recorded."""


# Slurm's names for gpuq's states, as submitit's job.state gives them.
STATES = {
    JobState.PENDING: "PENDING",
    JobState.RUNNING: "RUNNING",
    JobState.SUSPENDED: "SUSPENDED",
    JobState.SUCCEEDED: "COMPLETED",
    JobState.FAILED: "FAILED",
    JobState.CANCELLED: "CANCELLED",
    JobState.TIMEOUT: "TIMEOUT",
    JobState.LOST: "NODE_FAIL",
}
_CONSTRUCTOR = {
    "max_num_timeout": parameters.SLURM["signal_delay_s"],
    "python": "jobs run with this process's interpreter (sys.executable)",
    "max_pickle_size_gb": "gpuq sets no size limit on a call's pickle",
}


def _cluster(cluster: str | None) -> str | None:
    """The name of the cluster of the config the jobs go to; None: this workstation's queue."""
    chosen = (os.environ.get("GPUQ_ON") or None) if cluster in (None, "slurm") else cluster
    if cluster == "debug":
        raise BadInput(
            "cluster='debug' runs jobs inside this process in submitit; gpuq runs each in its queue: use "
            "cluster='local', or call the function directly to debug it"
        )
    if cluster == "slurm" and chosen is None:
        known = sorted(config.load().clusters)
        if len(known) != 1:
            raise BadInput(
                f"cluster='slurm': name the cluster (cluster='NAME' or GPUQ_ON=NAME) among those of your config: "
                f"{', '.join(known) or 'none is configured (docs/slurm.md)'}"
            )
        chosen = known[0]
    if chosen in (None, "local"):
        return None
    config.load().cluster(chosen)  # an unknown name is refused now, naming those the config has
    return chosen


def _base(folder: str | os.PathLike[str]) -> Path:
    """The folder for the pickles: submitit's ``folder``, up to its first ``%j``-like part (gpuq names each
    submit's own folder beneath it, since the id comes after the pickles are written)."""
    parts = Path(folder).parts
    kept = next((i for i, part in enumerate(parts) if "%" in part), len(parts))
    return Path(*parts[:kept]).absolute() if kept else Path.cwd()


class AutoExecutor:
    """submitit's ``AutoExecutor(folder, cluster=None, **kwargs)``: ``update_parameters``, ``submit``,
    ``map_array``, ``submit_array``, ``batch``. ``home`` picks gpuq's queue (default: as ``gpuq`` does)."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        cluster: str | None = None,
        *,
        home: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.on = _cluster(cluster)
        self.cluster = "slurm" if self.on else "local"
        self.folder = _base(folder)
        self.home = home
        self.parameters: dict[str, Any] = {}
        self._said: set[str] = set()
        self._batch: list[tuple[Job, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] | None = None
        bad = [
            key
            for key in kwargs
            if key.partition("_")[0] not in ("slurm", "local", "debug") or key.partition("_")[2] not in _CONSTRUCTOR
        ]
        if bad:
            raise parameters.UnknownParameter(
                f"{type(self).__name__}(): unknown argument(s) {', '.join(sorted(bad))}: its own are folder, cluster "
                f"and home, and an executor's {', '.join(_CONSTRUCTOR)} prefixed by its name (slurm_max_num_timeout)"
            )
        self._say({key: _CONSTRUCTOR[key.partition("_")[2]] for key in kwargs})

    @staticmethod
    def which() -> str:
        """Where an executor with no ``cluster`` sends jobs: "slurm" when $GPUQ_ON names a cluster, else "local"."""
        return "slurm" if os.environ.get("GPUQ_ON") else "local"

    def update_parameters(self, **kwargs: Any) -> None:
        """Set parameters by submitit's names (docs/usage.md, From submitit, maps each to gpuq's). A name no
        executor knows is refused; one that does nothing where the jobs go is accepted and said once."""
        self._update(kwargs)

    def _update(self, kwargs: dict[str, Any]) -> None:
        if self._batch is not None:
            raise RuntimeError("update_parameters cannot be called inside executor.batch(): call it before")
        merged = {**self.parameters, **kwargs}
        reading = parameters.read(merged, self.cluster)  # refuses before anything is kept
        self.parameters = merged
        self._say({key: why for key, why in reading.unused.items() if key in kwargs}, 4)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Job:
        """Queue ``fn(*args, **kwargs)``; inside ``batch()``, queued with the others when the block ends."""
        if self._batch is not None:
            job = Job(None, home=self.home)
            self._batch.append((job, fn, args, kwargs))
            return job
        (job,) = self._send([(fn, args, kwargs)])
        return job

    def map_array(self, fn: Callable[..., Any], /, *iterables: Iterable[Any]) -> list[Job]:
        """``fn(*items)`` for each tuple of items, as ``map`` pairs them: one gpuq array, at most
        ``slurm_array_parallelism`` running at once."""
        return self._send([(fn, items, {}) for items in zip(*iterables, strict=False)])

    def submit_array(self, fns: Sequence[Callable[[], Any]]) -> list[Job]:
        """Each function, called with no arguments, as a member of one array."""
        return self._send([(fn, (), {}) for fn in fns])

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Every ``submit`` inside the block becomes a member of one array, queued when the block ends; an
        error inside the block queues none of them."""
        if self._batch is not None:
            raise RuntimeError("executor.batch() blocks do not nest")
        self._batch = []
        try:
            yield
        except BaseException:
            self._batch = None
            raise
        pending, self._batch = self._batch, None
        sent = self._send([(fn, args, kwargs) for _, fn, args, kwargs in pending])
        for (job, *_), real in zip(pending, sent, strict=True):
            job.inner = real.inner

    def _send(self, calls: list[tuple[Callable[..., Any], Sequence[Any], dict[str, Any]]]) -> list[Job]:
        if self._batch is not None:
            raise RuntimeError("map_array and submit_array cannot be called inside executor.batch(): use submit")
        if not calls:
            return []
        reading = parameters.read(self.parameters, self.cluster)
        options = dict(reading.options)
        if self.on is None:
            self._host_limits(options)
        if any(checkpointable(fn) for fn, _, _ in calls) and self.on is None:
            options.setdefault("preemptible", True)  # how gpuq brings a preempted job back (helpers' docstring)
        wrapped = [(Requeueable(fn) if checkpointable(fn) else fn, args, kwargs) for fn, args, kwargs in calls]
        name = options.pop("name", None) or functions.name_of(calls[0][0])
        executor = functions.Executor(
            options.pop("gpus"),
            options.pop("mem", None),
            options.pop("time_limit", None),
            name,
            options.pop("retries", 0),
            self.on,
            home=self.home,
            folder=self.folder,
            **options,
        )
        if len(wrapped) == 1:
            fn, args, kwargs = wrapped[0]
            return [Job(executor.submit(fn, *args, **kwargs).id, home=self.home)]
        return [Job(job.id, home=self.home) for job in executor.submit_batch(wrapped, throttle=reading.throttle)]

    def _host_limits(self, options: dict[str, Any]) -> None:
        """``cpus_per_task`` and ``mem_gb`` where this queue cannot hold a job to them (no cgroup controller
        delegated to gpuq, docs/containment.md): left out and said once, as submitit's LocalExecutor ignores
        them, rather than refused. Given as gpuq's own (``gpuq_cpus``, ``gpuq_ram``), gpuq refuses them."""
        asked = {
            key: name
            for key, name in (("cpus", "cpus_per_task"), ("ram", "mem_gb"))
            if key in options and f"gpuq_{key}" not in self.parameters
        }
        if not asked:
            return
        state = StateDir(Path(self.home).absolute()) if self.home is not None else StateDir.from_env()
        if host_limits(state.inventory) is None and ensure_daemon(state):  # a daemon says what it can as it starts
            deadline = time.monotonic() + 30  # a bound for a daemon that never gets there, not a timing
            while host_limits(state.inventory) is None and time.monotonic() < deadline:
                time.sleep(0.02)
        have, why = host_limits(state.inventory) or ((), "no gpuq daemon has said what it can enforce")
        for key, name in asked.items():
            controller = "cpu" if key == "cpus" else "memory"
            if controller not in have:
                del options[key]
                why_not = f"this queue cannot enforce a host {controller} limit ({why}); docs/containment.md"
                self._say({name: why_not}, 5)

    def _say(self, unused: dict[str, str], depth: int = 3) -> None:
        """Each parameter that does nothing here, said once, as a warning pointing at the caller's line ``depth``
        frames up (3: the caller of the constructor; 4: of update_parameters; 5: of submit or map_array)."""
        for key, why in unused.items():
            if key not in self._said:
                self._said.add(key)
                why = why.replace("{cluster}", self.on or "NAME")
                warnings.warn(f"{key} does nothing here: {why}", IgnoredParameter, stacklevel=depth)


class LocalExecutor(AutoExecutor):
    """submitit's ``LocalExecutor(folder)``: jobs in this workstation's gpuq queue, its parameters unprefixed
    (``timeout_min``, ``gpus_per_node``, ``visible_gpus``...)."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        max_num_timeout: int = 3,
        python: str | None = None,
        *,
        home: str | os.PathLike[str] | None = None,
    ) -> None:
        given = {"local_max_num_timeout": max_num_timeout} if max_num_timeout != 3 else {}
        super().__init__(folder, "local", home=home, **given, **({"local_python": python} if python else {}))

    def update_parameters(self, **kwargs: Any) -> None:
        self._update({f"local_{key}" if key in parameters.LOCAL else key: value for key, value in kwargs.items()})


@dataclass(frozen=True)
class JobPaths:
    """Where a job's files are: its call and result pickles (in the executor's folder), its gpuq log (stdout:
    both streams, as written) and its Python stderr."""

    folder: Path
    submitted_pickle: Path
    result_pickle: Path
    stdout: Path
    stderr: Path


class Job:
    """submitit's Job over gpuq's: ``job_id`` (gpuq's id, as a string), ``state`` (Slurm's names),
    ``result()``, ``results()``, ``exception()``, ``done()``, ``wait()``, ``cancel()``, ``stdout()``,
    ``stderr()``, ``paths``, ``submission()``. ``Job(folder, job_id)``, as submitit rebuilds a job in another
    process, or ``Job(job_id)``: gpuq finds its files from the id, so the folder is not needed."""

    num_tasks = 1

    def __init__(
        self,
        folder: str | os.PathLike[str] | int | None = None,
        job_id: str | int | None = None,
        *,
        home: str | os.PathLike[str] | None = None,
    ) -> None:
        given = folder if job_id is None and isinstance(folder, int) else job_id
        if given is None and folder is not None:
            raise BadInput(f"Job({folder!r}): give the job's id, Job(folder, job_id) or Job(job_id)")
        if given is not None and not str(given).isdigit():
            raise BadInput(f"job_id {given!r}: gpuq's job ids are numbers (an array's members have their own)")
        self._inner = None if given is None else functions.Job(int(given), home=home)  # None: in a batch() block

    @property
    def inner(self) -> functions.Job:
        if self._inner is None:
            raise RuntimeError("this job is queued when its executor.batch() block ends: use it after the block")
        return self._inner

    @inner.setter
    def inner(self, job: functions.Job) -> None:
        self._inner = job

    def __repr__(self) -> str:
        return f"Job<job_id={self._inner.id}>" if self._inner else "Job<queued when its batch() block ends>"

    @property
    def id(self) -> int:
        return self.inner.id

    @property
    def job_id(self) -> str:
        return str(self.inner.id)

    @property
    def state(self) -> str:
        return STATES[self.inner.state]

    def done(self, force_check: bool = False) -> bool:
        return self.inner.done()

    def cancel(self, check: bool = True) -> bool:
        """Cancel it; False if it had already ended."""
        return self.inner.cancel()

    def wait(self, timeout: float | None = None) -> None:
        functions.wait_all([self.inner], timeout)

    def result(self, timeout: float | None = None) -> Any:
        """Its return value, or the exception the function raised (the job's traceback as its cause), or
        UncompletedJobError naming what gpuq recorded when it left no result."""
        try:
            return self.inner.result(timeout)
        except UncompletedJobError:
            raise
        except functions.JobFailed as err:
            raise UncompletedJobError(err.record) from None

    def results(self) -> list[Any]:
        """One result per task: gpuq runs one task per job."""
        return [self.result()]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except Exception as err:
            return err
        return None

    async def async_result(self, poll_frequency: float = 1) -> Any:
        while not self.done():
            await asyncio.sleep(poll_frequency)
        return self.result()

    def task(self, index: int) -> Job:
        if index != 0:
            raise BadInput(f"task({index}): a gpuq job has one task, task(0)")
        return self

    def stdout(self) -> str:
        """The job's gpuq log: stdout and stderr, interleaved as written."""
        return self.inner.stdout()

    def stderr(self) -> str:
        """What the function's Python code wrote to sys.stderr (tracebacks, warnings, logging)."""
        return self.inner.stderr()

    @property
    def paths(self) -> JobPaths:
        folder, index = self.inner.location()
        return JobPaths(
            folder,
            runner.call_path(folder, index),
            runner.result_path(folder, index),
            Path(self.inner.record().log),
            runner.stderr_path(folder, index),
        )

    def submission(self) -> DelayedSubmission:
        """The call as it stands: the first, or the one a checkpoint left for the requeued run."""
        path = self.paths.submitted_pickle
        if path.stat().st_uid != os.getuid():  # unpickling runs code: only ever what the caller wrote
            raise NotPermitted(f"{path} belongs to uid {path.stat().st_uid}, not to you: it is not unpickled")
        import cloudpickle

        fn, args, kwargs = cloudpickle.loads(path.read_bytes())
        return DelayedSubmission(fn.fn if isinstance(fn, Requeueable) else fn, *args, **kwargs)
