"""The waiter: a job's first process, born in its cgroup ahead of its turn (``intocgroup.prepare``), until
then a small interpreter of its own rather than a copy of the shim.

Run as a script (``python -I -S waiter.py GO REPORT DETAILS OUTPUT``): it imports nothing of gpuq's and
nothing from the job's environment reaches it. It reads the job's details (marshalled by the shim into the
memfd DETAILS), waits for one byte on GO (end of file: it exits, nothing run), and then becomes the job as
the shim's clone would (``become``). REPORT closes at the job's exec; if the exec fails, the errno is
written there instead.
"""

from __future__ import annotations

import errno
import marshal
import os
import signal
import sys

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
        os.setgroups(groups)
        os.setregid(group, group)
        os.setreuid(user, user)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    close_all_but(report)
    os.chdir(cwd)
    os.execve(program, argv, env)


def close_all_but(*kept: int) -> None:
    """Close every descriptor from 3 up but ``kept``."""
    low = 3
    for fd in sorted(kept):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def main(go: int, report: int, details: int, output: int) -> None:
    os.set_inheritable(report, False)
    job = marshal.loads(os.pread(details, os.fstat(details).st_size, 0))
    os.close(details)
    code = errno.EIO
    try:
        if os.read(go, 1) != b"!":
            os._exit(0)  # let go, or its shim died: nothing runs
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored by Python at start-up; the job gets defaults
            signal.signal(signum, signal.SIG_DFL)
        become(job, output, report)
    except OSError as err:
        code = err.errno or errno.EIO
    os.write(report, str(code).encode())
    os._exit(127)


if __name__ == "__main__":
    main(*(int(word) for word in sys.argv[1:5]))
