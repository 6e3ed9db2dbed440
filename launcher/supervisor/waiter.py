"""The waiter: a job's first process's parent, born in the job's cgroup ahead of its turn (``intocgroup.prepare``),
until then a small interpreter of its own rather than a copy of the shim.

Run as a script (``python -I -S waiter.py GO REPORT DETAILS OUTPUT``): it imports nothing of gpuq's and
nothing from the job's environment reaches it. It reads the job's details (marshalled by the shim into the
memfd DETAILS), writes ``+`` down REPORT (ready), waits for one byte on GO (end of file: it exits, nothing
run), and then starts the job (``spawn``): posix_spawn, a vfork, whose child is born in the waiter's cgroup,
its pid written down REPORT, and exits. Its own exec would tear down its interpreter first: 1.54 ms from the
go to the job's first clock read on the 2-core VM, against 0.95 for posix_spawn (bench/waiter_go.py,
2026-11-27). The job, orphaned, comes to the shim, a child subreaper (``intocgroup``), which reaps it. If the
job cannot start, the errno is written instead. A *blank* (``intocgroup.blank``: born for the job a queue
expects next, before it is submitted) finds DETAILS empty at first, and reads them once told to go.
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


def spawn(job: Job, output: int) -> int:
    """Start the job as ``become`` would exec it, by posix_spawn from this process: its pid. The credentials and
    directory are this process's first (it exits next); the job inherits no descriptor of it but stdin (from
    /dev/null), stdout and stderr (``output``), each of the others being close-on-exec. OSError if it cannot."""
    program, argv, env, cwd, credentials = job
    if credentials is not None:
        user, group, groups = credentials
        posix.setgroups(groups)
        posix.setregid(group, group)
        posix.setreuid(user, user)
    posix.chdir(cwd)
    actions = [(posix.POSIX_SPAWN_OPEN, 0, "/dev/null", posix.O_RDONLY, 0), (posix.POSIX_SPAWN_DUP2, output, 1),
               (posix.POSIX_SPAWN_DUP2, output, 2)]  # fmt: skip
    return posix.posix_spawn(program, argv, env, file_actions=actions, setsid=True)


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
    for fd in (go, report, details, output):  # none reaches the job (output only as its stdout and stderr)
        posix.set_inheritable(fd, False)
    job = _details(details)  # None: a blank's, written at its go
    posix.write(report, b"+")
    code = errno.EIO
    try:
        if posix.read(go, 1) != b"!":
            posix._exit(0)  # let go, or its shim died: nothing runs
        job = job or _details(details)
        if job is None:
            raise OSError(errno.EINVAL, "told to go with no job")
        pid = spawn(job, output)
        posix.write(report, b"p%d" % pid)
        posix.close(report)  # the shim goes on now, not once this interpreter is torn down
        posix._exit(0)
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
