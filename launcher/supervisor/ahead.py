"""Files a successor hand-off writes, made when the successor is staged with a shim (``launcher.supervisor.shim``)
rather than between one job's end and the next one's start on its GPUs: creating a file costs far more than
writing into one that exists, and that moment is what the hand-off is for.

A shim runs one job at a time, so these are the shim process's own: the running job's exit file and the
staged job's exit and pid files, as the temp files ``write_atomic`` fills and renames in, the staged job's log, opened,
and, where the job has a cgroup, its cgroup and its first process, born in it and waiting to exec
(``intocgroup.Born``): the clone, a copy of the shim, is the dearest part of a start. Where the C library
spawns into a cgroup (``spawncg``) and the job runs as the shim's user, its cgroup is made and its spawn's C
structures built ahead (``spawncg.Prepared``), and only ``posix_spawn`` runs at its turn: cheaper than the
waiter's exec. What is not made ahead is made when
written or started.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuq_scheduler.jobs.accounts import Account
from gpuq_scheduler.jobs.store.atomic import new_temp, write_atomic
from gpuq_scheduler.launcher.supervisor import containment, intocgroup, spawncg
from gpuq_scheduler.launcher.supervisor.processes import born_ahead, open_log


@dataclass(frozen=True)
class Waiting:
    """A staged job's first process, born in its cgroup, waiting to exec."""

    born: intocgroup.Born
    start: float | None  # its start time (``processes.start_time``): the job's process is this one
    output: int  # the read end of its stdout and stderr
    box: containment.Box


@dataclass(frozen=True)
class Built:
    """A job's cgroup, made, and the C library's spawn into it built (``spawncg.Prepared``), writing to its
    output pipe: where the job runs as the shim's user and the C library spawns into a cgroup, what is made
    ahead instead of a waiter."""

    box: containment.Box
    output: tuple[int, int]  # its stdout and stderr: read end, write end
    ready: spawncg.Prepared

    def close(self) -> None:
        self.ready.close()
        for fd in self.output:
            os.close(fd)


_temps: dict[str, tuple[int, str]] = {}  # a file to write -> its temp file (``new_temp``): descriptor, name
_logs: dict[str, int] = {}  # a staged job's log -> the log, open for appending
_waiting: dict[int, Waiting] = {}  # a staged job's id -> its first process
_made: dict[int, Built] = {}  # a staged job's id -> its spawn built


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


def make(
    exit_file: str, next_exit: str, next_pid: str, log: str, account: Account | None, log_group: int | None
) -> None:
    """Make the running job's ``exit_file`` (kept if reserved) and the staged job's exit file, pid file and
    ``log``: the staged job's exit file too, so that nothing is created when it starts (a file's creation was
    the dearest step between one job's end and the next one's start: 0.3-0.8 ms on the 2-core VM)."""
    kept = _temps.pop(exit_file, None)
    drop()
    if kept is not None:
        _temps[exit_file] = kept
    reserve(exit_file, next_pid, next_exit)
    with contextlib.suppress(OSError):  # made when written instead
        _logs[log] = open_log(log, account, log_group)


def clone(
    job_id: int,
    box: containment.Box,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    credentials: dict[str, Any],
    output: tuple[int, int],
) -> None:
    """Make the staged job's cgroup and clone its first process into it, writing to the pipe ``output`` (read
    end, write end; both taken over). Where that fails the job is started when its turn comes, which says why."""
    out_read, out_write = output
    assert box.cgroup is not None
    if not credentials and spawncg.usable():  # spawned at its turn by the C library: no waiter's exec to pay
        try:
            containment.make(box)
            ready = intocgroup.ready(box.cgroup, argv, cwd, env, out_write)
        except OSError:  # started afresh at its turn, which says why if it still cannot
            os.close(out_read)
            os.close(out_write)
            containment.discard(box)  # a drop must not leave it behind; its turn makes it again
            return
        _made[job_id] = Built(box, output, ready)
        return
    cgroup = box.cgroup
    try:
        containment.make(box)
    except OSError:
        os.close(out_read)
        os.close(out_write)
        return
    made = _born(lambda: intocgroup.prepare(cgroup, argv, cwd, env, credentials, out_write), box, output)
    if made is None:
        containment.discard(box)  # as above: a drop must not leave it behind
    else:
        _waiting[job_id] = made


def _born(make: Callable[[], intocgroup.Born], box: containment.Box, output: tuple[int, int]) -> Waiting | None:
    """The waiter ``make`` clones, writing to the pipe ``output`` (both ends taken over); None if it cannot be
    (the job is started when its turn comes, which says why if it still cannot)."""
    out_read, out_write = output
    try:
        born, start = born_ahead(make)
    except (OSError, intocgroup.Unsupported):
        os.close(out_read)
        return None
    finally:
        os.close(out_write)  # only the job's processes hold it now: end of file means they are all gone
    return Waiting(born, start, out_read, box)


def let_go(job: Waiting) -> None:
    """End a waiter that has run nothing (its job was dropped) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(job.born.pid, signal.SIGKILL)  # not yet reaped: the pid is still this one's
    job.born.abandon()
    os.close(job.output)


def waiting(job_id: int) -> Waiting | None:
    """Job ``job_id``'s first process if it was born ahead (the caller owns it now)."""
    return _waiting.pop(job_id, None)


def made(job_id: int) -> Built | None:
    """Job ``job_id``'s spawn, if its cgroup was made and its spawn into it built ahead, to run at its turn
    (the caller owns it now)."""
    return _made.pop(job_id, None)


def log(path: str) -> int | None:
    """The log at ``path`` if it was opened ahead for a staged job (the caller owns it now)."""
    return _logs.pop(path, None)


def write(path: str, data: bytes) -> None:
    """``write_atomic(path, data, durable=False)``, into the temp file made ahead for it if there is one."""
    opened = _temps.pop(path, None)
    if opened is not None and len(data) <= RESERVED:
        with contextlib.suppress(OSError):
            os.ftruncate(opened[0], len(data))  # inside the space reserved: written over, nothing new is allocated
    write_atomic(path, data, durable=False, opened=opened)


def drop() -> None:
    """Let go of what was made for a successor that will not start here: temp files go, its log if empty, and
    its first process and cgroup."""
    for fd, tmp in _temps.values():
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        os.close(fd)
    for path, fd in _logs.items():
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_size == 0:
                os.unlink(path)
        os.close(fd)
    for job in _waiting.values():
        let_go(job)
        containment.end(job.box, -1)  # its cgroup goes: the job may start elsewhere, in a cgroup made afresh
    for built in _made.values():
        built.close()
        containment.end(built.box, -1)
    _temps.clear()
    _logs.clear()
    _waiting.clear()
    _made.clear()
