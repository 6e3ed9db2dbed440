"""How a shim starts its job's first process: where the job has a cgroup, born inside it, never moved.

A job handed off to this shim was born ahead, while the job before it ran (``ahead.clone``), and only execs
now, or, where the C library spawns into a cgroup (``spawncg``), had its cgroup made and its spawn built then,
and only runs that now; any other job is spawned or cloned into its cgroup now (``intocgroup``), or, where
that cannot be done, the shim moves into the job's cgroup to spawn it and back out. Without a cgroup (the
fallback) it is a plain spawn. The shim is never in the job's cgroup once ``start`` returns.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from typing import Any

from gpuq_scheduler.launcher.supervisor import ahead, containment, intocgroup
from gpuq_scheduler.launcher.supervisor.joblog import CHUNK
from gpuq_scheduler.launcher.supervisor.processes import reaper, spawn, spawn_ready


class NotStarted(Exception):
    """What could not be made or run (the program, or the job's cgroup), and why."""

    def __init__(self, what: str, err: OSError) -> None:
        super().__init__(what)
        self.what, self.why = what, err.strerror or str(err)


def start(
    job_id: int,
    box: containment.Box | None,
    name: str,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    credentials: dict[str, Any],
    handed: bool,
) -> tuple[int, float | None, Callable[[], int], int]:
    """Start job ``job_id``'s first process (``name``: its program as the user gave it): its pid, start time,
    what reaps it, and the read end of its stdout and stderr. ``handed``: it follows the job that just ended
    here, and may have been born ahead. NotStarted says what could not be made or run."""
    waiting = ahead.waiting(job_id) if handed else None
    made = ahead.made(job_id) if handed else None  # its cgroup made and the C library's spawn into it built
    if waiting is not None:
        try:
            return waiting.born.go(), waiting.start, reaper(waiting.born.pid), waiting.output
        except intocgroup.Gone:  # it ended before its turn (a signal): started afresh below
            os.close(waiting.output)
        except OSError as err:
            os.close(waiting.output)
            raise NotStarted(name, err) from None
    ready = None
    if made is not None:
        (out_read, out_write), ready = made.output, made.ready
    else:
        out_read, out_write = output_pipe()
    what, back, cgroup = name, None, None if box is None else box.cgroup
    try:
        if box is not None and cgroup is not None and ready is None:
            what = f"its cgroup {cgroup}"
            containment.make(box)
            what = name
        try:
            if ready is not None:
                pid, started, reap = spawn_ready(ready)
            else:
                pid, started, reap = spawn(argv, cwd, env, credentials, out_write, cgroup)
        except intocgroup.Unsupported:
            assert box is not None
            what = f"its cgroup {cgroup}"
            back = containment.enter(box)
            what = name
            pid, started, reap = spawn(argv, cwd, env, credentials, out_write)
    except OSError as err:
        os.close(out_read)
        if ready is not None:
            ready.close()
        with contextlib.suppress(OSError):
            containment.leave(back)  # before the cgroup is removed: this shim must not be in it then
        back = None
        raise NotStarted(what, err) from None
    finally:
        containment.leave(back)
        os.close(out_write)  # only the job's processes hold it now: end of file means they are all gone
    return pid, started, reap, out_read


def output_pipe() -> tuple[int, int]:
    """The pipe a job writes its stdout and stderr into, for the shim to copy into its log."""
    out_read, out_write = os.pipe()
    with contextlib.suppress(OSError):
        fcntl.fcntl(out_read, fcntl.F_SETPIPE_SZ, CHUNK)  # fewer wake-ups for a chatty job
    return out_read, out_write
