"""A job's output on its way from the pipe its shim reads to ``logs/<id>.log``.

Kept up to ``GPUQ_LOG_LIMIT`` bytes (default 1 GiB; read from the daemon's environment, which the shim
inherits). Past the limit one line says so and the rest is discarded, still read so that the job never
blocks on a full pipe: a job printing in a loop cannot fill the disk unnoticed.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Mapping

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.units import parse_size

LOG_LIMIT = 1 << 30  # bytes of output kept per job unless GPUQ_LOG_LIMIT says otherwise
CHUNK = 1 << 20  # read the job's output this much at a time (and ask for a pipe this big)
_DRAIN_IDLE = 2.0  # after the job ended: stop reading once its pipe stays quiet this long...
_DRAIN_MAX = 10.0  # ...or after this long, if something that escaped its process group keeps writing


def log_limit(environ: Mapping[str, str] | None = None) -> int:
    """Bytes of a job's output kept in its log: GPUQ_LOG_LIMIT (bytes, or a size like 512M), else 1 GiB."""
    raw = (os.environ if environ is None else environ).get("GPUQ_LOG_LIMIT", "").strip()
    if raw.isdigit():
        return int(raw)
    try:
        return parse_size(raw) if raw else LOG_LIMIT
    except BadInput:
        return LOG_LIMIT  # a shim has nobody to tell: keep the default rather than no limit at all


class JobLog:
    """A job's output on its way from the pipe to the log file: kept up to a limit, then discarded."""

    def __init__(self, fd: int, limit: int, copy: int | None = None) -> None:
        self.fd = fd
        self.copy = copy  # --output's file, the user's: written alike; a failure there only ends the copy
        self.limit = limit
        self.room = limit
        self.full = False
        self.broken = False  # a write failed (a full disk): keep reading, keep nothing
        self.ends_line = True

    def pump(self, pipe: int) -> bool:
        """Copy what the pipe holds now. False at end of file (no process holds its write end)."""
        data = os.read(pipe, CHUNK)
        if not data:
            return False
        self.take(data)
        return True

    def drain(self, pipe: int) -> None:
        """Read until end of file, or until the pipe stays quiet: the job's process group is gone by now,
        but a process that left it (a daemon it started) may hold the pipe open for ever."""
        give_up = time.monotonic() + _DRAIN_MAX
        while time.monotonic() < give_up:
            ready, _, _ = select.select([pipe], [], [], _DRAIN_IDLE)
            if not ready or not self.pump(pipe):
                return

    def take(self, data: bytes) -> None:
        if self.full:
            return
        kept = data[: self.room]
        self._write(kept)
        self.room -= len(kept)
        if len(kept) < len(data):
            self.full = True
            marker = f"gpuq: log limit of {self.limit} bytes reached; further output discarded\n".encode()
            self._write(marker if self.ends_line else b"\n" + marker)

    def _write(self, data: bytes) -> None:
        if self.copy is not None:
            copied = memoryview(data)
            try:
                while copied:
                    copied = copied[os.write(self.copy, copied) :]
            except OSError:  # the log keeps it all; the user's file stops here
                os.close(self.copy)
                self.copy = None
        view = memoryview(data)
        while view and not self.broken:
            try:
                view = view[os.write(self.fd, view) :]
            except OSError:
                self.broken = True
        if data:
            self.ends_line = data.endswith(b"\n")


def append_line(path: str, line: str) -> None:
    """Add one line of gpuq's to the end of a job's log, once its shim has closed it (a cancel, a time limit,
    as Slurm writes its own). Never creates a log, never follows a link (``logs/`` is root's in a shared
    queue, the file the user's); a log that cannot be written is left as it is."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, line.encode(errors="replace") + b"\n")
    except OSError:
        pass
    finally:
        os.close(fd)
