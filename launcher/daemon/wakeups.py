"""What wakes the daemon's pass: the public wake FIFO clients poke (anyone may write it, so its pokes are
coalesced), the inner one only the daemon's own shims and helpers can write, and the daemon's signals."""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import time

from gpuq_scheduler.jobs.store.statedir import StateDir

HANDOFF_SETTLE = 0.005  # a pass woken only by hand-offs waits until none came for this long...
HANDOFF_SETTLE_MAX = 0.025  # ...or this long at most (see Wakeups.wait)
# A pass that only a poke of the public FIFO asked for, with nothing new in the spool, runs at most this often:
# anyone can write that FIFO, and a loop writing to it once cost the daemon half a core.
WAKE_INTERVAL = 0.1
RECENT_NS = 50_000_000  # a spool's mtime this fresh may hide a second rename in the same clock tick


class Wakeups:
    """What wakes a pass, as one thing to sleep on: the public FIFO clients poke (anyone may write it), the
    inner one only the daemon's own shims and helpers can (``StateDir.inner_wake``), and our own signals."""

    def __init__(self, state: StateDir) -> None:
        from gpuq_scheduler.launcher.supervisor.shim import HANDED_OFF  # the daemon's own: off the CLI's import path

        self._handed = HANDED_OFF
        self.stopping = False
        self.fifo = os.open(state.wake, os.O_RDONLY | os.O_NONBLOCK)
        self.inner = os.open(state.inner_wake, os.O_RDONLY | os.O_NONBLOCK)
        # Holding a writer open ourselves keeps a FIFO from reporting EOF (readable forever) between pokes.
        self._keepalive = [os.open(f, os.O_WRONLY | os.O_NONBLOCK) for f in (state.wake, state.inner_wake)]
        self._spool = os.fspath(state.spool)
        self._spool_seen: int | None = None  # its mtime when a poke last looked, where old enough to trust
        self._last_pass = -math.inf
        self._owed = False  # a coalesced poke: a pass is due at _last_pass + WAKE_INTERVAL
        self._signals, signal_write = os.pipe()
        os.set_blocking(signal_write, False)
        os.set_blocking(self._signals, False)
        signal.set_wakeup_fd(signal_write)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._stop)
        # No wake-up on SIGCHLD: a shim pokes the FIFO after writing its exit file, just before it exits, and
        # the signal would only wake a second, idle pass while the next job starts. Each pass reaps zombies.

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def passing(self) -> None:
        """A pass starts: it answers every poke so far."""
        self._last_pass = time.monotonic()
        self._owed = False

    def wait(self, timeout: float) -> bool:
        """Sleep until a client or a shim wakes us, a signal comes, or ``timeout``; False on the timeout.

        A poke of the public FIFO wakes the pass at once when the spool changed or no pass ran for
        ``WAKE_INTERVAL``; otherwise it is coalesced into one pass at the end of that interval, however many
        bytes come: a flood of pokes costs a few passes a second, and a submit made during one waits for that
        pass at most; one made at any other time starts at once.
        Woken only by hand-offs (jobs that started themselves as the ones before them ended), wait until they
        stop coming for a moment: the rest of the burst they came in ends and starts meanwhile, and one pass
        records it all once those jobs have had the CPU to start. Anything else wakes the pass at once."""
        end = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            due = self._last_pass + WAKE_INTERVAL if self._owed else math.inf
            if now >= due:
                return True
            # While a coalesced pass is owed, the public FIFO is left unread: a flood wakes nothing until it is due.
            watched = [self.inner, self._signals] if self._owed else [self.fifo, self.inner, self._signals]
            ready, _, _ = select.select(watched, [], [], max(0.0, min(end, due) - now))
            if not ready:
                return time.monotonic() >= due
            if ready == [self.fifo]:
                _drain(self.fifo)
                if self._spool_changed() or now >= self._last_pass + WAKE_INTERVAL:
                    return True
                self._owed = True
                continue
            _drain(self.fifo)  # anyone's pokes, answered by this pass too
            words = b"".join(_drain(fd) for fd in ready if fd != self.fifo)
            break
        settle_until = time.monotonic() + HANDOFF_SETTLE_MAX
        while words and not words.strip(self._handed) and self._signals not in ready:
            if time.monotonic() >= settle_until:
                break
            ready, _, _ = select.select([self.inner, self._signals], [], [], HANDOFF_SETTLE)
            words = b"".join(_drain(fd) for fd in ready)  # nothing: quiet for HANDOFF_SETTLE, the burst is over
        return True

    def _spool_changed(self) -> bool:
        """Whether a request may have come into the spool since a poke last looked: its mtime moved, or was too
        fresh to tell (a directory's mtime moves in clock ticks: two renames in one tick look alike)."""
        try:
            mtime = os.stat(self._spool).st_mtime_ns
        except OSError:
            return True
        changed = mtime != self._spool_seen
        self._spool_seen = mtime if time.time_ns() - mtime > RECENT_NS else None
        return changed


def _drain(fd: int) -> bytes:
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    return b"".join(chunks)
