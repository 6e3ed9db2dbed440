"""A fake ``nvidia-cuda-mps-control`` for the fake inventory, run as ``python3 fake_mps.py`` (standard library
only: it runs as the user whose control daemon it is, who may not reach gpuq's own interpreter).

    -d          start a control daemon for $CUDA_MPS_PIPE_DIRECTORY: a detached process that runs until told
                to quit (its pid in the pipe directory); this command returns once it is up
    (stdin)     "quit": end the control daemon of $CUDA_MPS_PIPE_DIRECTORY; exit 1 if none runs

Like the real one it runs as whoever started it and keeps no state but its process. Tests make it misbehave
as a real one can, with files in the MPS root (``<state>/mps``, two levels above the pipe's folder):
``fake-wedge-start`` (``-d`` never returns), ``fake-wedge-quit`` (``quit`` never returns) and
``fake-fail-quit`` (``quit`` fails and the daemon stays up). A file holding uids, one a line, applies to those
users only; an empty one, to all.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def _pipe() -> Path:
    return Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])


def _misbehaves(what: str) -> bool:
    switch = _pipe().parents[2] / f"fake-{what}"
    try:
        users = switch.read_text().split()
    except OSError:
        return False
    return not users or str(os.getuid()) in users


def _running(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text())
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return None if stat.rsplit(")", 1)[1].split()[0] == "Z" else pid  # a zombie no one reaped has ended


def start() -> int:
    if _misbehaves("wedge-start"):
        while True:
            time.sleep(60)
    pid_file = _pipe() / "control.pid"
    if _running(pid_file):
        print("An instance of this daemon is already running", flush=True)
        return 1
    if os.fork() == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        pid_file.write_text(str(os.getpid()))
        while True:
            time.sleep(60)
    deadline = time.monotonic() + 10
    while _running(pid_file) is None:
        if time.monotonic() > deadline:
            print("the control daemon did not start", flush=True)
            return 1
        time.sleep(0.01)
    return 0


def quit_daemon() -> int:
    if _misbehaves("wedge-quit"):
        while True:
            time.sleep(60)
    pid_file = _pipe() / "control.pid"
    pid = _running(pid_file)
    if pid is None:
        print("Cannot find MPS control daemon process", flush=True)
        return 1
    if _misbehaves("fail-quit"):
        print("fake MPS: the control daemon did not answer", flush=True)
        return 1
    os.kill(pid, signal.SIGTERM)
    while _running(pid_file) is not None:
        time.sleep(0.01)
    pid_file.unlink(missing_ok=True)
    return 0


def main() -> int:
    if sys.argv[1:] == ["-d"]:
        return start()
    if sys.stdin.read().strip() == "quit":
        return quit_daemon()
    print("fake MPS: only -d and quit are known", flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
