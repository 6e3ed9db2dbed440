"""The fallback's view of a job, where no cgroup can be had (launcher.supervisor.containment): the session and
process group of its first process, and every process whose environment carries the job's marker
(``GPUQ_JOB_MARKER=<queue key>/<job id>``), found through /proc. A process that leaves all three escapes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

MARKER = "GPUQ_JOB_MARKER"  # in every job's environment: "<queue key>/<job id>"


def find(marker: str, leader: int, since: float) -> set[int]:
    """The fallback's view of a job: processes in its first process's session or group, or whose
    environment carries its marker. Only what this process may read: a root daemon's shim reads all.

    One pass over /proc at each job's end, kept cheap: raw reads, and an environment read only for a process born
    since the job was given out (``since``, in seconds since boot): its processes are all younger than that."""
    needle = f"{MARKER}={marker}\0".encode()
    found = set()
    me = os.getpid()
    born_after = since * _TICKS
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        stat = _raw(f"/proc/{name}/stat", 1024)
        try:
            fields = stat[stat.rfind(b")") + 2 :].split()
            state, pgid, session, born = fields[0], int(fields[2]), int(fields[3]), int(fields[19])
        except (ValueError, IndexError):
            continue
        if state == b"Z":
            continue
        if leader in (pgid, session):
            found.add(pid)
        elif born >= born_after:
            environ = _raw(f"/proc/{name}/environ", 1 << 20)
            if environ.startswith(needle) or b"\0" + needle in environ:
                found.add(pid)
    return found


def _raw(path: str, most: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        return os.read(fd, most)
    except OSError:
        return b""
    finally:
        os.close(fd)


_TICKS = os.sysconf("SC_CLK_TCK")


def kill(marker: str, leader: int, since: float, within: float) -> int:
    """SIGKILL, until none is found, every process the fallback finds of the job: how many there were."""
    ended: set[int] = set()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = find(marker, leader, since)
        if not alive:
            break
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        ended |= alive
        time.sleep(0.005)
    return len(ended)
