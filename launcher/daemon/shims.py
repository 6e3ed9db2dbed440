"""The daemon's shims: idle ones, kept so that a launch costs a message rather than a fork, and the one
supervising each running job this daemon started. This is the daemon's side of each: it forks the shim and
writes down its pipe; what the shim does, and what the messages are, is ``launcher.supervisor.shim``."""

from __future__ import annotations

import contextlib
import os
import signal

from gpuq_scheduler.launcher.supervisor.processes import is_alive, start_time
from gpuq_scheduler.launcher.supervisor.shim import CANCEL, DROP, JOB, NEXT, Launch, message, serve


class Shim:
    """The daemon's handle on one shim, a forked supervisor (``launcher.supervisor.shim``): its pid and the
    write end of its pipe. Idle until ``start`` sends it a job."""

    def __init__(self) -> None:
        read_end, self._pipe = os.pipe()
        # A SIGTERM must not meet the daemon's handler in the child (it would wake the daemon for nothing):
        # blocked across the fork, the child unblocks it once its own dispositions are in place.
        self.pid = -1
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            self.pid = os.fork()
            if self.pid == 0:  # the child: never returns into the daemon's code
                code = 70
                try:
                    os.close(self._pipe)
                    code = serve(read_end)
                finally:
                    os._exit(code)
        finally:
            if self.pid != 0:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.close(read_end)
        self.started = start_time(self.pid) or 0.0
        self.jobs = 0  # how many it was sent: one that ran a job has made its own the memory a launch touches

    def start(self, launch: Launch) -> None:
        """Send the job, recorded as running by now: the shim starts it. A shim that died meanwhile is found
        by the daemon's liveness check (the job is queued again); raising here would hold back other jobs."""
        self.jobs += 1
        self._write(message(JOB, launch))

    def stage(self, launch: Launch) -> None:
        """Send the job to start once the one this shim runs ends (its exit file will say whether it did)."""
        self._write(message(NEXT, launch))

    def cancel(self, job_id: int) -> bool:
        """Stop job ``job_id`` if this shim runs it (SIGTERM to its group, SIGKILL after the grace period), or
        drop it if it is staged here. Down the pipe, after the job itself, not as a signal: a signal could
        reach the shim before it has read its job, or, late, reach the next job it is given. False if the shim
        is gone."""
        return self._write(message(CANCEL, job_id))

    def drop(self, job_id: int) -> bool:
        """Take back job ``job_id`` if it is staged here and has not started; a running one carries on."""
        return self._write(message(DROP, job_id))

    def _write(self, message: bytes) -> bool:
        view = memoryview(message)
        try:
            while view:
                view = view[os.write(self._pipe, view) :]
        except OSError:
            return False
        return True

    def alive(self) -> bool:
        return is_alive(self.pid, self.started)

    def abandon(self) -> None:
        """Close the pipe: the shim exits once it has no job."""
        with contextlib.suppress(OSError):
            os.close(self._pipe)


class Shims:
    """The daemon's shims: idle ones (their jobs ended, or forked ahead of need), and the one supervising each
    running job this daemon started. A shim is idle or busy with one job, never both."""

    def __init__(self) -> None:
        self._idle: list[Shim] = []
        self._busy: dict[int, Shim] = {}  # job id -> its shim

    @property
    def idle(self) -> int:
        return len(self._idle)

    def take(self, job_id: int) -> Shim:
        """A shim for ``job_id``: the idle one that finished a job last (a spare that never ran one only where
        none did), else a new fork (OSError if none)."""
        while self._idle:
            shim = self._idle.pop()  # spares are forked to the front, shims whose jobs ended come to the back
            if shim.alive():
                break
            shim.abandon()  # a stray signal ended it
        else:
            shim = Shim()
        self._busy[job_id] = shim
        return shim

    def ended(self, job_id: int) -> None:
        """The job's exit file was read (its shim wrote it last and waits for the next job), or its launch was
        rolled back before the shim was sent anything: the shim is idle."""
        shim = self._busy.pop(job_id, None)
        if shim is not None:
            self._idle.append(shim)

    def lost(self, job_id: int) -> None:
        """The job ended without an exit file (its shim died): nothing to reuse."""
        shim = self._busy.pop(job_id, None)
        if shim is not None:
            shim.abandon()

    def has(self, job_id: int) -> bool:
        """Whether this daemon started ``job_id``'s shim (and so has a pipe to it)."""
        return job_id in self._busy

    def cancel(self, job_id: int, shim_of: int | None = None) -> bool:
        """Ask the shim of ``job_id`` (or of ``shim_of``, the job a staged ``job_id`` follows) to stop it; False
        if this daemon did not start that shim's job (no pipe to it). A shim that died meanwhile is found by
        the liveness check, which ends a job being cancelled as such."""
        shim = self._busy.get(job_id if shim_of is None else shim_of)
        return shim is not None and shim.cancel(job_id)

    def stage(self, after: int, launch: Launch) -> bool:
        """Give the shim running job ``after`` the job to start when it ends; False if we have no pipe to it."""
        shim = self._busy.get(after)
        if shim is None:
            return False
        shim.stage(launch)
        return True

    def drop(self, after: int, job_id: int) -> None:
        shim = self._busy.get(after)
        if shim is not None:
            shim.drop(job_id)

    def handed(self, after: int, job_id: int) -> None:
        """Job ``after`` ended and its shim started ``job_id``, staged behind it: the shim is busy with that."""
        shim = self._busy.pop(after, None)
        if shim is not None:
            self._busy[job_id] = shim

    def keep(self, count: int, most: int | None = None) -> None:
        """Have at least ``count`` idle shims and at most ``most`` (default ``count``): fork the missing ones,
        let the extra ones go, those that ran fewest jobs first. A fresh fork shares its memory with the daemon
        until it writes there, and then copies each page it writes: on a lent H200 (2026-11-27,
        bench/idle_timeline.py) a shim's first launch took 1-2 ms longer than a reused one's. Keeping the shim
        that just finished a job, rather than the spare forked meanwhile, also forks nothing more while jobs
        come one at a time."""
        most = count if most is None else max(most, count)
        self._idle.sort(key=lambda shim: shim.jobs)
        while len(self._idle) > most:
            self._idle.pop(0).abandon()
        with contextlib.suppress(OSError):  # no fork now (out of processes): a launch forks, or says why
            while len(self._idle) < count:
                self._idle.insert(0, Shim())

    def close(self) -> None:
        """Let every shim go: idle ones exit now, busy ones once their job has ended."""
        self.keep(0)
        for shim in self._busy.values():
            shim.abandon()
        self._busy.clear()
