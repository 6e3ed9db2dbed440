"""Which job a process belongs to, by containment, never by the variables gpuq set in its environment
(``CUDA_VISIBLE_DEVICES``, ``GPUQ_JOB_ID``): a job can change those, not its cgroup.

A job is the cgroup v2 ``.../gpuq-<key>/job-<id>`` where gpuq can make one, else (the fallback) the
marker ``GPUQ_JOB_MARKER=<key>/<id>`` every process of the job inherits (``launcher.supervisor.containment``
makes both, and names them: ``queue_key``, ``MARKER``). ``<key>`` names the queue (its state directory), so a
process of another queue on the same machine is never taken for one of ours.

A cgroup is the kernel's word: only gpuq (root, or the user's delegated subtree) moves processes between
them. A marker is only an environment variable, which anyone can write: in a shared queue it is believed
only of a process whose owner is the job's (``uid_of``), so no user can pin their process on another's job.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gpuq_scheduler.launcher.supervisor.containment import queue_key as queue_key
from gpuq_scheduler.launcher.supervisor.marked import MARKER


def job_of(pid: int, key: str, uid_of: Callable[[int], int | None] | None = None) -> int | None:
    """The id of the job of queue ``key`` that process ``pid`` belongs to, or None: its cgroup's, else
    its marker's. ``uid_of`` (a shared queue): job id -> its owner's uid; a marker is then believed only
    of a process that owner runs. None too for a process that is gone or cannot be read."""
    job = _from_cgroup(pid, key)
    if job is not None:
        return job
    job = _from_marker(pid, key)
    if job is None or uid_of is None:
        return job
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    return job if owner == uid_of(job) else None


def _from_cgroup(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as handle:
            lines = handle.read().split(b"\n")
    except OSError:
        return None
    queue = f"gpuq-{key}".encode()
    for line in lines:
        if not line.startswith(b"0::"):
            continue
        parts = line[3:].split(b"/")
        for at, part in enumerate(parts[:-1]):
            following = parts[at + 1]
            if part == queue and following.startswith(b"job-") and following[4:].isdigit():
                return int(following[4:])
    return None


def _from_marker(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read()
    except OSError:
        return None
    needle = f"{MARKER}={key}/".encode()
    if environ.startswith(needle):
        at = len(needle)
    else:
        found = environ.find(b"\0" + needle)
        if found < 0:
            return None
        at = found + 1 + len(needle)
    value = environ[at:].split(b"\0", 1)[0]
    return int(value) if value.isdigit() else None
