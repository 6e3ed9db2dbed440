"""A job's supervisor, the *shim*: a fork of the daemon that starts one job and sees it to its end.

Every job runs under a shim in its own session that starts the job (in the job's own process group),
waits for it, enforces its time limit and cancellation (SIGTERM to the group, SIGKILL after a grace
period), and writes the outcome to ``run/<id>.exit`` before waking the daemon. The daemon can die at any
moment: the shim keeps going, and the outcome is on disk for the next daemon to collect. Forking the
already-running daemon costs about a millisecond, where starting a fresh interpreter as the shim would
cost tens, on every job.

A shim is reused: once its job's exit file is written it waits for the next job, and the daemon keeps such
idle shims (and forks a few ahead of need while work waits: ``launcher.daemon.shims``). A launch then
costs a message down a pipe instead of a fork: forking the daemon and the copy-on-write page faults that
follow cost about 4 ms of CPU per job on a small VM, as much as the dispatch itself. An idle shim has no
job, so a SIGTERM simply ends it, and so does the daemon's death (its pipe reaches end of file); a shim
running a job when the daemon dies finishes supervising it first. One job at a time: a shim is in the
daemon's pool only once its job has ended (or, handed its successor, goes straight on to that one).

A shim running a job may also be given the job to start once it ends (a *successor hand-off*,
``launcher.daemon.handoff``): the next job on the same GPUs then starts without a round trip through the
daemon. The shim names the successor in the first job's exit file, written before the successor starts,
and the daemon records it as running when it reads that file. The daemon can take a staged job back (a
drop, or a cancel naming it) until then; a shim whose daemon is gone (its pipe at end of file) starts
nothing staged. The files a hand-off writes are made when the successor is staged (``launcher.supervisor.ahead``).

The daemon sends a shim its job only once the job is recorded as running, so a job never runs unrecorded.
If the daemon dies before that, the job is still pending; if it dies while sending, the shim reads a partial
message and exits without starting anything, and the next daemon finds a running job whose shim is gone
and that never started (no pid file), and queues it again. A job is never launched twice.

The job's stdout and stderr go to a pipe that the shim copies into ``logs/<id>.log``, up to a limit
(``launcher.supervisor.joblog``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs.accounts import Account
from gpuq_scheduler.jobs.shown import shown
from gpuq_scheduler.launcher.supervisor import ahead, containment, starting, switches
from gpuq_scheduler.launcher.supervisor.exits import ExitFile, Stop
from gpuq_scheduler.launcher.supervisor.joblog import JobLog, log_limit
from gpuq_scheduler.launcher.supervisor.processes import as_user, open_log, open_output

# SIGPIPE stays ignored: a write to a waiter that died must fail (EPIPE, handled), not end the shim, which
# requeued its job as interrupted. Every way a job is started gives it SIGPIPE's default back.
_RESET_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)

_SETTLE = 0.5  # seconds the processes of a job gpuq signalled get to end by themselves before they are counted
_TIDY = 0.05  # seconds after a hand-off before the shim removes the cgroup of the job that ended
_HEADER = 8  # bytes of the length that comes before a pickled Launch, and of a job id after a cancel or drop
# What the daemon writes down a shim's pipe: a job to start now, or the job to start once this one ends (each
# then its length and its pickled Launch); a cancel, or a drop of a staged job (each then a job id). A cancel
# names its job, so a late one cannot stop the job handed the GPUs after it; naming a staged job, it drops it.
JOB, NEXT, CANCEL, DROP = b"J", b"N", b"C", b"D"
HANDED_OFF = b"h"  # the poke after a hand-off: the daemon may wait for the burst to settle before it records it


@dataclass(frozen=True)
class Launch:
    """Everything a shim needs, fixed before the fork."""

    job_id: int
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    log: str  # a job's own files are named by strings (jobs.store.statedir says why)
    exit_file: str
    pid_file: str
    wake: Path
    time_limit: float | None
    grace: float
    account: Account | None = None  # run as this user (a shared queue); None: as the daemon's own user
    log_group: int | None = None  # the admin group, which may read every job's log
    box: containment.Box | None = None  # what holds the job's processes together (its cgroup); None: its group
    pause_file: str = ""  # where the daemon says how long the job was suspended (its time limit does not run)
    output: str = ""  # --output: a file of the user's that gets a copy of the log, opened as the job's user


def message(kind: bytes, value: Launch | int) -> bytes:
    """One message down a shim's pipe, as the shim reads it: ``JOB`` or ``NEXT`` and a Launch, ``CANCEL`` or
    ``DROP`` and a job id. The daemon's handle on a shim (``launcher.daemon.shims``) writes
    only these."""
    if kind in (CANCEL, DROP) and isinstance(value, int):
        return kind + value.to_bytes(_HEADER, "big")
    if kind in (JOB, NEXT) and isinstance(value, Launch):
        data = pickle.dumps(value)
        return kind + len(data).to_bytes(_HEADER, "big") + data
    raise ValueError(f"no shim message {kind!r} of a {type(value).__name__}")


def serve(pipe: int) -> int:
    """A shim's whole life, in the child of the daemon's fork (``launcher.daemon.shims.Shim``), which exits
    with what this returns: job after job as the daemon sends them down ``pipe``, until it closes it."""
    os.setsid()
    for signum in _RESET_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    os.closerange(3, pipe)  # the daemon's lock, database, FIFO and other shims' pipes: a shim keeps none
    os.closerange(pipe + 1, 65536)
    # Shims outlive their jobs now: in top and `ps -e` they say what they are, not "python3" (their command
    # line stays the daemon's, which only a C extension could change).
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text("gpuq-shim")
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # idle, a stray SIGTERM just ends this shim
    following: Launch | None = None
    while True:
        handed = following is not None
        launch = following or _receive(pipe)  # sent only once the job is recorded as running (or staged)
        if launch is None:
            return 0  # the daemon let this shim go, or died (maybe while sending: that job is queued again)
        # From here a SIGTERM is a cancel, handled in the loop below via the wake-up fd. It comes from outside
        # or from a daemon started after ours (ours cancels down the pipe); one that came before this line
        # ended the shim instead, and the daemon then ends a job it was cancelling as cancelled.
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGTERM, lambda *_: None)
        argv, cwd, credentials = as_user(launch.argv, launch.cwd, launch.account)
        env = dict(launch.env)
        outcome, following = _supervise(launch, argv, cwd, env, credentials, wake_read, pipe, handed)
        if following is None:
            # Idle again before the exit file says so: a SIGTERM from now on ends this idle shim and cannot be
            # taken for a cancel of the next job it is given.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # A SIGTERM that came for the job that ended goes with it. Handing off, one from now on is for the
        # successor: it is the running job once the exit file below names it.
        with contextlib.suppress(BlockingIOError):
            while os.read(wake_read, 64):
                continue
        _finish(launch, outcome, following)


def _receive(pipe: int) -> Launch | None:
    """The next job the daemon sent, or None at end of file. A cancel or a drop read here came for a job that had
    already ended when the daemon sent it, and a staged job for one that had ended (its exit file, naming no
    successor, tells the daemon it did not start): there is nothing to do."""
    while True:
        kind, value = _message(pipe)
        if kind == JOB:
            assert isinstance(value, Launch)
            return value
        if not kind:
            return None


def _message(pipe: int) -> tuple[bytes, Launch | int | None]:
    """One message from the daemon: (kind, its Launch or job id); (b"", None) at end of file, also when the
    daemon died in the middle of writing one."""
    kind = os.read(pipe, 1)
    header = _read_exactly(pipe, _HEADER) if kind else None
    if header is None:
        return b"", None
    if kind in (CANCEL, DROP):
        return kind, int.from_bytes(header, "big")
    data = _read_exactly(pipe, int.from_bytes(header, "big"))
    return (b"", None) if data is None else (kind, pickle.loads(data))  # trusted: the daemon, our parent, wrote it


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _supervise(
    launch: Launch,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    credentials: dict[str, Any],
    wake_read: int,
    pipe: int,
    handed: bool,
) -> tuple[ExitFile, Launch | None]:
    """Run the job to its end: its outcome, for the exit file, and the job staged to follow it, if any.
    ``handed``: this job followed one that just ended, and the daemon learns of both once this one started."""
    log_fd = ahead.log(launch.log)
    if log_fd is None:
        log_fd = open_log(launch.log, launch.account, launch.log_group)
    try:
        pid, start, reap, out_read = starting.start(
            launch.job_id, launch.box, launch.argv[0], argv, cwd, env, credentials, handed
        )
    except starting.NotStarted as failed:
        _discard_behind()
        ahead.drop()
        os.write(log_fd, f"gpuq: could not start {shown(failed.what)}: {failed.why}\n".encode())
        os.close(log_fd)
        if launch.box is not None and launch.box.cgroup is not None:
            containment.end(launch.box, -1)  # nothing started in it; the cgroup goes
        return ExitFile(launch.job_id, 0.0, started=True, spawn_error=f"{failed.what}: {failed.why}"), None
    output = JobLog(log_fd, log_limit(), open_output(launch.output, launch.account, log_fd))
    started = time.monotonic()  # the time limit is a duration: a jump of the wall clock must not end a job
    box = None if launch.box is None else launch.box.to_json()  # for a daemon that finds this shim gone
    ahead.write(launch.pid_file, json.dumps({"pid": pid, "start": start, "box": box}).encode())
    # The exit file's space, reserved before the job can fill the disk: a staged job's was made when it was
    # staged; a job started on an idle GPU gets it now, just after its start rather than before it (two files
    # made there cost its start 1-2 ms). One that filled the disk within that moment is still recorded once
    # there is room again: ``_finish`` tries until its exit file is written.
    ahead.reserve(launch.exit_file)
    if handed:
        _poke(launch.wake, HANDED_OFF)

    reason: Stop = Stop.NONE
    kill_at: float | None = None
    deadline = None if launch.time_limit is None else started + launch.time_limit
    pidfd = os.pidfd_open(pid)
    watched = [pidfd, wake_read, out_read, pipe]
    following: Launch | None = None
    # The cgroup of the job before is removed a moment later, not while this job's first process gets going.
    tidy_at = started + _TIDY if _behind else None
    while True:
        now = time.monotonic()
        due = [t for t in (deadline if reason is Stop.NONE else None, kill_at, tidy_at) if t is not None]
        timeout = max(0.0, min(due) - now) if due else None
        ready, _, _ = select.select(watched, [], [], timeout)
        if tidy_at is not None and (pidfd in ready or time.monotonic() >= tidy_at):
            _discard_behind()
            tidy_at = None
        if out_read in ready and not output.pump(out_read):
            watched.remove(out_read)  # the job closed its stdout and stderr
        if pidfd in ready:
            break
        now = time.monotonic()
        asked, following = _requests(ready, watched, pipe, wake_read, launch, following)
        if asked and reason is Stop.NONE:
            reason = Stop.CANCEL
        elif deadline is not None and now >= deadline and reason is Stop.NONE:
            paused, ongoing = suspended_for(launch.pause_file, now)
            deadline = started + (launch.time_limit or 0.0) + paused
            if ongoing:
                deadline = max(deadline, now + _PAUSED_LOOK)
            if now < deadline:
                continue  # suspended meanwhile: the limit counts only the time it could run
            reason = Stop.TIMEOUT
        elif kill_at is not None and now >= kill_at:
            containment.signal_all(launch.box, pid, signal.SIGKILL)
            kill_at = None
            continue
        else:
            continue
        containment.signal_all(launch.box, pid, signal.SIGTERM)
        kill_at = now + launch.grace
    returncode = reap()
    # Stragglers the job left behind (they would hold its GPU memory) end with it, and are counted. Its empty
    # cgroup goes once what follows it here has started: the rmdir need not stand between them.
    contained = containment.end(launch.box, pid, _SETTLE if reason is not Stop.NONE else 0.0, remove=False)
    if launch.box is None:
        containment.signal_all(None, pid, signal.SIGKILL)  # its group, as nothing else holds its processes
    if out_read in watched:
        output.drain(out_read)  # what the job wrote just before it ended is still in the pipe
    for fd in (pidfd, out_read, log_fd, *([] if output.copy is None else [output.copy])):
        os.close(fd)
    # What the daemon sent while the job was ending (a successor, or its drop) decides what follows it.
    while pipe in watched and select.select([pipe], [], [], 0)[0]:
        _, following = _requests([pipe], watched, pipe, wake_read, launch, following)
    _behind[:] = [launch.box] if following is not None else []
    if following is None:
        containment.discard(launch.box)
    return ExitFile(
        launch.job_id,
        0.0,
        started=True,
        exit_code=returncode if returncode >= 0 else None,
        signal=-returncode if returncode < 0 else None,
        reason=reason,
        contained=contained,
    ), following


_behind: list[containment.Box | None] = []  # the emptied cgroup of the job that ended before the one starting


def _discard_behind() -> None:
    for box in _behind:
        containment.discard(box)
    _behind.clear()


def _requests(
    ready: list[int], watched: list[int], pipe: int, wake_read: int, launch: Launch, following: Launch | None
) -> tuple[bool, Launch | None]:
    """Whether a cancel of this job came (down the pipe from the daemon, or as a SIGTERM from a daemon started
    after the one that sent this job, which has no pipe to this shim), and the job staged to follow it now."""
    asked = False
    if pipe in ready:
        kind, value = _message(pipe)
        if not kind:
            watched.remove(pipe)  # the daemon died: see this job through, start nothing staged, then exit
            _give_back(following)
            following = None
        elif kind == NEXT:
            assert isinstance(value, Launch)
            following = value
            if not switches.off("files"):
                ahead.make(launch.exit_file, value.exit_file, value.pid_file, value.log, value.account, value.log_group)
            if value.box is not None and value.box.cgroup is not None and not switches.off("born"):
                argv, cwd, credentials = as_user(value.argv, value.cwd, value.account)
                ahead.clone(value.job_id, value.box, argv, cwd, dict(value.env), credentials, starting.output_pipe())
        elif kind in (CANCEL, DROP) and following is not None and value == following.job_id:
            _give_back(following)
            following = None
        else:
            asked = kind == CANCEL and value == launch.job_id
    if wake_read in ready:
        asked = signal.SIGTERM in os.read(wake_read, 64) or asked
    return asked, following


_PAUSED_LOOK = 0.5  # seconds between looks at a suspended job's pause file once its limit came due


def suspended_for(pause_file: str, now: float) -> tuple[float, bool]:
    """Seconds of ``time.monotonic()`` the job spent suspended up to ``now``, and whether it is suspended now,
    as the daemon wrote them in ``pause_file`` ({"total": seconds of ended suspensions, "since": when the
    current one began, or null}); read only when its time limit comes due: a job never suspended costs
    nothing."""
    try:
        with open(pause_file) as handle:
            paused = json.load(handle)
        since = paused.get("since")
        ongoing = max(0.0, now - float(since)) if since is not None else 0.0
        return float(paused.get("total") or 0.0) + ongoing, since is not None
    except (OSError, ValueError, TypeError, AttributeError):
        return 0.0, False


def _give_back(staged: Launch | None) -> None:
    """Drop the staged job and say so in its exit file (it never started), so that the daemon may place it
    elsewhere now rather than once the job ahead of it ends."""
    if staged is not None:
        ahead.drop()  # before the exit file: once it is written, the job may start elsewhere, with its log
        _finish(staged, ExitFile(staged.job_id, 0.0, started=False, dropped=True), None)


def _finish(launch: Launch, outcome: ExitFile, following: Launch | None) -> None:
    # ``next`` starts once this file is written; the daemon hears of it after.
    outcome = replace(outcome, ended_at=time.time(), next=None if following is None else following.job_id)
    # Not fsynced: the rename is atomic against a daemon crash, which is what the exit file is for. Only a
    # machine crash could lose it, and then the changed boot id marks the job lost anyway; two fsyncs
    # here would sit between every job's end and the next job's start.
    data = json.dumps(outcome.to_json()).encode()
    tries = 0
    while True:  # until written: a shim that died here would leave its job "lost", whatever it did
        try:
            ahead.write(launch.exit_file, data)
            break
        except OSError:  # a full disk, and the space reserved for it was lost: wait for room
            time.sleep(_BACKOFF[min(tries, len(_BACKOFF) - 1)])
            tries += 1
    if following is None:
        _poke(launch.wake, b"!")


_BACKOFF = (0.1, 0.5, 1.0, 2.0, 5.0)  # seconds between tries at an exit file; the last repeats until written


def _poke(wake: Path, word: bytes) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(wake, os.O_WRONLY | os.O_NONBLOCK)
        with contextlib.suppress(OSError):
            os.write(fd, word)
        os.close(fd)
