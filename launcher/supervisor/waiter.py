"""The waiter: a job's first process, born in its cgroup ahead of its turn (``intocgroup.prepare``), until
then a small interpreter of its own rather than a copy of the shim.

Run as a script (``python -I -S waiter.py GO REPORT DETAILS OUTPUT``): it imports nothing of gpuq's and
nothing from the job's environment reaches it. It reads the job's details (marshalled by the shim into the
memfd DETAILS), writes ``+`` down REPORT (ready), waits for one byte on GO (end of file: it exits, nothing
run), and then becomes the job as the shim's clone would (``become``). REPORT closes at the job's exec; if the
exec fails, the errno is written there instead.

It imports only modules built into the interpreter: ``posix`` for ``os`` (the same functions) and ``_signal``
for ``signal``, whose enums pull in enum, functools and collections. A waiter is born for every job handed
off, and those imports took 6 of its 15 ms of CPU on the 2-core VM, where the jobs starting on the other GPUs
want the same cores; a smaller interpreter is also less to tear down at the job's exec.

Run as ``python -I -S waiter.py zygote CONTROL - - WAITING`` it is a shim's *zygote* instead: it makes its
shim's waiters, each a copy of itself cloned into the job's cgroup (``clone3`` with ``CLONE_INTO_CGROUP``, and
``CLONE_PARENT``: a child of the shim, which reaps it), given its four descriptors over CONTROL (a socket, with
the cgroup's directory). A copy of an interpreter that has started costs a clone (VM: 12 ms of CPU for an
interpreter's start and the shim's copy and teardown before it), and its exec tears down less, its pages still
the zygote's (``bench/zygote.py``).
"""

from __future__ import annotations

import errno
import marshal
import posix
import sys

WAITING = "gpuq: waiting for its turn"  # its last word, for people (ps, top) and doctor

# The program (found already), its argv, environment and directory, and the credentials it runs with (user,
# group, supplementary groups), None to keep the shim's.
Job = tuple[str, list[str], dict[str, str], str, tuple[int, int, list[int]] | None]


def become(job: Job, output: int, report: int) -> None:
    """Take the job's credentials, stdin, stdout and stderr, and directory, and exec it: as Popen does it,
    groups, then group, then user, before anything the user controls; a job, root's or a user's, inherits
    nothing of its shim's descriptors but ``report``, which closes at the exec. OSError if it cannot."""
    program, argv, env, cwd, credentials = job
    if credentials is not None:
        user, group, groups = credentials
        posix.setgroups(groups)
        posix.setregid(group, group)
        posix.setreuid(user, user)
    null = posix.open("/dev/null", posix.O_RDONLY)
    posix.dup2(null, 0)
    posix.dup2(output, 1)
    posix.dup2(output, 2)
    close_all_but(report)
    posix.chdir(cwd)
    posix.execve(program, argv, env)


def close_all_but(*kept: int) -> None:
    """Close every descriptor from 3 up but ``kept``."""
    low = 3
    for fd in sorted(kept):
        posix.closerange(low, fd)
        low = fd + 1
    posix.closerange(low, 65536)


def main(go: int, report: int, details: int, output: int) -> None:
    signals = __import__("_signal")  # set up now, while the job ahead runs, rather than at the job's turn
    for signum in (signals.SIGPIPE, signals.SIGXFSZ):  # ignored by Python at start-up; the job gets defaults
        signals.signal(signum, signals.SIG_DFL)
    posix.set_inheritable(report, False)
    job = _details(details)
    posix.write(report, b"+")
    code = errno.EIO
    try:
        if posix.read(go, 1) != b"!":
            posix._exit(0)  # let go, or its shim died: nothing runs
        if job is None:
            raise OSError(errno.EINVAL, "told to go with no job")
        become(job, output, report)
    except OSError as err:
        code = err.errno or errno.EIO
    posix.write(report, str(code).encode())
    posix._exit(127)


def is_waiter(pid: int | str) -> bool:
    """Whether process ``pid`` is a waiter (it has run nothing of its job yet)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().split(b"\0")
    except OSError:
        return False
    # [python, -I, -S, this file, four descriptors, WAITING], and the empty word after the last NUL; a copy of
    # the zygote has its words, [python, -I, -S, this file, zygote, its socket, -, -, WAITING]
    return len(words) == 10 and words[3] == __file__.encode() and words[8] == WAITING.encode()


def _details(details: int) -> Job | None:
    size = posix.fstat(details).st_size
    return marshal.loads(posix.pread(details, size, 0)) if size else None


# struct clone_args, up to CLONE_ARGS_SIZE_VER2 (the cgroup field): every field a 64-bit integer. Declared here,
# where the zygote builds its own without importing ctypes at the top; intocgroup's structure uses it too.
CLONE_ARGS = (
    "flags",
    "pidfd",
    "child_tid",
    "parent_tid",
    "exit_signal",
    "stack",
    "stack_size",
    "tls",
    "set_tid",
    "set_tid_size",
    "cgroup",
)


def zygote(control: int) -> None:
    """Make a waiter for each request on the socket ``control`` (a byte, with five descriptors: the job's
    cgroup, then ``main``'s four), answering its pid, or minus the errno its clone failed with; exit at the end
    of file (the shim ended). The shim checked the cgroup; this process runs one thread."""
    close_all_but(control)  # whatever else the shim let it inherit
    ctypes, gc, sockets = __import__("ctypes"), __import__("gc"), __import__("_socket")
    signals = __import__("_signal")
    gc.disable()  # no finalizer may run in a copy of this process
    call = ctypes.PyDLL(None, use_errno=True).syscall  # PyDLL: the GIL is held across it, as after a fork
    call.restype, call.argtypes = ctypes.c_long, [ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t]
    fields = [(name, ctypes.c_uint64) for name in CLONE_ARGS]
    args = type("CloneArgs", (ctypes.Structure,), {"_fields_": fields})()
    every = signals.valid_signals()
    socket = sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET, 0, control)
    room = sockets.CMSG_SPACE(5 * 4)
    while True:
        message, extra, _, _ = socket.recvmsg(1, room)
        if not message:
            posix._exit(0)
        fds = [int.from_bytes(data[at : at + 4], sys.byteorder) for _, _, data in extra for at in (0, 4, 8, 12, 16)]
        args.flags, args.exit_signal, args.cgroup = _CLONE_INTO_CGROUP | _CLONE_PARENT, 0, fds[0]
        blocked = signals.pthread_sigmask(signals.SIG_BLOCK, every)
        pid = call(435, ctypes.byref(args), ctypes.sizeof(args))  # SYS_clone3, on every architecture
        if pid == 0:
            try:
                close_all_but(*fds[1:])
                posix.setsid()
                signals.pthread_sigmask(signals.SIG_SETMASK, blocked)
                main(*fds[1:])
            finally:
                posix._exit(127)
        failure = ctypes.get_errno()
        signals.pthread_sigmask(signals.SIG_SETMASK, blocked)
        for fd in fds:
            posix.close(fd)
        socket.send(str(pid if pid > 0 else -failure).encode())


_CLONE_INTO_CGROUP, _CLONE_PARENT = 0x200000000, 0x00008000


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        zygote(int(sys.argv[2]))
    else:
        main(*(int(word) for word in sys.argv[1:5]))
