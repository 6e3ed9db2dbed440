"""Spawn, supervise and stop a job's process tree.

Every job runs under a *shim*: a fork of the daemon in its own session that starts the job (in the
job's own process group), waits for it, enforces its time limit and cancellation (SIGTERM to the
group, SIGKILL after a grace period), and writes the outcome to ``run/<id>.exit`` before waking the
daemon. The daemon can die at any moment: the shim keeps going, and the outcome is on disk for the
next daemon to collect. Forking the already-running daemon costs about a millisecond, where starting
a fresh interpreter as the shim would cost tens, on every job.

The job's stdout and stderr go to a pipe that the shim copies into ``logs/<id>.log``, up to
``GPUQ_LOG_LIMIT`` bytes (default 1 GiB; read from the daemon's environment, which the shim inherits).
Past the limit the shim writes one line saying so and discards the rest, still reading so that the
job never blocks on a full pipe: a job printing in a loop cannot fill the disk unnoticed.

The shim does not start the job until the daemon has recorded it as running and says "go" over a
pipe. If the daemon dies before that, the pipe reaches EOF and the shim exits without starting
anything: the job is still pending, and is never launched twice.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.accounts import Account
from jobs.errors import BadInput
from jobs.model import JobRecord, JobSpec, Mode
from jobs.statedir import write_atomic
from jobs.units import parse_size

_RESET_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE)

LOG_LIMIT = 1 << 30  # bytes of output kept per job unless GPUQ_LOG_LIMIT says otherwise
_CHUNK = 1 << 20  # read the job's output this much at a time (and ask for a pipe this big)
_DRAIN_IDLE = 2.0  # after the job ended: stop reading once its pipe stays quiet this long...
_DRAIN_MAX = 10.0  # ...or after this long, if something that escaped its process group keeps writing


@dataclass(frozen=True)
class Launch:
    """Everything a shim needs, fixed before the fork."""

    job_id: int
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    log: Path
    exit_file: Path
    pid_file: Path
    wake: Path
    time_limit: float | None
    grace: float
    account: Account | None = None  # run as this user (a shared queue); None: as the daemon's own user
    log_group: int | None = None  # the admin group, which may read every job's log


# CPython's subprocess enters ``cwd`` *before* it drops privileges, so a root daemon would open a directory
# its user may not. The job's cwd is entered by this shell instead, already running as the user.
_ENTER_AS_USER = 'cd -- "$1" || exit 126; shift; exec "$@"'


def as_user(argv: Sequence[str], cwd: str, account: Account | None) -> tuple[list[str], str, dict[str, Any]]:
    """(argv, cwd, Popen credentials) that run ``argv`` in ``cwd`` as ``account``, with privileges dropped
    before anything the user controls (the directory, the program, its PATH lookup) is touched."""
    if account is None or account.uid == os.geteuid():
        return list(argv), cwd, {}
    credentials = {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}
    return ["/bin/sh", "-c", _ENTER_AS_USER, "gpuq-job", cwd, *argv], "/", credentials


def job_argv(spec: JobSpec, port: int | None) -> list[str]:
    """The command line the job's process runs with."""
    command = list(spec.command)
    if spec.mode is Mode.TORCHRUN:
        assert spec.python is not None and port is not None
        return [
            spec.python, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(spec.gpus),
            "--master-addr", "127.0.0.1", "--master-port", str(port), *command,
        ]  # fmt: skip
    if spec.python is not None:
        return [spec.python, *command]
    return command


def job_env(
    spec: JobSpec, job_id: int, gpus: Sequence[int], uuids: Sequence[str], home: Path, record: JobRecord | None = None
) -> dict[str, str]:
    """The submitter's captured environment plus what tells the job which GPUs (and array index) are its own."""
    env = dict(spec.env)
    if record is not None:
        env["GPUQ_ATTEMPT"] = str(record.attempt)
        if record.array_id is not None:
            env["GPUQ_ARRAY_ID"] = str(record.array_id)
            env["GPUQ_ARRAY_INDEX"] = str(record.array_index)
    visible = ",".join(str(i) for i in gpus)
    env.update(
        CUDA_DEVICE_ORDER="PCI_BUS_ID",  # CUDA's default order is "fastest first", not NVML's indices
        CUDA_VISIBLE_DEVICES=visible,  # "" hides every GPU from a CPU job
        GPUQ_JOB_ID=str(job_id),
        GPUQ_JOB_NAME=spec.display_name,
        GPUQ_GPUS=visible,
        GPUQ_GPU_UUIDS=",".join(uuids),
        GPUQ_MEM_PER_GPU="" if spec.mem_per_gpu is None else str(spec.mem_per_gpu),
        GPUQ_MODE=spec.mode.value,
        GPUQ_HOME=str(home),
    )
    return env


def notify(command: str, env: Mapping[str, str], cwd: str, log: Path, account: Account | None = None) -> None:
    """Start a --notify command through the shell, detached (as the job's user); its output goes to ``log``.

    The daemon reaps it like any child and never waits for it: a slow webhook cannot stall the queue.
    """
    argv, workdir, credentials = as_user(["/bin/sh", "-c", command], cwd, account)
    with os.fdopen(_open_log(log, account, None), "ab") as out:
        subprocess.Popen(
            argv, env=dict(env), cwd=workdir if os.path.isdir(workdir) else "/",
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, **credentials,
        )  # fmt: skip


def _open_log(path: Path, account: Account | None, group: int | None) -> int:
    """Open a log for appending; in a shared queue it belongs to the job's user and is readable by the
    admin group only (``logs/`` is root's, so nobody can plant a link there)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    if account is not None and account.uid != os.geteuid():
        os.fchown(fd, account.uid, account.gid if group is None else group)
        os.fchmod(fd, 0o640)
    return fd


def free_port(avoid: set[int]) -> int:
    """A TCP port nothing listens on now and no other running torchrun job of ours was given."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in avoid:
            return port
    raise OSError(errno.EADDRINUSE, "no free port found for torchrun")


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def start_time(pid: int) -> float | None:
    """A process's start time, which with its pid names one process even after pids are reused.

    Read from /proc/<pid>/stat (field 22, clock ticks since boot) rather than through psutil: this
    is on every launch, and psutil's lookup was a quarter of the time from placement to a shim's go.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # the name in parentheses may itself hold spaces
    try:
        return int(fields[19]) / _CLOCK_TICKS
    except (IndexError, ValueError):
        return None


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def is_alive(pid: int, started: float | None) -> bool:
    now_started = start_time(pid)
    return now_started is not None and started is not None and abs(now_started - started) < 0.05


def tree_pids(pid: int) -> list[int]:
    """The pids of a process and all its descendants (a shim, its job, torchrun's workers...)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return []


class Shim:
    """A forked supervisor waiting for the daemon's go."""

    def __init__(self, launch: Launch) -> None:
        read_end, self._go = os.pipe()
        # A cancel (SIGTERM) may reach the shim the moment it exists: blocked until the shim's own handler
        # is in place, it waits instead of meeting the daemon's handler (swallowed) or the default (a dead
        # shim, whose job would be queued again).
        self.pid = -1
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            self.pid = os.fork()
            if self.pid == 0:  # the child: never returns into the daemon's code
                code = 70
                try:
                    os.close(self._go)
                    code = _supervise(launch, read_end)
                finally:
                    os._exit(code)
        finally:
            if self.pid != 0:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.close(read_end)

    def go(self) -> None:
        """Tell the shim the job is recorded as running: it may start it now."""
        try:
            os.write(self._go, b"1")
        finally:
            os.close(self._go)

    def abandon(self) -> None:
        """Close the pipe without a go: the shim exits and the job never starts."""
        with contextlib.suppress(OSError):
            os.close(self._go)


def _supervise(launch: Launch, go: int) -> int:
    os.setsid()
    for signum in _RESET_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    os.closerange(3, go)  # the daemon's lock, database and FIFO: a shim must not keep them open
    os.closerange(go + 1, 65536)
    if os.read(go, 1) != b"1":
        return 0  # the daemon died before recording the launch: leave the job pending
    os.close(go)

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGTERM, lambda *_: None)  # a cancel: handled in the loop below via the wake-up fd
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # one sent since the fork arrives now

    log_fd = _open_log(launch.log, launch.account, launch.log_group)
    out_read, out_write = os.pipe()
    with contextlib.suppress(OSError):
        fcntl.fcntl(out_read, fcntl.F_SETPIPE_SZ, _CHUNK)  # fewer wake-ups for a chatty job
    argv, cwd, credentials = as_user(launch.argv, launch.cwd, launch.account)
    try:
        job = subprocess.Popen(
            argv, env=dict(launch.env), cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=out_write, stderr=out_write, start_new_session=True, **credentials,
        )  # fmt: skip
    except OSError as err:
        os.write(log_fd, f"gpuq: could not start {launch.argv[0]}: {err.strerror}\n".encode())
        _finish(launch, {"started": True, "spawn_error": f"{launch.argv[0]}: {err.strerror}"})
        return 0
    finally:
        os.close(out_write)  # only the job's processes hold it now: end of file means they are all gone
    output = _Log(log_fd, log_limit())
    started = time.time()
    write_atomic(launch.pid_file, json.dumps({"pid": job.pid, "start": start_time(job.pid)}).encode(), durable=False)

    reason, kill_at = "", None
    deadline = None if launch.time_limit is None else started + launch.time_limit
    pidfd = os.pidfd_open(job.pid)
    watched = [pidfd, wake_read, out_read]
    while True:
        now = time.time()
        due = [t for t in (deadline if not reason else None, kill_at) if t is not None]
        timeout = max(0.0, min(due) - now) if due else None
        ready, _, _ = select.select(watched, [], [], timeout)
        if out_read in ready and not output.pump(out_read):
            watched.remove(out_read)  # the job closed its stdout and stderr
        if pidfd in ready:
            break
        now = time.time()
        if wake_read in ready and signal.SIGTERM in os.read(wake_read, 64) and not reason:
            reason = "cancel"
        elif deadline is not None and now >= deadline and not reason:
            reason = "timeout"
        elif kill_at is not None and now >= kill_at:
            _signal_group(job.pid, signal.SIGKILL)
            kill_at = None
            continue
        else:
            continue
        _signal_group(job.pid, signal.SIGTERM)
        kill_at = now + launch.grace
    returncode = job.wait()
    _signal_group(job.pid, signal.SIGKILL)  # stragglers the job left behind would hold its GPU memory
    if out_read in watched:
        output.drain(out_read)  # what the job wrote just before it ended is still in the pipe
    os.close(out_read)
    os.close(log_fd)
    _finish(launch, {
        "started": True,
        "exit_code": returncode if returncode >= 0 else None,
        "signal": -returncode if returncode < 0 else None,
        "reason": reason,
    })  # fmt: skip
    return 0


def log_limit(environ: Mapping[str, str] | None = None) -> int:
    """Bytes of a job's output kept in its log: GPUQ_LOG_LIMIT (bytes, or a size like 512M), else 1 GiB."""
    raw = (os.environ if environ is None else environ).get("GPUQ_LOG_LIMIT", "").strip()
    if raw.isdigit():
        return int(raw)
    try:
        return parse_size(raw) if raw else LOG_LIMIT
    except BadInput:
        return LOG_LIMIT  # a shim has nobody to tell: keep the default rather than no limit at all


class _Log:
    """A job's output on its way from the pipe to the log file: kept up to a limit, then discarded."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = limit
        self.room = limit
        self.full = False
        self.broken = False  # a write failed (a full disk): keep reading, keep nothing
        self.ends_line = True

    def pump(self, pipe: int) -> bool:
        """Copy what the pipe holds now. False at end of file (no process holds its write end)."""
        data = os.read(pipe, _CHUNK)
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
        view = memoryview(data)
        while view and not self.broken:
            try:
                view = view[os.write(self.fd, view) :]
            except OSError:
                self.broken = True
        if data:
            self.ends_line = data.endswith(b"\n")


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _finish(launch: Launch, outcome: dict[str, object]) -> None:
    outcome["job"] = launch.job_id
    outcome["ended_at"] = time.time()
    # Not fsynced: the rename is atomic against a daemon crash, which is what the exit file is for. Only a
    # machine crash could lose it, and then the changed boot id marks the job lost anyway; two fsyncs
    # here would sit between every job's end and the next job's start.
    write_atomic(launch.exit_file, json.dumps(outcome).encode(), durable=False)
    with contextlib.suppress(OSError):
        fd = os.open(launch.wake, os.O_WRONLY | os.O_NONBLOCK)
        with contextlib.suppress(OSError):
            os.write(fd, b"!")
        os.close(fd)


def signal_shim(pid: int, started: float | None) -> bool:
    """Ask a shim to stop its job (it escalates to SIGKILL itself). False if that shim is gone."""
    if not is_alive(pid, started):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        return True
    return False


def ancestors(pid: int) -> list[int]:
    """A process's parent, grandparent and so on, up to init."""
    import psutil

    try:
        return [parent.pid for parent in psutil.Process(pid).parents()]
    except psutil.Error:
        return []
