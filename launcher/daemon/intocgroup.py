"""Starting a job's first process straight inside its cgroup: ``clone3(CLONE_INTO_CGROUP)`` (Linux 5.7+).

The other way, moving the shim into the job's cgroup, spawning and moving it back, costs two migrations, and
each waits for an RCU grace period in the kernel (``cgroup_threadgroup_rwsem``) when jobs start apart, as they
do: 7-15 ms between one job's end and the next one's start. A process cloned into its cgroup is never
migrated and never waits (docs/containment.md#costs).

Python has no clone3, so the shim calls the system call through ctypes: a fork in all but name (a copy of
the shim, where posix_spawn's vfork shares it: about 2.5 ms against 0.3 on the 2-core VM), after which
the child runs a few ``os`` calls and execs the program, looked up before. That is safe only in a process
with one thread (the shim: a fork of the daemon that starts none), so ``spawn`` refuses otherwise, and the
shim then migrates instead.
The child must never return into the shim's code: every path out of ``_child`` is an exec or ``os._exit``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import gc
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any

_SYS_CLONE3 = 435  # the same number on every architecture: clone3 came after the tables were unified
_CLONE_INTO_CGROUP = 0x200000000


class _CloneArgs(ctypes.Structure):
    _fields_ = [  # struct clone_args, up to CLONE_ARGS_SIZE_VER2 (the cgroup field)
        (name, ctypes.c_uint64)
        for name in (
            "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls",
            "set_tid", "set_tid_size", "cgroup",
        )
    ]  # fmt: skip


class Unsupported(Exception):
    """clone3 into a cgroup cannot be used here (an old kernel, a seccomp filter, more than one thread)."""


_EVERY_SIGNAL = tuple(int(signum) for signum in signal.valid_signals())  # numbers: sets of enums cost 100 us
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
    ``cgroup``: its pid. OSError if it cannot start; Unsupported if this way cannot be used here."""
    return prepare(cgroup, argv, cwd, env, credentials, output).go()


class Gone(Exception):
    """The process made ahead ended before it was told to exec (a signal): nothing of the job ran."""


class Born:
    """A job's first process, cloned into its cgroup ahead of its start, waiting for ``go`` to exec the job.

    The clone is what costs (a copy of the shim); the exec after it is cheap. A successor staged behind a
    running job is born this way while that job runs (``launcher.daemon.ahead``), so its start is one byte
    down a pipe. Until then it holds the job's output pipe and nothing else of the shim's, has the default
    signal dispositions and runs with the shim's credentials (``go`` drops them): no user can signal it or read
    the copy of the shim it is."""

    def __init__(self, pid: int, go: int, report: int) -> None:
        self.pid = pid
        self._go = go  # a byte: exec; end of file: exit
        self._report = report  # end of file: the exec happened; digits: the errno it failed with

    def go(self) -> int:
        """Exec the job: its pid. OSError if the exec failed (the process is reaped); Gone if it had ended."""
        try:
            os.write(self._go, b"!")
        except BrokenPipeError:
            self.abandon()
            raise Gone(f"process {self.pid}, made ahead, had ended") from None
        os.close(self._go)
        self._go = -1
        report = b""
        try:
            while chunk := os.read(self._report, 64):
                report += chunk
        finally:
            os.close(self._report)
            self._report = -1
        if report:
            os.waitpid(self.pid, 0)
            code = int(report) if report.isdigit() else errno.EIO
            raise OSError(code, os.strerror(code))
        return self.pid

    def abandon(self) -> None:
        """Let it go without running anything: it exits at the end of file, and is reaped."""
        for fd in (self._go, self._report):
            if fd >= 0:
                os.close(fd)
        self._go = self._report = -1
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def prepare(
    cgroup: str, argv: Sequence[str], cwd: str, env: Mapping[str, str], credentials: Mapping[str, Any], output: int
) -> Born:
    """Clone the process that will run ``argv`` (see ``spawn``) into ``cgroup`` now, to exec on ``Born.go``.
    OSError if the program is not there or the clone fails; Unsupported if this way cannot be used here."""
    global _unsupported
    if _unsupported is not None:
        raise Unsupported(_unsupported)
    if len(os.listdir("/proc/self/task")) > 1:  # C threads too (a library's pool), which threading does not count
        raise Unsupported("this process runs more than one thread")
    program, arguments, environment = _find(argv[0], cwd, env), list(argv), dict(env)  # built before the clone
    where = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    go_read, go_write = os.pipe()
    report_read, report_write = os.pipe()  # close-on-exec: end of file says the exec happened
    args = _CloneArgs(flags=_CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=where)
    # The shim's handlers (and SIGPIPE and SIGXFSZ, which Python ignores and the job must not) go back to their
    # defaults in the child, and no signal is let in there before: no Python handler may run in the child.
    handled = [s for s in _EVERY_SIGNAL if callable(signal.getsignal(s))] + [signal.SIGPIPE, signal.SIGXFSZ]
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _EVERY_SIGNAL)
    collecting = gc.isenabled()
    gc.disable()  # no finalizer may run in the child
    try:
        pid = _syscall()(_SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args))
        if pid == 0:
            _child(go_read, report_write, handled, blocked, program, arguments, cwd, environment, credentials, output)
        failure = ctypes.get_errno()
    finally:
        if collecting:
            gc.enable()
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for fd in (where, go_read, report_write):
            os.close(fd)
    if pid < 0:
        os.close(go_write)
        os.close(report_read)
        if failure in (errno.ENOSYS, errno.EINVAL, errno.E2BIG, errno.EPERM):
            _unsupported = f"clone3 into a cgroup: {os.strerror(failure)}"
            raise Unsupported(_unsupported)
        raise OSError(failure, os.strerror(failure))
    return Born(int(pid), go_write, report_read)


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


def _child(
    go: int, report: int, handled: list[int], mask: set[int | signal.Signals], program: str, argv: list[str],
    cwd: str, env: dict[str, str], credentials: Mapping[str, Any], output: int,
) -> None:
    code = errno.EIO
    try:
        for signum in handled:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal now ends this child, as it would the job
        os.setsid()
        _close_all_but(go, report, output)  # as Popen does: a job, root's or a user's, inherits nothing of its shim's
        if os.read(go, 1) != b"!":
            os._exit(0)  # let go (``Born.abandon``), or its shim died: nothing runs
        if credentials:  # as Popen does it: groups, then group, then user, before anything the user controls
            os.setgroups(list(credentials["extra_groups"]))
            os.setregid(credentials["group"], credentials["group"])
            os.setreuid(credentials["user"], credentials["user"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        _close_all_but(report)
        os.chdir(cwd)
        os.execve(program, argv, env)
    except OSError as err:
        code = err.errno or errno.EIO
    except BaseException:  # nothing may escape into the shim's code in this copy of it
        pass
    try:
        os.write(report, str(code).encode())
    finally:
        os._exit(127)


def _close_all_but(*kept: int) -> None:
    low = 3
    for fd in sorted(kept):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)
