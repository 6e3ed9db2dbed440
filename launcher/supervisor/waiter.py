"""The waiter: a job's first process, born in its cgroup ahead of its turn (``intocgroup.prepare``), until
then a small interpreter of its own rather than a copy of the shim.

Run as a script (``python -I -S waiter.py GO REPORT DETAILS OUTPUT``): it imports nothing of gpuq's and
nothing from the job's environment reaches it. It reads the job's details (marshalled by the shim into the
memfd DETAILS), writes ``+`` down REPORT (ready), waits for one byte on GO (end of file: it exits, nothing
run), and then becomes the job as the shim's clone would (``become``). REPORT closes at the job's exec; if the
exec fails, the errno is written there instead. A *blank* (``intocgroup.blank``: born for the job a queue
expects next, before it is submitted) finds DETAILS empty at first, and reads them once told to go.

It imports only modules built into the interpreter: ``posix`` for ``os`` (the same functions) and ``_signal``
for ``signal``, whose enums pull in enum, functools and collections. A waiter is born for every job handed
off, and those imports took 6 of its 15 ms of CPU on the 2-core VM, where the jobs starting on the other GPUs
want the same cores; a smaller interpreter is also less to tear down at the job's exec.
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
    job = _details(details)  # None: a blank's, written at its go
    posix.write(report, b"+")
    code = errno.EIO
    try:
        if posix.read(go, 1) != b"!":
            posix._exit(0)  # let go, or its shim died: nothing runs
        job = job or _details(details)
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
    # [python, -I, -S, this file, four descriptors, WAITING], and the empty word after the last NUL
    return len(words) == 10 and words[3] == __file__.encode() and words[8] == WAITING.encode()


def _details(details: int) -> Job | None:
    size = posix.fstat(details).st_size
    return marshal.loads(posix.pread(details, size, 0)) if size else None


if __name__ == "__main__":
    main(*(int(word) for word in sys.argv[1:5]))
