"""Starting a job's first process straight inside its cgroup: ``clone3(CLONE_INTO_CGROUP)`` (Linux 5.7+).

The other way, moving the shim into the job's cgroup, spawning and moving it back, costs two migrations, and
each waits for an RCU grace period in the kernel (``cgroup_threadgroup_rwsem``) when jobs start apart, as they
do: 7-15 ms between one job's end and the next one's start. A process cloned into its cgroup is never
migrated and never waits (docs/containment.md#costs).

Python has no clone3, so the shim calls the system call through ctypes: a fork in all but name (a copy of
the shim, where posix_spawn's vfork shares it), after which the child runs a few ``os`` calls and execs.
That is safe only in a process with one thread (the shim: a fork of the daemon that starts none), so both
ways below refuse otherwise, and the shim then migrates instead. The child must never return into the shim's
code: every path out of it is an exec or ``os._exit``.

- ``spawn``: the child execs the job at once. The copy, and its teardown at the exec, cost a few ms more
  than a vfork (more, the larger the shim). A job of the shim's own user is spawned by the C library instead
  where it can do so into a cgroup (``spawncg``: a vfork, glibc 2.39 and later).
- ``prepare``: for a job staged behind a running one. A small waiter (``launcher.supervisor.waiter``: an
  interpreter, ``-I -S``, an empty environment, the job's details in a memfd) is born in the job's cgroup, and
  execs the job when told (``Born.go``). The shim's zygote (``launcher.supervisor.zygote``) makes it, a copy of
  itself; where it cannot, the shim's clone execs into a fresh waiter. Either happens while the job ahead
  still runs; at the job's turn only the waiter's own exec is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import gc
import marshal
import os
import select
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuq_scheduler.launcher.supervisor import spawncg, waiter, zygote
from gpuq_scheduler.launcher.supervisor.waiter import CLONE_ARGS, Job, become, close_all_but

_SYS_CLONE3 = 435  # the same number on every architecture: clone3 came after the tables were unified
_CLONE_INTO_CGROUP = 0x200000000


class _CloneArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in CLONE_ARGS]


class Unsupported(Exception):
    """clone3 into a cgroup cannot be used here (an old kernel, a seccomp filter, more than one thread)."""


_REFUSED = (errno.ENOSYS, errno.EINVAL, errno.E2BIG, errno.EPERM)  # clone3 into a cgroup cannot be done here
_unsupported: str | None = None  # why, once learned: each later spawn migrates without trying again


@functools.cache
def _syscall() -> Any:
    # PyDLL, not CDLL: the GIL stays held across the call, so the child comes back holding it, as after fork.
    libc = ctypes.PyDLL(None, use_errno=True)
    call = libc.syscall
    call.restype = ctypes.c_long
    call.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t]
    return call


def spawn(
    cgroup: str, argv: Sequence[str], cwd: str, env: Mapping[str, str], credentials: Mapping[str, Any], output: int
) -> int:
    """Start ``argv`` as ``processes.spawn`` would (its own session, stdin /dev/null, stdout and stderr to
    ``output``, ``credentials`` as Popen's user/group/extra_groups, the program found on ``env``'s PATH), born in
    ``cgroup``: its pid. OSError if it cannot start; Unsupported if this way cannot be used here. A job that
    runs as the shim's user is spawned by the C library where it can (``spawncg``: no copy of the shim)."""
    if not credentials and spawncg.usable():
        return ready(cgroup, argv, cwd, env, output).run()
    return cloned(cgroup, argv, cwd, env, credentials, output)


def ready(cgroup: str, argv: Sequence[str], cwd: str, env: Mapping[str, str], output: int) -> spawncg.Prepared:
    """The C library's spawn of ``argv`` (as ``spawn`` would start it, as the shim's user) into ``cgroup``, built
    now and run later (``spawncg.Prepared``); only where ``spawncg.usable()``. OSError if the program is not
    there or the cgroup cannot be opened."""
    program = _find(argv[0], cwd, env)
    return spawncg.Prepared(cgroup, output).given(program, argv, cwd, env)


def cloned(
    cgroup: str, argv: Sequence[str], cwd: str, env: Mapping[str, str], credentials: Mapping[str, Any], output: int
) -> int:
    """``spawn`` by a clone of the shim, whatever the C library can do."""
    job = details(argv, cwd, env, credentials)  # built before the clone
    report_read, report_write = os.pipe()  # close-on-exec: end of file says the exec happened
    try:
        pid = _clone(cgroup, functools.partial(_exec_job, report_write, output, job))
    finally:
        os.close(report_write)
    try:
        report = _read_all(report_read)
    finally:
        os.close(report_read)
    if report:
        os.waitpid(pid, 0)
        raise _failure(report)
    return pid


class Gone(Exception):
    """The process made ahead ended, or its waiter could not start, before its turn: nothing of the job ran."""


class Born:
    """A job's first process, cloned into its cgroup ahead of its turn: a waiter that execs the job on ``go``.

    It runs as the shim's user (the job's credentials are taken at ``go``) with an empty environment and
    nothing of the shim's memory, holding only its pipes, the job's output and the job's details."""

    def __init__(self, pid: int, go: int, report: int) -> None:
        self.pid = pid
        self._go = go  # a byte: exec the job; end of file: exit
        self._report = report  # "+": ready; then end of file: the job's exec happened; digits: the errno it failed with
        self._ready = False

    def ready(self) -> bool:
        """Whether the waiter is up and waiting (its interpreter started, the details read): told to go
        before, the job would wait for that start, dearer than a clone at once."""
        if not self._ready and self._report >= 0 and select.select([self._report], [], [], 0)[0]:
            self._ready = os.read(self._report, 1) == b"+"  # anything else (end of file, "W"): it failed
        return self._ready

    def go(self) -> int:
        """Exec the job: its pid. OSError if the exec failed (the process is reaped); Gone if it cannot be."""
        try:
            os.write(self._go, b"!")
        except BrokenPipeError:
            self.abandon()
            raise Gone(f"process {self.pid}, made ahead, had ended") from None
        try:
            report = _read_all(self._report)
        finally:
            self._close()
        if not self._ready:
            report = report.removeprefix(b"+")
        if report:
            os.waitpid(self.pid, 0)
            if report.startswith(b"W"):
                raise Gone(f"its waiter could not start: {os.strerror(int(report[1:] or 5))}")
            raise _failure(report)
        return self.pid

    def abandon(self) -> None:
        """Let it go without running anything: it exits at the end of file, and is reaped."""
        self._close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)

    def _close(self) -> None:
        for fd in (self._go, self._report):
            if fd >= 0:
                os.close(fd)
        self._go = self._report = -1


def prepare(
    cgroup: str, argv: Sequence[str], cwd: str, env: Mapping[str, str], credentials: Mapping[str, Any], output: int
) -> Born:
    """Clone the process that will run ``argv`` (see ``spawn``) into ``cgroup`` now, to exec on ``Born.go``.
    OSError if the program is not there or the clone fails; Unsupported if this way cannot be used here."""
    return _waiter(cgroup, details(argv, cwd, env, credentials), output)


def details(argv: Sequence[str], cwd: str, env: Mapping[str, str], credentials: Mapping[str, Any]) -> Job:
    """What the clone or a waiter execs: OSError if the program is not there (see ``spawn``)."""
    return _find(argv[0], cwd, env), list(argv), dict(env), cwd, _creds(credentials)


def _waiter(cgroup: str, job: Job, output: int) -> Born:
    memfd = os.memfd_create("gpuq-job", os.MFD_CLOEXEC)
    go_read, go_write = os.pipe()
    report_read, report_write = os.pipe()
    try:
        _write_all(memfd, marshal.dumps(job))  # trusted: only this shim writes it, only its waiter reads it
        fds = (go_read, report_write, memfd, output)
        pid = _from_zygote(cgroup, fds) or _clone(cgroup, functools.partial(_exec_waiter, fds))
    except BaseException:
        for fd in (go_write, report_read):
            os.close(fd)
        raise
    finally:
        os.close(go_read)
        os.close(report_write)
        os.close(memfd)
    return Born(pid, go_write, report_read)


def _from_zygote(cgroup: str, fds: tuple[int, int, int, int]) -> int | None:
    """A waiter made by the shim's zygote (``launcher.supervisor.zygote``): its pid, or None where it cannot."""
    global _unsupported
    if _unsupported is not None:
        raise Unsupported(_unsupported)
    try:
        return zygote.make(cgroup, fds)
    except OSError as err:
        if err.errno in _REFUSED:
            _unsupported = f"clone3 into a cgroup: {os.strerror(err.errno)}"
            raise Unsupported(_unsupported) from None
        raise


def _creds(credentials: Mapping[str, Any]) -> tuple[int, int, list[int]] | None:
    if not credentials:
        return None
    return int(credentials["user"]), int(credentials["group"]), [int(g) for g in credentials["extra_groups"]]


def _clone(cgroup: str, child: Callable[[list[int], set[int | signal.Signals]], None]) -> int:
    """clone3 into ``cgroup``: the child's pid. The child runs ``child(handled, mask)``, which must exec or exit;
    OSError if the clone fails, Unsupported if it cannot be done here."""
    global _unsupported
    if _unsupported is not None:
        raise Unsupported(_unsupported)
    if len(os.listdir("/proc/self/task")) > 1:  # C threads too (a library's pool), which threading does not count
        raise Unsupported("this process runs more than one thread")
    where = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    args = _CloneArgs(flags=_CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=where)
    # The shim's handlers (and SIGPIPE and SIGXFSZ, which Python ignores and the job must not) go back to their
    # defaults in the child, and no signal is let in there before: no Python handler may run in the child.
    handled = spawncg.to_default()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, spawncg.EVERY_SIGNAL)
    collecting = gc.isenabled()
    gc.disable()  # no finalizer may run in the child
    try:
        pid = _syscall()(_SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args))
        if pid == 0:
            try:
                child(handled, blocked)
            finally:
                os._exit(127)
        failure = ctypes.get_errno()
    finally:
        if collecting:
            gc.enable()
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(where)
    if pid < 0:
        if failure in _REFUSED:
            _unsupported = f"clone3 into a cgroup: {os.strerror(failure)}"
            raise Unsupported(_unsupported)
        raise OSError(failure, os.strerror(failure))
    return int(pid)


def _find(name: str, cwd: str, env: Mapping[str, str]) -> str:
    """The program ``name`` on ``env``'s PATH, from ``cwd``, as execvp in the job would find it (a name with a
    slash is itself); OSError if none is there. Looked up before the clone, so that the child execs once."""
    if "/" in name:
        return name
    denied = False
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(cwd, folder or ".", name)
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return path
            denied = True  # as execvp: a later one may still run; if none does, this is the error
    code = errno.EACCES if denied else errno.ENOENT
    raise OSError(code, os.strerror(code), name)


def _exec_job(report: int, output: int, job: Job, handled: list[int], mask: set[int | signal.Signals]) -> None:
    """In the clone: exec the job now."""
    code = errno.EIO
    try:
        _reset(handled, mask)
        become(job, output, report)
    except OSError as err:
        code = err.errno or errno.EIO
    except BaseException:  # nothing may escape into the shim's code in this copy of it
        pass
    _report(report, str(code).encode())


def _exec_waiter(fds: tuple[int, int, int, int], handled: list[int], mask: set[int | signal.Signals]) -> None:
    """In the clone: become the waiter (``launcher.supervisor.waiter``, run as a script), holding only the four
    descriptors ``fds`` (go, report, the job's details, its output)."""
    code = errno.EIO
    try:
        _reset(handled, mask)
        close_all_but(*fds)
        for fd in fds:
            os.set_inheritable(fd, True)
        words = [sys.executable, "-I", "-S", waiter.__file__, *map(str, fds), waiter.WAITING]
        os.execve(sys.executable, words, {})  # no variable of the job's reaches this interpreter
    except OSError as err:
        code = err.errno or errno.EIO
    except BaseException:
        pass
    _report(fds[1], b"W%d" % code)


def _reset(handled: list[int], mask: set[int | signal.Signals]) -> None:
    for signum in handled:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal now ends this child, as it would the job
    os.setsid()


def _report(report: int, what: bytes) -> None:
    try:
        os.write(report, what)
    finally:
        os._exit(127)


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 64):
        data += chunk
    return data


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _failure(report: bytes) -> OSError:
    code = int(report) if report.isdigit() else errno.EIO
    return OSError(code, os.strerror(code))
