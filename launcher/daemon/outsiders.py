"""Memory held outside gpuq, named (#42): every few seconds the daemon names the processes on its GPUs that
are none of its jobs' (nor its MPS servers'), writes them for readers (``jobs.store.outside``), and, where
the admin configured a command (a shared queue's ``[shared] outside_notify``, a personal queue's
GPUQ_OUTSIDE_NOTIFY), runs it once for each newly seen process that is not a desktop's own, with
GPUQ_OUTSIDE_USER, _PID, _NAME, _GPU and _BYTES in its environment, as `--notify` commands get theirs. It
runs as the daemon's user (root on a shared queue: the admin's own command, like a cron job's), in a
session of its own; the daemon's pass reaps it.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping

from gpuq_scheduler.jobs.config import Shared
from gpuq_scheduler.jobs.store import outside
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.daemon.lives import Lives
from gpuq_scheduler.launcher.gpus.holders import Holder
from gpuq_scheduler.launcher.gpus.holders import outside as named
from gpuq_scheduler.launcher.gpus.mps import server_pids
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot

log = logging.getLogger("gpuq.outside")

LOOK_EVERY = 2.0  # seconds between looks: /proc is read per process found, and people read the result


class Outsiders:
    """What the last look found (to write only changes), who was told of already, the command, when next."""

    def __init__(self, command: str | None) -> None:
        self.command = command
        self.last: list[Holder] | None = None
        self.told: set[tuple[int, int]] = set()  # (pid, gpu) a command ran for
        self.next_look = 0.0


def command(shared: Shared | None, environ: Mapping[str, str]) -> str | None:
    if shared is not None:
        return shared.outside_notify
    return environ.get("GPUQ_OUTSIDE_NOTIFY") or None


def look(watch: Outsiders | None, lives: Lives, state: StateDir, now: float, snapshot: list[GpuSnapshot]) -> None:
    """Name what ``snapshot`` shows on the GPUs that is not the live jobs' (nor gpuq's MPS servers' in ``state``)."""
    if watch is None or now < watch.next_look:
        return
    watch.next_look = now + LOOK_EVERY
    ours = {pid for job in [*lives.running.values(), *lives.suspended.values()] for pid in job.pids}
    on_gpus = {pid for gpu in snapshot for pid in (gpu.processes or {})}
    ours |= server_pids(state.mps, on_gpus - ours)  # gpuq's fence: not outside
    found = named(snapshot, ours)
    if found != watch.last:
        watch.last = found
        outside.write(state, [h.to_json() for h in found])
    seen = {(h.pid, h.gpu) for h in found}
    watch.told &= seen  # a pid gone and reused later is news again
    for holder in found:
        if holder.desktop or holder.name == "?" or (holder.pid, holder.gpu) in watch.told:
            continue
        watch.told.add((holder.pid, holder.gpu))
        if watch.command:
            _tell(watch.command, holder)


def _tell(command: str, holder: Holder) -> None:
    env = dict(os.environ)
    env.update(
        GPUQ_OUTSIDE_USER=holder.user,
        GPUQ_OUTSIDE_PID=str(holder.pid),
        GPUQ_OUTSIDE_NAME=holder.name,
        GPUQ_OUTSIDE_GPU=str(holder.gpu),
        GPUQ_OUTSIDE_BYTES=str(holder.used),
    )
    try:
        subprocess.Popen(  # reaped by the pass (``Scheduler.reap``)
            ["/bin/sh", "-c", command],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as err:
        log.warning("outside_notify for pid %d failed to start: %s", holder.pid, err)
