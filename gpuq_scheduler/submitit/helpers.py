"""submitit's ``helpers`` over gpuq: ``Checkpointable``, ``DelayedSubmission``, ``as_completed``, ``CommandFunction``.

Checkpointing rides on gpuq's preemption (docs/suspend.md). A job submitted with a callable that has a
``checkpoint`` method (``Checkpointable`` gives one) is sent ``--preemptible``: when a more urgent job needs
its GPUs, gpuq suspends it where it can (it stops and later goes on where it was, and nothing is called);
where it cannot, gpuq sends its preemption signal, the job's runner calls ``checkpoint(*args, **kwargs)``
with the call's own arguments, and the ``DelayedSubmission`` it returns is the call the requeued job makes.

This module is loaded inside jobs (unpickling a ``Checkpointable`` imports it), so it stays light: the
standard library and gpuq's runner, nothing that reads the queue until ``as_completed`` is called.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gpuq_scheduler.jobs.functions.runner import Resubmit

if TYPE_CHECKING:
    from gpuq_scheduler.jobs.functions.executor import Job as GpuqJob


class _Job(Protocol):  # submitit's Job (executor.Job), which imports this module
    @property
    def id(self) -> int: ...

    @property
    def inner(self) -> GpuqJob: ...


J = TypeVar("J", bound=_Job)


class DelayedSubmission:
    """A call to make later: what ``checkpoint`` returns, the call the requeued job makes."""

    def __init__(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        self.function, self.args, self.kwargs = function, args, kwargs

    def result(self) -> Any:
        """Make the call here, now."""
        return self.function(*self.args, **self.kwargs)

    def set_timeout(self, timeout_min: float, max_num_timeout: int) -> None:
        """submitit's requeue-on-timeout budget: gpuq keeps the job's own time limit and calls ``checkpoint``
        on preemption alone, so there is nothing to set (docs/usage.md, From submitit)."""


class Checkpointable:
    """A callable whose preempted job comes back: ``checkpoint`` resubmits it as it is now, with the same
    arguments; override it to save state first or to resubmit something else."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__new__(cls)
        if not callable(instance):
            raise TypeError(f"{cls.__name__} derives from Checkpointable: give it a __call__ method")
        return instance

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        return DelayedSubmission(self, *args, **kwargs)  # type: ignore[arg-type]  # callable: __new__ checks


class NotRequeued(RuntimeError):
    """Raised by a requeued run whose ``checkpoint`` returned None: submitit requeues nothing then."""


def _not_requeued(name: str) -> None:
    raise NotRequeued(f"{name}'s checkpoint() returned None when the job was preempted: it is not run again")


def checkpointable(fn: object) -> bool:
    return callable(getattr(fn, "__submitit_checkpoint__", None) or getattr(fn, "checkpoint", None))


class Requeueable:
    """What the job runs for a callable with a checkpoint: the callable itself, and a ``checkpoint`` in the
    runner's terms (a ``Resubmit``) made from submitit's (a ``DelayedSubmission``, or None: not again)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Resubmit:
        hook = getattr(self.fn, "__submitit_checkpoint__", None) or self.fn.checkpoint  # type: ignore[attr-defined]
        again = hook(*args, **kwargs)
        if again is None:
            return Resubmit(_not_requeued, type(self.fn).__name__)
        fn = again.fn if isinstance(again, Resubmit) else again.function
        return Resubmit(Requeueable(fn) if checkpointable(fn) else fn, *again.args, **again.kwargs)


def as_completed(jobs: Sequence[J], timeout: float | None = None, poll_frequency: float = 10) -> Iterator[J]:
    """Yield each job as it ends, first ended first. gpuq reads the state directory, not Slurm's accounting,
    so it looks more often than ``poll_frequency`` (at most every 0.25 s); TimeoutError after ``timeout``."""
    from gpuq_scheduler.jobs.functions import executor

    by_id = {job.id: job for job in jobs}
    for ended in executor.as_completed([job.inner for job in jobs], timeout=timeout):
        yield by_id[ended.id]


class CommandFailed(RuntimeError):
    """A ``CommandFunction``'s command exited with an error: the message ends with its stderr."""


class CommandFunction:
    """A command as a function (run it inside a job with ``executor.submit(CommandFunction([...]))``):
    calling it runs the command with the call's arguments appended (keywords as ``--key=value``) and returns
    its stdout; a failure raises CommandFailed with its stderr."""

    def __init__(
        self,
        command: Sequence[str],
        verbose: bool = True,
        ret_stdout: bool = True,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        if isinstance(command, str):
            raise TypeError("CommandFunction takes the command as a list of words, not one string")
        self.command, self.verbose, self.ret_stdout, self.cwd, self.env = list(command), verbose, ret_stdout, cwd, env

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        words = [*self.command, *map(str, args), *(f"--{key}={value}" for key, value in kwargs.items())]
        done = subprocess.run(words, cwd=self.cwd, env=self.env, capture_output=True, text=True)
        if self.verbose and done.stdout:
            print(done.stdout, end="", flush=True)
        if done.returncode != 0:
            raise CommandFailed(f"{' '.join(words)} exited {done.returncode}:\n{done.stderr}")
        return done.stdout if self.ret_stdout else ""
