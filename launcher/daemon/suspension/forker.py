"""The server that forks suspend helpers for a daemon with threads (``launcher.daemon.suspension.suspender``), and keeps
one forked ahead, the driver already open in it: a *spare*.

A fresh process's ``cuInit`` costs 10-20 ms while some process holds the driver, and 180-230 ms when none
does (a lent H200, persistence mode on, 2026-11-27: bench/checkpoint_probe.py; holding only NVML does not
help). A suspended job is no longer such a process, so the helper that resumed a job alone on its GPU paid
the slow one: 196 ms of a 1 s restore. The spare, opened while the last helper worked, holds the driver
meanwhile and begins its order's calls at once. It is still one helper per order, in a session of its own,
so what the daemon knows of a helper (its pid, which a restarted daemon waits for) is unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuq_scheduler.launcher.daemon.suspension.suspender import Opened, act, answer, fork_helper, forked
from gpuq_scheduler.launcher.supervisor.processes import start_time


class Forker:
    """A server of one thread that forks the helpers for a daemon that has threads: ``python -m`` this module
    ``FD``, given one end of a socket pair. Each order comes with the write end of its result pipe
    (SCM_RIGHTS); the server hands both to its spare (or, with none that fits, forks a helper), closes its
    copy, answers with the helper's pid, and forks the next spare. It exits when the daemon's end closes (the
    daemon stopped or died), and its spare with it; the helpers, in sessions of their own, go on."""

    ANSWER_WITHIN = 5.0  # seconds: a server that does not answer is given up for a fresh interpreter

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(self.ANSWER_WITHIN)
        self._socket: socket.socket | None = ours

    def fork(self, order: dict[str, Any], wake: str, pipe: int) -> tuple[int, float]:
        """The pid and start time of a helper given ``order`` with ``pipe`` as its result's way out, or 0 if
        the server is gone or does not answer (it is then given up: the caller execs one instead)."""
        if self._socket is None:
            return 0, 0.0
        try:
            socket.send_fds(self._socket, [json.dumps({"order": order, "wake": wake}).encode()], [pipe])
            pid, started = self._socket.recv(64).split()
            return int(pid), float(started)
        except (OSError, ValueError):
            self.close()
            return 0, 0.0

    @property
    def alive(self) -> bool:
        return self._socket is not None and self.process.poll() is None

    def close(self) -> None:
        """Let the server go (it exits at its end of the pair's close); helpers it forked go on."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=0)


class Spare:
    """A helper forked ahead of its order, with the checkpoint of the last order's kind open (the driver's:
    held, so that no helper pays its first ``cuInit``), waiting on its end of a socket pair for an order and
    its result pipe; at end of file it exits."""

    def __init__(self, kind: tuple[bool, str | None]) -> None:
        self.kind = kind
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.pid = forked(theirs.fileno(), lambda: _wait_for_order(theirs.fileno(), kind))
        finally:
            theirs.close()
        self.started = start_time(self.pid) or 0.0
        self._socket = ours

    def give(self, message: bytes, pipe: int) -> int:
        """Hand it an order: its pid, or 0 if it is gone (the order is then forked afresh)."""
        try:
            socket.send_fds(self._socket, [message], [pipe])
            return self.pid
        except OSError:
            return 0
        finally:
            self._socket.close()

    def close(self) -> None:
        self._socket.close()


def _wait_for_order(fd: int, kind: tuple[bool, str | None]) -> None:
    opened = Opened.open(*kind)
    order = socket.socket(fileno=fd)
    message, fds, _, _ = socket.recv_fds(order, 1 << 16, 1)
    if not message or len(fds) != 1:
        return  # let go: the server has ended
    data = json.loads(message)
    answer(fds[0], act(data["order"], opened), data["wake"])


def serve(fd: int) -> int:
    """The Forker's loop: one order at a time, each given to the spare or forked at once (the helpers run
    beside each other), then the next spare forked."""
    server = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its helpers are reaped by the kernel (none is waited for)
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text("gpuq-forker")
    spare: Spare | None = None
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(server, 1 << 16, 1)
        except OSError:
            message, fds = b"", []
        if not message or len(fds) != 1:
            if spare is not None:
                spare.close()
            return 0  # the daemon's end closed
        data = json.loads(message)
        order = data["order"]
        kind = (bool(order.get("fake")), order.get("usage"))
        pid = spare.give(message, fds[0]) if spare is not None and spare.kind == kind else 0
        started = spare.started if pid and spare is not None else 0.0
        if spare is not None and not pid:
            spare.close()
        spare = None
        if not pid:
            with contextlib.suppress(OSError):  # none forked: pid 0, and the daemon execs one instead
                pid = fork_helper(order, fds[0], data["wake"])
                started = start_time(pid) or 0.0  # at once: a helper with little to do ends, and goes, soon
        os.close(fds[0])
        server.send(f"{pid} {started}".encode())
        with contextlib.suppress(OSError):  # no spare: the next order is forked
            spare = Spare(kind)  # after the answer, which waits on no driver's cuInit


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
