"""The job side of interactive work (``gpuq run``, ``gpuq alloc``): a placeholder that holds a job's GPUs.

``python -m gpuq_scheduler.jobs.hold [--client PID START]``. The daemon places and starts it like any job;
the program itself runs in the user's own terminal, under the ``gpuq run`` or ``gpuq alloc`` process that
submitted this one. It prints one JSON line to its log (what gpuq set in its environment, and a FIFO to
report the program's outcome through), then waits: for the outcome, for the client process to end (a
closed terminal, a kill -9: the GPUs are freed at once), or for a signal (a cancel, the time limit).
It exits with the program's exit code, or dies of its signal, so the record says how the program ended.

Standard library only, and nothing of gpuq's: it runs under the job's interpreter, as the job's user.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import sys
import tempfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

GIVEN = ("CUDA_", "GPUQ_", "PYTORCH_CUDA_ALLOC_CONF", "NVIDIA_")  # what gpuq sets for a job on its GPUs


def start_ticks(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (with its pid, one process, never a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def client_argv(pid: int, ticks: str) -> list[str]:
    """The words that tie a placeholder to the `gpuq run` process it serves: ``client_alive`` reads them."""
    return ["--client", str(pid), ticks]


def client_alive(command: Sequence[str]) -> bool | None:
    """Whether the client a placeholder's command names still runs (None: it names none). The daemon asks
    before it starts the job: a `gpuq run` that is gone (its terminal closed, a kill -9) withdraws it."""
    try:
        at = list(command).index("--client")
        pid, ticks = int(command[at + 1]), command[at + 2]
    except (ValueError, IndexError):
        return None
    return start_ticks(pid) == ticks


def main(argv: list[str]) -> int:
    client = None
    if argv[:1] == ["--client"]:
        pid, ticks = int(argv[1]), argv[2]
        client = os.pidfd_open(pid) if start_ticks(pid) == ticks else None
        if client is None or start_ticks(pid) != ticks:  # gone (or its pid reused) before we started
            # The daemon withdraws such a job before it starts; one that went in the moment between ends as
            # a terminal's hang-up ends a program, never as a success: nothing ran.
            sys.stdout.write(json.dumps({"gone": True}) + "\n")
            sys.stdout.flush()
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGHUP)
    place = tempfile.mkdtemp(prefix="gpuq-hold-")
    outcome = os.path.join(place, "outcome")
    os.mkfifo(outcome, 0o600)

    def die(signum: int) -> None:
        """End as the program did, or as gpuq's signal says (the record then reads cancelled, timed out)."""
        shutil.rmtree(place, ignore_errors=True)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda received, _: die(received))
    reader = os.open(outcome, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(outcome, os.O_WRONLY | os.O_NONBLOCK)  # no end of file between writers
    given = {k: v for k, v in os.environ.items() if k.startswith(GIVEN)}
    sys.stdout.write(json.dumps({"env": given, "outcome": outcome}) + "\n")
    sys.stdout.flush()
    words = b""
    try:
        while True:
            ready, _, _ = select.select([reader] + ([client] if client is not None else []), [], [])
            if client in ready:  # the client ended without a word: its terminal closed, or it was killed
                die(signal.SIGHUP)  # as a terminal's hang-up would end a program
            words += os.read(reader, 64)
            if words.endswith(b"\n"):
                code = int(words.split()[-1])
                if code < 0:
                    die(-code)
                return code
    finally:
        os.close(keep)
        os.close(reader)
        shutil.rmtree(place, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
