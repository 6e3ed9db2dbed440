"""The job's side of a function job: load the call, run it, leave the return value or the exception.

    python -m gpuq_scheduler.jobs.functions.runner FOLDER INDEX

``FOLDER/INDEX.call.pkl`` holds ``(fn, args, kwargs)`` as cloudpickle wrote it in the submitter's process;
the runner calls it in the job's cwd and environment (gpuq gave it both, and its GPUs) and writes
``FOLDER/INDEX.result.pkl``: ``("value", value)`` or ``("error", exception, traceback text)``, then exits 0
or 1, so gpuq records the job succeeded or failed (and retries it as asked). What the job's Python code
writes to ``sys.stderr`` (tracebacks, warnings, logging) goes to its gpuq log as usual and, apart, to
``FOLDER/INDEX.stderr`` for ``Job.stderr()``; what other programs or C code write to file descriptor 2 is
in the log only.

A job killed before it returns (out of memory, time limit, cancel, lost GPU) leaves no result file;
``Job.result()`` then says what gpuq recorded. Only the folder's owner ever unpickles what is in it.

The checkpoint hook, as submitit's ``Checkpointable``: a --preemptible job that gpuq requeues (it cannot be
suspended) gets its preemption signal first ($GPUQ_PREEMPT_SIGNAL, SIGUSR1 by default). If the function is an
object with a ``checkpoint(*args, **kwargs)`` method, the runner calls it then, with the call's arguments: it
returns the call to make when the job runs again (``Resubmit(fn, *args, **kwargs)``), or None for the same
call. That call replaces ``INDEX.call.pkl``, and the runner exits at once (EXIT_PREEMPTED): gpuq requeues the
job, and the requeued run makes that call instead.
"""

from __future__ import annotations

import io
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

RUNNER = "gpuq_scheduler.jobs.functions.runner"
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: its state saved for the requeued run, which gpuq starts (the daemon decides)


class Resubmit:
    """What a ``checkpoint`` method returns: the call the requeued job makes instead of the first one."""

    def __init__(self, fn: Callable[..., object], /, *args: object, **kwargs: object) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs


class _Preempted(BaseException):
    """Raised in the function by the preemption signal's handler, once the resubmission is written: no
    ``except Exception`` in the function catches it."""


def call_path(folder: Path, index: str) -> Path:
    return folder / f"{index}.call.pkl"


def result_path(folder: Path, index: str) -> Path:
    return folder / f"{index}.result.pkl"


def stderr_path(folder: Path, index: str) -> Path:
    return folder / f"{index}.stderr"


def command(python: str, folder: Path, index: str) -> list[str]:
    """The job's command line: the submitter's interpreter, this module, where the call is."""
    return [python, "-m", RUNNER, str(folder), index]


def parse_command(words: Sequence[str]) -> tuple[Path, str] | None:
    """(folder, index) from a function job's command line; None for any other job."""
    words = list(words)
    if len(words) == 5 and words[1:3] == ["-m", RUNNER]:
        return Path(words[3]), words[4]
    return None


class _Copied(io.TextIOBase):
    """``sys.stderr`` that also writes a copy of everything to ``copy``, as it is written: no thread, no
    pipe, so a job that dies abruptly still has every line in its gpuq log (where gpuq reads why it died)."""

    def __init__(self, stream: TextIO, copy: TextIO) -> None:
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        written = self.stream.write(text)
        self.stream.flush()
        self.copy.write(text)
        self.copy.flush()
        return written

    def flush(self) -> None:
        self.stream.flush()
        self.copy.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def run(folder: Path, index: str) -> int:
    import cloudpickle

    result_path(folder, index).unlink(missing_ok=True)  # an earlier attempt's (a retry): not this one's
    copy = open(stderr_path(folder, index), "w", encoding="utf-8", errors="replace")  # noqa: SIM115
    stream, sys.stderr = sys.stderr, _Copied(sys.stderr, copy)
    try:
        fn, args, kwargs = cloudpickle.loads(call_path(folder, index).read_bytes())
        _on_preemption(folder, index, fn, args, kwargs)
        try:
            outcome: tuple[object, ...] = ("value", fn(*args, **kwargs))
            code = 0
        except _Preempted:
            return EXIT_PREEMPTED
        except Exception as err:  # the function's own failure: it goes back to the caller to raise
            text = traceback.format_exc()
            print(text, file=sys.stderr, end="", flush=True)
            outcome, code = ("error", err, text), 1
        try:
            data = cloudpickle.dumps(outcome)
        except Exception as err:  # a value or exception that cannot be pickled still ends with a reason
            problem = RuntimeError(f"the function's {outcome[0]} could not be pickled: {type(err).__name__}: {err}")
            remote = str(outcome[2]) if len(outcome) > 2 else ""
            data, code = cloudpickle.dumps(("error", problem, remote)), 1
        _write(result_path(folder, index), data)
        return code
    finally:
        sys.stderr = stream
        copy.close()


def _on_preemption(folder: Path, index: str, fn: object, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    """Where the function can be checkpointed, its preemption signal saves the call to make next and ends it."""
    checkpoint = getattr(fn, "checkpoint", None)
    name = os.environ.get("GPUQ_PREEMPT_SIGNAL", "")
    if not callable(checkpoint) or not name.startswith("SIG"):
        return
    import signal

    import cloudpickle

    def handle(signum: int, frame: object) -> None:
        again = checkpoint(*args, **kwargs)
        call = (fn, args, kwargs) if again is None else (again.fn, again.args, again.kwargs)
        _write(call_path(folder, index), cloudpickle.dumps(call))
        raise _Preempted

    signal.signal(getattr(signal, name), handle)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m gpuq_scheduler.jobs.functions.runner FOLDER INDEX", file=sys.stderr)
        return 2
    return run(Path(args[0]), args[1])


if __name__ == "__main__":
    sys.exit(main())
