"""Files a successor hand-off writes, made when the successor is staged with a shim (``launcher.supervisor.shim``)
rather than between one job's end and the next one's start on its GPUs: creating a file costs far more than
writing into one that exists, and that moment is what the hand-off is for.

A shim runs one job at a time, so these are the shim process's own: the running job's exit file and the
staged job's pid file, as the temp files ``write_atomic`` fills and renames in, and the staged job's log,
opened. What is not made ahead is made when written.
"""

from __future__ import annotations

import contextlib
import os

from gpuq_scheduler.jobs.accounts import Account
from gpuq_scheduler.jobs.store.statedir import new_temp, write_atomic
from gpuq_scheduler.launcher.supervisor.processes import open_log

_temps: dict[str, tuple[int, str]] = {}  # a file to write -> its temp file (``new_temp``): descriptor, name
_logs: dict[str, int] = {}  # a staged job's log -> the log, open for appending


RESERVED = 4096  # bytes: an exit or pid file holds a few hundred


def reserve(*paths: str) -> None:
    """Make the temp files for ``paths`` now, their space allocated, so that writing them later cannot fail
    on a full disk: a job that succeeded while its own output filled the disk is still recorded as such."""
    for path in paths:
        if path in _temps:
            continue
        with contextlib.suppress(OSError):  # made when written instead
            _temps[path] = new_temp(path)
            os.posix_fallocate(_temps[path][0], 0, RESERVED)


def make(exit_file: str, pid_file: str, log: str, account: Account | None, log_group: int | None) -> None:
    """Make the running job's ``exit_file`` (kept if reserved) and the staged job's ``pid_file`` and ``log``."""
    kept = _temps.pop(exit_file, None)
    drop()
    if kept is not None:
        _temps[exit_file] = kept
    reserve(exit_file, pid_file)
    with contextlib.suppress(OSError):  # made when written instead
        _logs[log] = open_log(log, account, log_group)


def log(path: str) -> int | None:
    """The log at ``path`` if it was opened ahead (the caller owns it now)."""
    return _logs.pop(path, None)


def write(path: str, data: bytes) -> None:
    """``write_atomic(path, data, durable=False)``, into the temp file made ahead for it if there is one."""
    opened = _temps.pop(path, None)
    if opened is not None and len(data) <= RESERVED:
        with contextlib.suppress(OSError):
            os.ftruncate(opened[0], len(data))  # inside the space reserved: written over, nothing new is allocated
    write_atomic(path, data, durable=False, opened=opened)


def drop() -> None:
    """Let go of what was made for a successor that will not start here: temp files go, and its log if empty."""
    for fd, tmp in _temps.values():
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        os.close(fd)
    for path, fd in _logs.items():
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_size == 0:
                os.unlink(path)
        os.close(fd)
    _temps.clear()
    _logs.clear()
