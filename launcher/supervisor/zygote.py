"""A shim's zygote (``waiter.zygote``): a small interpreter, started at the shim's first waiter, that makes
the shim's later waiters as copies of itself, cloned into their jobs' cgroups as children of the shim.

A waiter cloned from the shim costs a copy of the shim, its teardown at the exec into a fresh interpreter, and
that interpreter's start: 10-12 ms of CPU on the 2-core VM (2026-11-27), for every job handed off, while the
jobs starting on the other GPUs want the same cores. A copy of the zygote costs a clone, and its exec at the
job's turn tears down less: its pages are still the zygote's (``bench/zygote.py``). Where the zygote cannot be
had, or dies, the shim clones its waiters itself, as before (``intocgroup``). Switched off, workload A's gap on
the 2-core VM grew by 3.4 ms (``bench/faststart.py``, 2026-11-29): it earns its lines there."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sys

from gpuq_scheduler.launcher.supervisor import spawncg, switches, waiter

_pid = 0  # the zygote's
_socket: socket.socket | None = None
_failed = False  # it could not start, or died: none again
_PATIENCE = 10.0  # seconds for a waiter's clone (about a millisecond): past that the zygote hangs, and is ended


def make(cgroup: str, fds: tuple[int, int, int, int]) -> int | None:
    """A waiter holding ``fds`` (go, report, details, output) cloned into ``cgroup``: its pid; None where the
    zygote cannot make it (not started yet, or it cannot be had: the caller clones the waiter instead). OSError
    if the clone failed (its errno)."""
    if switches.off("zygote"):
        return None
    if _socket is None:  # started now for the waiters after this one, which the shim clones meanwhile: the
        _start()  # zygote's own start takes longer than that (10-20 ms on the VM), and the job may come sooner
        return None
    where = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            socket.send_fds(_socket, [b"!"], [where, *fds])
        except OSError:  # it had died: nothing was made, and the shim clones its waiters from now on
            _stop()
            return None
        try:
            answer = _socket.recv(32)
        except OSError:  # a timeout: it hangs
            answer = b""
    finally:
        os.close(where)
    if not answer.lstrip(b"-").isdigit():
        # It died or hung while at it: a waiter may have been made, holding these descriptors. None is made
        # beside it: the job starts afresh at its turn, and that waiter ends at the end of its go pipe.
        _stop()
        raise OSError(errno.EIO, "the shim's zygote ended while it made a waiter")
    pid = int(answer)
    if pid < 0:
        raise OSError(-pid, os.strerror(-pid))
    return pid


def pid() -> int:
    """The zygote's pid (0: none was started)."""
    return _pid


def _start() -> None:
    global _pid, _socket, _failed
    if _failed:
        return
    ours, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    words = [sys.executable, "-I", "-S", waiter.__file__, "zygote", "3", "-", "-", waiter.WAITING]
    try:
        # Its own session: a signal to the shim's process group (a terminal's ^C) is not for it.
        _pid = os.posix_spawn(
            sys.executable,
            words,
            {},
            file_actions=[(os.POSIX_SPAWN_DUP2, its.fileno(), 3)],
            setsid=True,
            setsigdef=spawncg.to_default(),
        )
    except OSError:
        ours.close()
        _failed = True
        return
    finally:
        its.close()
    ours.settimeout(_PATIENCE)
    _socket = ours


def _stop() -> None:
    global _socket, _failed
    if _socket is not None:
        _socket.close()
        _socket = None
    with contextlib.suppress(ProcessLookupError):
        os.kill(_pid, signal.SIGKILL)  # one that hangs must not hang the shim's wait below
    with contextlib.suppress(ChildProcessError):
        os.waitpid(_pid, 0)
    _failed = True
