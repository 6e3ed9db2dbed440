"""CUDA MPS control daemons that gpuq starts and quits: the driver-enforced fence for packed jobs.

A job that shares a GPU (``--mem``, one GPU) runs as a client of an MPS server on that GPU with
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` at its share: allocating past it fails with CUDA out of memory in
that job, whatever framework it uses, and its neighbours keep their memory. An MPS server serves one Unix
user, so gpuq runs one control daemon per (GPU, user) that has such a job: ``nvidia-cuda-mps-control -d``
started as that user, with ``CUDA_VISIBLE_DEVICES`` set to that GPU and its pipe and log directories in
``<state>/mps/<gpu uuid>/<uid>/``, a fresh folder of that user's, mode 0700: only that user (and root) reaches
the pipe, so nobody connects to another's server. Several users' servers then run on one GPU at once
(measured on an H100: two users' clients overlapped 12.4 s of 13 s, each refused past its limit). A
control daemon is an ordinary process: no device setting (compute mode, MIG, clocks) is ever changed.

Starting and quitting are asynchronous here (``begin_start``, ``begin_quit`` return the running control
command); the daemon polls them between passes (``launcher.daemon.controls``), so a wedged control daemon
stalls nothing but the jobs that wait for it. A control daemon whose quit failed keeps its folder and a
note beside it (``<uid>.quit-failed``), so that nothing forgets it: the daemon retries, and `gpuq doctor` shows it.

``FakeMps`` runs ``launcher.gpus.fake_mps``, a fake control program that behaves like the real one
(a detached daemon process per pipe directory; ``quit`` ends it), for the fake inventory.
"""

from __future__ import annotations

import contextlib
import enum
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuq_scheduler.jobs.accounts import Account
from gpuq_scheduler.jobs.store.statedir import read_bytes

CONTROL = "nvidia-cuda-mps-control"
MiB = 1 << 20
QUIT_FAILED = "quit-failed"  # the note in a control daemon's folder while its quit has not succeeded


class Fence(str, enum.Enum):
    """What holds a packed job to its share: ``GPUQ_FENCE`` (the daemon's setting and each job's
    environment) and the FENCE `gpuq gpus` shows. A value outside these is refused, never guessed."""

    MPS = "mps"
    COOPERATIVE = "cooperative"
    NONE = "none"


@dataclass(frozen=True)
class Key:
    """One control daemon: a GPU (by uuid) and the user (uid) whose jobs its server runs."""

    uuid: str
    uid: int

    def __str__(self) -> str:
        return f"{self.uuid}/{self.uid}"


class Mps:
    """Control daemons under ``root`` (``<state>/mps``), one per (GPU, user)."""

    fake = False

    def __init__(self, root: Path, binary: str | None = None) -> None:
        self.root = root
        self.binary = binary if binary is not None else shutil.which(CONTROL)

    @property
    def available(self) -> bool:
        return self.binary is not None

    def command(self) -> list[str]:
        assert self.binary is not None
        return [self.binary]

    def folder(self, key: Key) -> Path:
        return self.root / key.uuid / str(key.uid)

    def pipe(self, key: Key) -> Path:
        return self.folder(key) / "pipe"

    def logs(self, key: Key) -> Path:
        return self.folder(key) / "log"

    def client_env(self, key: Key, limit: int) -> dict[str, str]:
        """What a job on GPU ``key.uuid`` needs to be a client held to ``limit`` bytes: its user's server's
        pipe, the limit on its device 0 (the job sees only its own GPU), and that GPU named by UUID: a client
        counts devices among its server's (this server has one), where an index would count the machine's."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe(key)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.logs(key)),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={max(limit // MiB, 1)}M",
            "CUDA_VISIBLE_DEVICES": key.uuid,
        }

    def running(self) -> list[Key]:
        """The control daemons of ours that may be up, from their folders: a daemon that restarts finds the
        ones an earlier daemon left, those whose quit failed included."""
        found = []
        for gpu in sorted(self.root.glob("*/*/pipe")):
            with contextlib.suppress(ValueError):
                found.append(Key(gpu.parent.parent.name, int(gpu.parent.name)))
        return found

    def note(self, key: Key) -> Path:
        """Where it says why a control daemon did not quit: beside its folder, in root's (the folder is its
        user's, who could put a link there for root to write through)."""
        return self.root / key.uuid / f"{key.uid}.{QUIT_FAILED}"

    def failures(self) -> dict[Key, str]:
        """Control daemons whose quit failed, and why (for `gpuq doctor`)."""
        failed = {}
        for key in self.running():
            with contextlib.suppress(OSError):
                failed[key] = read_bytes(str(self.note(key))).decode(errors="replace").strip()
        return failed

    def begin_start(self, key: Key, account: Account | None) -> subprocess.Popen[str]:
        """Start the control daemon of ``key`` as its user (``account``; None: as ourselves) in its folder,
        made that user's alone. The command returns once the daemon has detached. OSError if it cannot run."""
        if self.binary is None:
            raise OSError(f"{CONTROL} is not installed")
        folder, pipe, logs = self.folder(key), self.pipe(key), self.logs(key)
        for path in (self.root, self.root / key.uuid):
            path.mkdir(exist_ok=True, parents=True)
            path.chmod(0o755)  # traversed by every user whose jobs run here; root's, so nobody else writes there
        # A fresh folder each start: one left by an earlier daemon is its user's, who may have put links in it.
        shutil.rmtree(folder, ignore_errors=True)
        self.note(key).unlink(missing_ok=True)
        for path in (folder, pipe, logs):
            path.mkdir(mode=0o700)
        if account is not None and os.geteuid() == 0:
            for path in (pipe, logs, folder):  # the folder last: until then its user cannot reach inside
                os.lchown(path, account.uid, account.gid)
        return self._run(key, [*self.command(), "-d"], account, stdin=None)

    def begin_quit(self, key: Key, account: Account | None) -> subprocess.Popen[str]:
        """Tell the control daemon of ``key`` to quit (it stops its server first). OSError if it cannot run."""
        return self._run(key, self.command(), account, stdin="quit\n")

    def _run(self, key: Key, argv: list[str], account: Account | None, stdin: str | None) -> subprocess.Popen[str]:
        env = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe(key)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.logs(key)),
            "CUDA_VISIBLE_DEVICES": key.uuid,
        }
        user = group = None
        groups: list[int] | None = None
        if account is not None and os.geteuid() == 0 and account.uid != 0:
            user, group, groups = account.uid, account.gid, list(account.groups)
        command = subprocess.Popen(
            argv,
            env=env,
            cwd="/",
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            user=user,
            group=group,
            extra_groups=groups,
        )
        if stdin is not None:
            assert command.stdin is not None
            with contextlib.suppress(OSError):
                command.stdin.write(stdin)
            with contextlib.suppress(OSError):
                command.stdin.close()
        return command

    def alive(self, key: Key) -> bool:
        """Whether the control daemon of ``key`` still runs: a process of its command whose environment names
        its pipe directory, run by that key's user (or root): any user may start a process of that name with
        that variable, and only the key's own could run its control daemon (a quit that failed because it was
        gone already leaves none)."""
        wanted = b"CUDA_MPS_PIPE_DIRECTORY=" + os.fsencode(self.pipe(key))
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = read_bytes(f"/proc/{entry}/cmdline").split(b"\0")
                if not self._is_control(argv) or real_uid(entry) not in (key.uid, 0, os.geteuid()):
                    continue
                if wanted in read_bytes(f"/proc/{entry}/environ").split(b"\0"):
                    return True
            except OSError:
                continue
        return False

    def _is_control(self, argv: list[bytes]) -> bool:
        return os.path.basename(argv[0]) == CONTROL.encode()

    def note_failure(self, key: Key, why: str) -> None:
        """Keep the folder, and say in it why its control daemon did not quit."""
        with contextlib.suppress(OSError):
            self.note(key).write_text(why + "\n")

    def forget(self, key: Key) -> None:
        shutil.rmtree(self.folder(key), ignore_errors=True)
        self.note(key).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            (self.root / key.uuid).rmdir()  # once no user's control daemon is left on that GPU


FAKE_CONTROL = Path(__file__).with_name("fake_mps.py")  # standard library only: any user's python runs it


class FakeMps(Mps):
    """MPS for the fake inventory: the same folders, users and environment, with ``launcher.gpus.fake_mps``
    as the control program (a real detached process per control daemon, no server and no driver). Root
    runs it with the system's python3: a user may not reach root's interpreter."""

    fake = True

    def __init__(self, root: Path) -> None:
        python = sys.executable if os.geteuid() != 0 else shutil.which("python3") or sys.executable
        super().__init__(root, binary=python)

    def command(self) -> list[str]:
        assert self.binary is not None
        return [self.binary, str(FAKE_CONTROL)]

    def _is_control(self, argv: list[bytes]) -> bool:
        return len(argv) > 1 and argv[1] == os.fsencode(FAKE_CONTROL)


SERVER = b"nvidia-cuda-mps-server"
PIPE = b"CUDA_MPS_PIPE_DIRECTORY="


def server_pids(root: Path, candidates: Iterable[int]) -> set[int]:
    """Those of ``candidates`` (pids NVML lists on a GPU) that are MPS servers of control daemons under
    ``root``: their memory is held for gpuq's fence, not by a teammate. Known by their command and the
    pipe directory in their environment or their parent's (the control daemon gpuq started with it), and
    believed only of a server run by the user whose pipe directory that is (``<root>/<gpu>/<uid>/pipe``),
    or by root, with a parent of the same: any user can name a process so and set that variable, and one
    who pointed it at another user's pipe would have her GPU memory hidden from placement. A process of
    another user whose environment cannot be read is not claimed."""
    prefix = PIPE + os.fsencode(root) + b"/"
    found = set()
    for pid in candidates:
        try:
            if os.path.basename(read_bytes(f"/proc/{pid}/cmdline").split(b"\0")[0]) != SERVER:
                continue
            parent = read_bytes(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[1].decode()
            runs_as = real_uid(pid)
        except (OSError, IndexError, ValueError):
            continue
        for owner in (str(pid), parent):
            try:
                environ = read_bytes(f"/proc/{owner}/environ").split(b"\0")
                named = [e[len(prefix) :] for e in environ if e.startswith(prefix)]
                if named and runs_as in (_pipe_uid(named[0]), 0) and real_uid(owner) == runs_as:
                    found.add(pid)
                    break
            except (OSError, ValueError):
                continue
    return found


def _pipe_uid(below: bytes) -> int | None:
    """The user of a pipe directory gpuq makes (``<gpu>/<uid>/pipe`` below the MPS root), or None."""
    parts = below.rstrip(b"/").split(b"/")
    if len(parts) != 3 or parts[2] != b"pipe" or not parts[1].isdigit():
        return None
    return int(parts[1])


def real_uid(pid: int | str) -> int:
    """The real uid of a process, from its status (a process cannot change it; its /proc folder's owner is
    root's for a process that made itself undumpable). OSError if it is gone, ValueError if unreadable."""
    for line in read_bytes(f"/proc/{pid}/status").split(b"\n"):
        if line.startswith(b"Uid:"):
            return int(line.split()[1])
    raise ValueError(f"no Uid line in /proc/{pid}/status")


def for_gpus(root: Path, fake_gpus: bool, environ: Mapping[str, str]) -> Mps | None:
    """MPS for packed jobs: on real GPUs when its control program is installed, on the fake inventory only
    when asked (``GPUQ_FAKE_MPS=1``). None: no MPS here (the fence is cooperative)."""
    if fake_gpus:
        return FakeMps(root) if environ.get("GPUQ_FAKE_MPS") == "1" else None
    mps = Mps(root)
    return mps if mps.available else None
