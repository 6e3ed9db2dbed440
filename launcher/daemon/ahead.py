"""Files a successor hand-off writes, made when the successor is staged with a shim (``launcher.daemon.shim``)
rather than between one job's end and the next one's start on its GPUs: on the 2-core VM creating a file costs
20-350 us of CPU, writing into one that exists ~7, and that moment is what the hand-off is for.

A shim runs one job at a time, so these are the shim process's own: the running job's exit file and the
staged job's pid file, as temp files that ``write`` fills and renames in (as ``write_atomic`` would have
written them), and the staged job's log, opened. What is not made ahead is made when written.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from gpuq_scheduler.jobs.accounts import Account
from gpuq_scheduler.jobs.store.statedir import write_atomic
from gpuq_scheduler.launcher.daemon.processes import open_log

_made: dict[str, tuple[int, str | None]] = {}  # path -> (open descriptor, its temp name; None for a log)


def make(exit_file: Path, pid_file: Path, log: Path, account: Account | None, log_group: int | None) -> None:
    """Make the running job's ``exit_file`` and the staged job's ``pid_file`` and ``log``."""
    drop()
    with contextlib.suppress(OSError):  # made when written instead
        for path in (exit_file, pid_file):
            temp = _temp(path)
            _made[os.fspath(path)] = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), temp
        _made[os.fspath(log)] = open_log(log, account, log_group), None


def log(path: Path) -> int | None:
    """The log at ``path`` if it was opened ahead (the caller owns it now)."""
    made = _made.pop(os.fspath(path), None)
    return None if made is None else made[0]


def write(path: Path, data: bytes) -> None:
    """``write_atomic(path, data, durable=False)``, into the temp file made ahead for it if there is one."""
    fd, temp = _made.pop(os.fspath(path), (-1, None))
    if temp is not None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.close(fd)
            os.replace(temp, path)
            return
        except OSError:
            with contextlib.suppress(OSError):
                os.close(fd)
    write_atomic(path, data, durable=False)  # and if that fails too, it says why


def drop() -> None:
    """Let go of what was made for a successor that will not start here: temp files go, and its log if empty."""
    for path, (fd, temp) in _made.items():
        with contextlib.suppress(OSError):
            if temp is not None or os.fstat(fd).st_size == 0:
                os.unlink(temp or path)
        os.close(fd)
    _made.clear()


def _temp(path: Path) -> str:
    """The temp name ``write_atomic`` gives ``path`` in this process."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
