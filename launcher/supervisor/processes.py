"""What a job runs as, with and where, and how to find and stop its processes.

The command line and environment a job gets (``job_argv``, ``job_env``), the credentials it runs with
in a shared queue (``as_user``), how its process starts (``spawn``), --notify commands, and the process
facts the daemon checks (a pid's start time, a shim's liveness, a process tree). The shim that supervises a
job is ``launcher.supervisor.shim``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs.accounts import Account
from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Mode
from gpuq_scheduler.jobs.shown import shown
from gpuq_scheduler.launcher.supervisor import intocgroup, spawncg

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


def spawn(
    argv: list[str],
    cwd: str,
    env: Mapping[str, str],
    credentials: dict[str, Any],
    output: int,
    cgroup: str | None = None,
) -> tuple[int, float | None, Callable[[], int]]:
    """Start a job's process in a session of its own (its group is the job), stdin from /dev/null, stdout and
    stderr to ``output``: its pid, its start time (``start_time``), and what waits for it and returns its exit
    status (negative: the signal that ended it). OSError if it cannot start. With ``cgroup``, the process is
    born in that cgroup (``intocgroup``; its Unsupported if that cannot be done here).

    ``os.posix_spawnp`` rather than ``subprocess.Popen``: the same vfork and exec, without Popen's Python-side
    set-up, in the moment between one job's end and the next one's start on that GPU. Popen only for a job that runs
    as another user (a shared queue): posix_spawn cannot drop privileges. Like Popen: the job's own PATH finds its
    program, from its directory, and SIGPIPE and SIGXFSZ, which Python ignores, are default again for it."""
    before = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    reap: Callable[[], int]
    if cgroup is not None:
        pid = intocgroup.spawn(cgroup, argv, cwd, env, credentials, output)
        reap = functools.partial(_reap, pid)
    elif credentials or not hasattr(os, "posix_spawnp"):
        job = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,
            **credentials,
        )
        pid, reap = job.pid, job.wait
    else:
        # posix_spawnp searches the PATH of the process that calls it: this shim's, set to the job's.
        os.environ["PATH"] = env.get("PATH", os.defpath)
        os.chdir(cwd)  # the shim's own directory: it opens nothing by a relative name
        try:
            pid = os.posix_spawnp(
                argv[0],
                argv,
                env,
                setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, output, 1),
                    (os.POSIX_SPAWN_DUP2, output, 2),
                ],
            )
        finally:
            os.chdir("/")  # not holding the job's directory (a mount to unmount) once it has ended
        reap = functools.partial(_reap, pid)
    return pid, started_between(pid, before, time.clock_gettime_ns(time.CLOCK_BOOTTIME)), reap


def spawn_ready(ready: spawncg.Prepared) -> tuple[int, float | None, Callable[[], int]]:
    """``spawn``, for a job whose spawn into its cgroup was built ahead (``intocgroup.ready``)."""
    before = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    pid = ready.run()
    return pid, started_between(pid, before, time.clock_gettime_ns(time.CLOCK_BOOTTIME)), reaper(pid)


def born_ahead(make: Callable[[], intocgroup.Born]) -> tuple[intocgroup.Born, float | None]:
    """A job's waiter, made by ``make`` (``intocgroup.prepare``), cloned into the job's cgroup now and waiting to
    exec (``intocgroup.Born.go``), and its start time: the job's first process is this one."""
    before = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    born = make()
    return born, started_between(born.pid, before, time.clock_gettime_ns(time.CLOCK_BOOTTIME))


def reaper(pid: int) -> Callable[[], int]:
    """What waits for child ``pid`` and returns its exit status (negative: the signal that ended it)."""
    return functools.partial(_reap, pid)


def _reap(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def started_between(pid: int, before: int, after: int) -> float | None:
    """``start_time(pid)`` of a process created between two CLOCK_BOOTTIME readings (ns). The kernel stamps a
    new process with that clock and /proc shows the stamp in whole clock ticks: when both readings fall in one
    tick, that tick is the answer, without reading /proc/<pid>/stat while the process execs (at the moment
    the job starts). Otherwise (a tick boundary between them) it is read."""
    per_tick = 1_000_000_000 // _CLOCK_TICKS
    if before // per_tick == after // per_tick:
        return before // per_tick / _CLOCK_TICKS
    return start_time(pid)


def job_argv(spec: JobSpec, port: int | None) -> list[str]:
    """The command line the job's process runs with."""
    command = list(spec.command)
    if spec.mode is Mode.TORCHRUN:
        assert spec.python is not None and port is not None
        return [
            spec.python,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(spec.gpus),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            *command,
        ]
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


def maps_library(pid: int, name: str) -> bool:
    """Whether process ``pid`` has a shared library whose file name starts with ``name`` mapped (NCCL's, say:
    a process of several that talk through it). False where its maps cannot be read."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as handle:
            return any(os.path.basename(line.split()[-1]).startswith(name.encode()) for line in handle if b"/" in line)
    except OSError:
        return False


def preemption_env(spec: JobSpec, restarts_file: str) -> dict[str, str]:
    """What a --preemptible job is told: the signal it gets before it is requeued (GPUQ_PREEMPT_SIGNAL), and,
    once it was (its restarts file), GPUQ_PREEMPTED=1 and GPUQ_RESTART_COUNT."""
    env: dict[str, str] = {}
    if not spec.preemptible:
        return env  # only a --preemptible job is ever requeued for another: nothing to read
    env["GPUQ_PREEMPT_SIGNAL"] = "SIG" + (spec.preempt_signal or "USR1")
    with contextlib.suppress(OSError, ValueError):
        with open(restarts_file) as handle:
            count = int(handle.read().strip() or 0)
        if count > 0:
            env.update(GPUQ_PREEMPTED="1", GPUQ_RESTART_COUNT=str(count))
    return env


def notify(command: str, env: Mapping[str, str], cwd: str, log: str, account: Account | None = None) -> None:
    """Start a --notify command through the shell, detached (as the job's user); its output goes to ``log``.

    The daemon reaps it like any child and never waits for it: a slow webhook cannot stall the queue.
    """
    argv, workdir, credentials = as_user(["/bin/sh", "-c", command], cwd, account)
    with os.fdopen(open_log(log, account, None), "ab") as out:
        subprocess.Popen(
            argv,
            env=dict(env),
            cwd=workdir if os.path.isdir(workdir) else "/",
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            **credentials,
        )


def open_log(path: str, account: Account | None, group: int | None) -> int:
    """Open a log for appending; in a shared queue it belongs to the job's user and is readable by the
    admin group only, never by the user's own group (``logs/`` is root's: nobody can plant a link there)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    if account is not None and account.uid != os.geteuid():
        os.fchown(fd, account.uid, account.gid if group is None else group)
        os.fchmod(fd, 0o600 if group is None else 0o640)
    return fd


def open_output(path: str, account: Account | None, log_fd: int) -> int | None:
    """A job's --output file ("": none), opened as its user (``open_as``); where that fails, one line in its log
    (``log_fd``) says why, and the job runs all the same, its output in `gpuq logs` alone."""
    if not path:
        return None
    opened = open_as(path, account)
    if isinstance(opened, str):
        os.write(log_fd, f"gpuq: --output {shown(path)}: {opened}; the output is in `gpuq logs` only\n".encode())
        return None
    return opened


def open_as(path: str, account: Account | None) -> int | str:
    """``path`` opened to write (created 0644, or emptied) by ``account``'s user, as that user would open it:
    a shared queue's root shim forks a child that drops to the user, opens it and hands the descriptor back,
    so a link or a directory the user cannot write gets the user's rights, never root's. Only a regular file:
    a FIFO or a device could stall the shim that copies the job's output. The descriptor, or why not."""
    if account is None or account.uid == os.geteuid():
        return _open_regular(path)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # the child's end closing is an EOF
    pid = os.fork()
    if pid == 0:  # the child: the user's rights, then the file
        code = 1
        try:
            ours.close()
            os.setgroups(list(account.groups))
            os.setgid(account.gid)
            os.setuid(account.uid)
            opened = _open_regular(path)
            if isinstance(opened, int):
                socket.send_fds(theirs, [b"fd"], [opened])
            else:
                theirs.send(opened.encode(errors="replace")[:1000])
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    try:
        message, fds, _, _ = socket.recv_fds(ours, 1024, 1)
    except OSError as err:
        return f"could not be opened as its user ({err.strerror})"
    finally:
        ours.close()
        os.waitpid(pid, 0)
    return fds[0] if fds else (message.decode(errors="replace") or "could not be opened as its user")


def _open_regular(path: str) -> int | str:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        return err.strerror or str(err)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return "not a regular file"
    os.set_blocking(fd, True)
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


def job_pids(record: JobRecord, shim_pid: int) -> set[int]:
    """A running job's processes: its shim's tree and, for an interactive job, everything under the gpuq
    client whose program uses its GPUs (if that client is the job owner's)."""
    found = set(tree_pids(shim_pid))
    client = record.spec.client
    if client is not None and owner(client) == record.uid:
        found.update(tree_pids(client))
    return found


def signal_shim(pid: int, started: float | None) -> bool:
    """Ask a shim to stop its job (it escalates to SIGKILL itself). False if that shim is gone."""
    if not is_alive(pid, started):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        return True
    return False


def owner(pid: int) -> int | None:
    """The uid a process runs as, or None if it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def ancestors(pid: int) -> list[int]:
    """A process's parent, grandparent and so on, up to init."""
    import psutil

    try:
        return [parent.pid for parent in psutil.Process(pid).parents()]
    except psutil.Error:
        return []
