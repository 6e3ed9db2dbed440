"""The daemon's lifetime: one per state directory (a lock), signals, the wake-up FIFO, the loop.

Run it in the foreground with ``python -m gpuq_scheduler.launcher.daemon --home DIR`` (what ``gpuq daemon start``
and auto-start do, detached, and what a systemd unit would run). SIGTERM or SIGINT stops it
between ticks; running jobs keep running under their shims and are adopted by the next daemon.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import fcntl
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuq_scheduler.jobs import accounts, config
from gpuq_scheduler.jobs.config import Shared
from gpuq_scheduler.jobs.errors import BadInput, DaemonError, GpuqError
from gpuq_scheduler.jobs.store import notices
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.daemon import testclock
from gpuq_scheduler.launcher.daemon.wakeups import Wakeups

if TYPE_CHECKING:
    from gpuq_scheduler.launcher.daemon.scheduler import Scheduler
    from gpuq_scheduler.launcher.policy.placement import Policy

log = logging.getLogger("gpuq.daemon")

SETTLE = 0.005  # seconds without an event before spare shims are forked


def running_pid(state: StateDir) -> int | None:
    """The pid of the daemon holding this state directory's lock, or None if none does.

    The lock is its owner's alone (mode 0600): flock needs no write access, so a lock others could open
    would let any user of a shared queue take it while the daemon restarts, and keep it from starting.
    They ask the wake FIFO instead, which has a reader while a daemon runs."""
    try:
        fd = os.open(state.lock, os.O_RDONLY | os.O_NOFOLLOW)
    except PermissionError:
        return _listening_pid(state)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        try:
            return int(state.pid.read_text().strip())
        except (OSError, ValueError):
            return -1  # held, but its pid file is not written yet
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _listening_pid(state: StateDir) -> int | None:
    try:
        os.close(os.open(state.wake, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        return None  # ENXIO: nobody reads it, so no daemon runs
    try:
        return int(state.pid.read_text().strip())
    except (OSError, ValueError):
        return -1


def start(state: StateDir, timeout: float = 15.0, *, shared: bool = False) -> int:
    """Start a detached daemon (if none runs) and wait until it holds the lock. Returns its pid."""
    from gpuq_scheduler.jobs.api import start_daemon

    pid = running_pid(state)
    if pid is not None and pid > 0:
        return pid
    if shared:
        if os.geteuid() != 0:
            raise DaemonError("a shared queue's daemon runs as root (it starts jobs as their users): use sudo")
        state.ensure_shared()
    _environment(os.environ)  # the daemon's own environment: a bad number there is said here, not in its log
    with contextlib.suppress(FileNotFoundError):
        state.ready.unlink()  # an earlier daemon's, killed before it could remove it
    start_daemon(state, shared=shared)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = running_pid(state)
        if pid is None:
            raise DaemonError(f"the daemon exited at once: {_last_words(state)}")
        if pid > 0 and _ready(state) == pid:
            if not state.inventory.exists():
                raise DaemonError(f"the daemon (pid {pid}) runs but cannot see the GPUs: {_last_words(state)}")
            return pid
        time.sleep(0.02)
    raise DaemonError(f"the daemon did not get ready within {timeout:.0f}s: {_last_words(state)}")


def _ready(state: StateDir) -> int | None:
    try:
        return int(state.ready.read_text().strip())
    except (OSError, ValueError):
        return None


def _last_words(state: StateDir, lines: int = 3) -> str:
    """The end of the daemon's log, on one line, to say why it failed."""
    try:
        with state.daemon_log.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            tail = log.read().decode(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        tail = []
    return " | ".join(line.strip() for line in tail) or f"nothing in {state.daemon_log}"


def stop(state: StateDir, timeout: float = 15.0) -> int | None:
    """Stop the daemon (its jobs keep running). Returns the pid stopped, or None if none ran."""
    deadline = time.monotonic() + timeout
    pid = running_pid(state)
    while pid == -1 and time.monotonic() < deadline:  # a daemon is starting: its pid file comes at once
        time.sleep(0.02)
        pid = running_pid(state)
    if pid is None:
        return None
    if pid > 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    while time.monotonic() < deadline:
        if running_pid(state) is None:
            return pid
        time.sleep(0.02)
    raise DaemonError(f"daemon {pid} did not stop within {timeout:.0f}s; `kill -9 {pid}` is safe: jobs survive it")


def _sleep(scheduler: Scheduler, wakeups: Wakeups) -> None:
    """Wait for the next thing to do. Spare shims are forked here, once nothing happened for a moment:
    forked right after a launch, they would take the CPU from the jobs just started."""
    deadline = time.monotonic() + scheduler.next_wakeup(time.time())  # a wall-clock jump must not stretch a nap
    if scheduler.wants_spares():
        if wakeups.wait(max(0.0, min(SETTLE, deadline - time.monotonic()))):  # no nap at all: select refuses < 0
            return
        scheduler.fork_spares()
    wakeups.wait(max(0.0, deadline - time.monotonic()))


def _environment(environ: Mapping[str, str]) -> tuple[float, float, Policy]:
    """The daemon's numbers from its environment, each checked (DaemonError names a bad one and what it
    takes): the seconds from SIGTERM to SIGKILL, the retries' base backoff, and placement's knobs."""
    grace = _seconds(environ, "GPUQ_KILL_GRACE", 10.0, low=0.0)
    backoff = _seconds(environ, "GPUQ_RETRY_BACKOFF", 10.0, low=0.0)
    for name in ("GPUQ_IDLE_LIMIT", "GPUQ_IDLE_REPORT"):
        if environ.get(name):
            _duration(environ, name)
    return grace, backoff, _policy(environ)


def _policy(environ: Mapping[str, str]) -> Policy:
    """Placement's knobs, from the daemon's environment where it sets them (``GPUQ_AUTO_MARGIN``: the
    fraction --mem auto adds to a learned peak; ``GPUQ_AUTO_PROBE_MEM``: a probe's share instead of a GPU;
    ``GPUQ_AUTO_SETTLE``: seconds a probe runs before its peak so far counts; ``GPUQ_AUTO_STEADY``: seconds
    its peak must hold still to count sooner, or ``off``; ``GPUQ_AUTO_FIRST``: the fenced share a kind with no
    history starts on, or ``probe``)."""
    from gpuq_scheduler.jobs.units import parse_size
    from gpuq_scheduler.launcher.policy.placement import Policy

    policy = Policy(cpu_slots=os.cpu_count())
    if environ.get("GPUQ_AUTO_MARGIN"):
        margin = _number(environ, "GPUQ_AUTO_MARGIN", policy.auto_margin, 0.0, 10.0, "a fraction such as 0.2")
        policy = dataclasses.replace(policy, auto_margin=margin)
    if environ.get("GPUQ_AUTO_SETTLE"):
        policy = dataclasses.replace(policy, auto_settle=_seconds(environ, "GPUQ_AUTO_SETTLE", 0.0, low=0.0))
    if environ.get("GPUQ_AUTO_STEADY") == "off":
        policy = dataclasses.replace(policy, auto_steady=None)
    elif environ.get("GPUQ_AUTO_STEADY"):
        steady = _number(environ, "GPUQ_AUTO_STEADY", 0.0, 0.0, 86400.0, "a number of seconds (or off)")
        policy = dataclasses.replace(policy, auto_steady=steady)
    first = environ.get("GPUQ_AUTO_FIRST")
    if first:
        try:
            size = None if first == "probe" else parse_size(first)
        except BadInput as err:
            raise DaemonError(f"GPUQ_AUTO_FIRST={first!r}: {err}; or probe") from None
        policy = dataclasses.replace(policy, auto_first=size)
    text = environ.get("GPUQ_AUTO_PROBE_MEM")
    if text:
        try:
            policy = dataclasses.replace(policy, auto_probe_mem=parse_size(text))
        except BadInput as err:
            raise DaemonError(f"GPUQ_AUTO_PROBE_MEM={text!r}: {err}") from None
    return policy


def _seconds(environ: Mapping[str, str], name: str, default: float, low: float = 0.1) -> float:
    """A number of seconds from the daemon's environment, from ``low`` to a day."""
    return _number(environ, name, default, low, 86400.0, "a number of seconds")


def _duration(environ: Mapping[str, str], name: str) -> float | None:
    """A duration from the daemon's environment (2h, 30m), or None for "off"."""
    from gpuq_scheduler.jobs.units import parse_duration

    text = environ[name]
    try:
        return None if text == "off" else parse_duration(text)
    except BadInput as err:
        raise DaemonError(f"{name}={text[:40]!r}: {err}, or off") from None


def _number(environ: Mapping[str, str], name: str, default: float, low: float, high: float, what: str) -> float:
    """A number from the daemon's environment (``default`` where it is unset or empty), or DaemonError naming
    the variable and what it takes: the daemon exits 2 before serving, as on any bad input."""
    text = environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:  # NaN (and so anything float() refused) fails too
        raise DaemonError(f"{name}={text[:40]!r}: give {what} from {low:g} to {high:g}")
    return value


def serve(state: StateDir, *, burst: bool = False, shared: Shared | None = None, lock_fd: int | None = None) -> int:
    """Run the daemon in this process until stopped (or, with ``burst``, until the queue is empty).

    ``shared``: serve a whole machine's users (as root), with these settings (the config's [shared]).
    ``lock_fd``: the state directory's lock, already taken by the client that started us (``start_daemon``).
    """
    from gpuq_scheduler.launcher.daemon import outsiders, preempting, reserving
    from gpuq_scheduler.launcher.daemon.scheduler import Scheduler
    from gpuq_scheduler.launcher.daemon.suspension import pools
    from gpuq_scheduler.launcher.daemon.watching import watchdog
    from gpuq_scheduler.launcher.gpus import mps
    from gpuq_scheduler.launcher.gpus.fake import FakeGpus
    from gpuq_scheduler.launcher.gpus.sources import open_source

    if shared is None:
        state.ensure()
    elif os.geteuid() != 0:
        raise DaemonError("a shared queue's daemon runs as root (it starts jobs as their users): use sudo")
    else:
        if shared.admins and accounts.group_id(shared.admins) is None:
            raise BadInput(
                f"the config's [shared] admins names the group {shared.admins!r}, which does not exist here: "
                f"create it (`groupadd {shared.admins}`) or change the config"
            )
        state.ensure_shared()
    # fcntl.flock, not the filelock package: filelock hooks every fork of its process, and a daemon's whole
    # job is forking shims.
    if lock_fd is None:
        lock = os.open(state.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    else:
        lock = lock_fd
        os.set_inheritable(lock, False)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # on a handed-over lock: ours already, so this holds
    except OSError:
        os.close(lock)
        log.info("another daemon already serves %s; exiting", state.root)
        return 0
    try:
        write_atomic(state.pid, f"{os.getpid()}\n".encode(), durable=False, mode=0o644)
        wakeups = Wakeups(state)
        grace, backoff, policy = _environment(os.environ)
        source = open_source()
        mode = os.environ.get("GPUQ_FENCE", "auto")
        if mode != "auto" and mode not in {f.value for f in mps.Fence}:
            raise DaemonError(f"GPUQ_FENCE={mode!r}: choose auto (the default), mps, cooperative or none")
        servers = mps.for_gpus(state.mps, isinstance(source, FakeGpus), os.environ)
        if mode == mps.Fence.MPS and servers is None:
            raise DaemonError(f"GPUQ_FENCE=mps: {mps.CONTROL} is not installed here; unset it for the default")
        if mode in (mps.Fence.COOPERATIVE, mps.Fence.NONE):
            servers = None
        fence = mps.Fence(mode) if mode != "auto" else mps.Fence.MPS if servers else mps.Fence.COOPERATIVE
        scheduler = Scheduler(state, source, policy, grace, backoff, shared, servers, fence)
        if scheduler.controls is not None:  # seconds a control command may take, and before a failed one is retried
            from gpuq_scheduler.launcher.daemon.controls import RETRY, TIMEOUT

            scheduler.controls.timeout = _seconds(os.environ, "GPUQ_MPS_TIMEOUT", TIMEOUT)
            scheduler.controls.retry = _seconds(os.environ, "GPUQ_MPS_RETRY", RETRY)
        if os.environ.get("GPUQ_IDLE_LIMIT"):  # a personal queue's (off by default); a shared one's config wins
            scheduler.monitor.idle_limit = _duration(os.environ, "GPUQ_IDLE_LIMIT")
        scheduler.watch.settings = watchdog.settings(config.load().watchdog, os.environ, policy.overhead)
        scheduler.preemption.settings = preempting.settings(shared, os.environ)
        scheduler.suspensions.pool_mode = pools.mode(os.environ)
        scheduler.booked.idle, scheduler.booked.quota = reserving.settings(shared, os.environ)
        scheduler.outsiders = outsiders.Outsiders(outsiders.command(shared, os.environ))
        if os.environ.get("GPUQ_IDLE_REPORT"):  # a personal queue's (off by default); a shared one's config wins
            scheduler.monitor.idle_report = _duration(os.environ, "GPUQ_IDLE_REPORT")
        log.info("daemon %d serving %s%s", os.getpid(), state.root, " (shared)" if shared else "")
        ready = False
        try:
            failing = False  # readers are told while passes fail (``jobs.store.notices``), until one succeeds
            while not wakeups.stopping:
                try:
                    wakeups.passing()
                    scheduler.tick(time.time())
                    if failing:
                        failing = not _told(notices.pass_succeeded, state)
                except GpuqError as err:  # a bad fake inventory file, a full disk: say so, keep serving
                    log.error("%s", err)
                    failing = _told(notices.pass_failed, state, str(err), time.time())
                    time.sleep(0.5)
                except Exception as err:  # a bug must not take the queue down with it: log it and go on
                    log.exception("tick failed; continuing")
                    failing = _told(notices.pass_failed, state, f"{type(err).__name__}: {err}", time.time())
                    time.sleep(0.5)
                if not ready:  # the GPUs seen and the spool read once: `gpuq daemon start` may return
                    write_atomic(state.ready, f"{os.getpid()}\n".encode(), durable=False, mode=0o644)
                    ready = True
                if burst and scheduler.idle:
                    break
                _sleep(scheduler, wakeups)
        finally:
            scheduler.close()
        log.info("daemon %d stopped", os.getpid())
        return 0
    finally:
        for done in (state.ready, state.pid):
            with contextlib.suppress(OSError):
                os.unlink(done)
        os.close(lock)


def _told(tell: Callable[..., None], *args: Any) -> bool:
    """Tell readers how the passes go (True once told). A disk too full for the notice must not stop the
    loop: a failure is then counted again at the next pass, and a recovery told again."""
    try:
        tell(*args)
    except (OSError, GpuqError) as err:  # write_atomic says ENOSPC as a StateDirError
        log.error("cannot record how the daemon's passes go: %s", err)
        return tell is notices.pass_failed  # still failing, as far as the loop knows
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuq_scheduler.launcher.daemon", description="The gpuq daemon.")
    parser.add_argument("--home", type=Path, help="state directory (default: $GPUQ_HOME or ~/.local/state/gpuq)")
    parser.add_argument("--burst", action="store_true", help="exit once no job is pending or running")
    parser.add_argument("--shared", action="store_true", help="serve every user of this machine (as root)")
    parser.add_argument("--lock-fd", type=int, help=argparse.SUPPRESS)  # the lock, taken by the starting client
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    testclock.install(os.environ)
    try:
        settings = config.load()
        home = args.home or settings.home or (config.SHARED_HOME if args.shared else None)
        state = StateDir(home.absolute()) if home else StateDir.from_env()
        return serve(state, burst=args.burst, shared=settings.shared if args.shared else None, lock_fd=args.lock_fd)
    except GpuqError as err:
        log.error("%s", err)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
