"""The child process that suspends or resumes one job, beside the daemon's pass (a checkpoint of 40 GB takes
half a minute): ``python -m gpuq_scheduler.launcher.daemon.suspension.suspender '<json>'``, which prints one JSON line.

Both actions are idempotent: each step looks at where every process stands (``Checkpointer.state``) and
does only what is left, so a daemon restarted in the middle of one runs it again to finish it, or runs the
other to undo it. Suspend: lock every CUDA process of the job, checkpoint each, then freeze the job (its
cgroup, or SIGSTOP to each process in the fallback). Resume: thaw the job, restore every CUDA process,
unlock each. A suspend that fails part way is undone (the job runs on, on its GPUs) and says why.

The daemon starts it with ``start_helper``: a fork that runs ``act``, not a fresh interpreter, whose start and
imports cost 100-150 ms before the first driver call (an H200 host; bench/gpu_suspend.py). The fork is of the
daemon itself where it is single-threaded (the fake inventory), else of a ``Forker`` (``forker`` beside this):
a small server of one thread, a fresh interpreter started once, whose helpers open the driver before their
order comes. NVML starts a thread in the daemon
on a real host (two threads seen), and a fork of a threaded process may inherit a lock another thread held
(in malloc, the dynamic loader, the driver's library), which the helper's first ``dlopen`` of libcuda could
then wait on for ever. Either way the helper writes its result down a pipe the daemon made, then wakes the
daemon's pass through its FIFO, so the result is recorded at once rather than at the next poll.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpuq_scheduler.jobs.fastmove_fake import SCALE as FAKE_SCALE
from gpuq_scheduler.jobs.fastsuspend import Fallback
from gpuq_scheduler.jobs.fastsuspend import Path as SuspendPath
from gpuq_scheduler.launcher.daemon.suspension import fastpath, hostmem
from gpuq_scheduler.launcher.gpus.checkpoint import (
    Checkpointer,
    CheckpointError,
    CudaState,
    DriverCheckpoint,
    FakeCheckpoint,
)
from gpuq_scheduler.launcher.policy import hostroom
from gpuq_scheduler.launcher.supervisor import containment
from gpuq_scheduler.launcher.supervisor.containment import Box
from gpuq_scheduler.launcher.supervisor.processes import start_time

FREEZE_WITHIN = 10.0  # seconds a cgroup may take to report itself frozen
ROOM_POLL = 0.05  # seconds between looks at the host's memory while other jobs give their pools back


def checkpointer(fake: bool, usage: str | None) -> Checkpointer:
    """The fake inventory's (``usage``: GPUQ_FAKE_USAGE; GPUQ_FAKE_CHECKPOINT_SECONDS: how long each of its
    checkpoints and restores takes), or the driver's."""
    if fake:
        return FakeCheckpoint(usage, float(os.environ.get("GPUQ_FAKE_CHECKPOINT_SECONDS") or 0.0))
    return DriverCheckpoint()


def cuda_processes(cuda: Checkpointer, box: Box | None, leader: int) -> dict[int, CudaState]:
    """The job's processes that hold CUDA state, and where each stands."""
    pids = {leader} | (containment.members(box, leader) if box is not None else set())
    found = {pid: cuda.state(pid) for pid in sorted(pids)}
    return {pid: state for pid, state in found.items() if state is not None}


def freeze(box: Box | None, leader: int, frozen: bool) -> None:
    """Stop (``frozen``) or let go every process of the job: its cgroup's freezer, or SIGSTOP/SIGCONT to each
    process of the fallback."""
    if box is not None and box.cgroup is not None:
        with open(f"{box.cgroup}/cgroup.freeze", "w") as handle:
            handle.write("1" if frozen else "0")
        _until_frozen(box.cgroup, frozen)
        return
    pids = containment.members(box, leader) if box is not None else set()
    for pid in {leader} | pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGSTOP if frozen else signal.SIGCONT)


def _until_frozen(cgroup: str, frozen: bool) -> None:
    """Wait until the cgroup reports the freezer's state: the kernel notifies a change of cgroup.events to
    poll() (POLLPRI), so this returns as it happens rather than at the next turn of a sleep."""
    deadline = time.monotonic() + FREEZE_WITHIN
    want = f"frozen {int(frozen)}".encode()
    fd = os.open(f"{cgroup}/cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    try:
        watch = select.poll()
        watch.register(fd, select.POLLPRI | select.POLLERR)
        while want not in os.pread(fd, 4096, 0).splitlines():
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError(f"{cgroup} did not report '{want.decode()}' within {FREEZE_WITHIN:g}s")
            watch.poll(min(left, 0.05) * 1000)  # a notification missed costs 50 ms at most
    finally:
        os.close(fd)


def suspend(
    cuda: Checkpointer,
    box: Box | None,
    leader: int,
    fast: str | None = None,
    gpu_bytes: int = 0,
    fake: bool = False,
    room_coming: bool = False,
    keep_context: int = 0,
) -> dict[str, Any]:
    """``fast``: the job's fast directory, where its processes that catch gpuq's request answer it
    (``fastpath``): they move their PyTorch memory out first, and the driver's checkpoint takes the rest.
    First, host memory must hold the copy as it is now (``hostroom``; the daemon checked its last sample):
    else nothing is done, and the job runs on. ``room_coming``: other jobs were told to give their pools back
    to make that room (``pools``): waited for, as long as unpinning them at 1 GB/s would take.
    ``keep_context``: bytes the job may leave on its GPUs (``inplace.context_room``): where every CUDA process
    released its memory and what is left is no more, it stays there, the job frozen: no driver's checkpoint."""
    found = cuda_processes(cuda, box, leader)
    steps: dict[str, float] = {}
    at = time.monotonic()
    members = {leader} | (containment.members(box, leader) if box is not None else set())
    scale = FAKE_SCALE if fake else 1
    left = hostmem.room(box.cgroup if box is not None else None)
    until = at + (fastpath.ANSWER_BASE + gpu_bytes / fastpath.ANSWER_RATE if room_coming else 0.0)
    while True:
        available, total = hostmem.host_memory(fake)
        pool = fastpath.pool_of(fast, members, scale)
        too_little = hostroom.refusal(gpu_bytes, pool, available, hostmem.margin(total), left)
        if not too_little or time.monotonic() >= until:
            break
        time.sleep(ROOM_POLL)
    steps["room"] = time.monotonic() - at
    if too_little:
        return {"ok": False, "why": too_little, "undone": True, "undo_why": ""}
    at = time.monotonic()
    released = fastpath.release(sorted(members), set(found), fast, gpu_bytes)
    steps["fast"] = time.monotonic() - at
    in_place: set[int] = set()
    kept = False
    if keep_context > 0 and found and set(found) <= released.released:
        at = time.monotonic()
        left_now = cuda.left(set(found))
        steps["left"] = time.monotonic() - at
        kept = left_now is not None and left_now <= keep_context
    try:
        at = time.monotonic()
        for pid, state in found.items():
            if state is not CudaState.RUNNING or kept:  # kept: never locked, never checkpointed
                continue
            try:
                cuda.lock(pid)
            except CheckpointError as err:
                if not (err.unsupported and pid in released.released):
                    raise
                in_place.add(pid)  # an MPS client, its memory out: it keeps only its context, frozen
        steps["lock"] = time.monotonic() - at
        at = time.monotonic()
        for pid in found:
            if pid not in in_place and cuda.state(pid) is CudaState.LOCKED:
                cuda.checkpoint(pid)
        steps["checkpoint"] = time.monotonic() - at
        at = time.monotonic()
        freeze(box, leader, True)
        steps["freeze"] = time.monotonic() - at
    except (CheckpointError, OSError) as err:
        undone = resume(cuda, box, leader, fast)
        why = str(err)
        if isinstance(err, CheckpointError) and err.unsupported:  # an MPS client the fast path did not empty
            why = "it runs as a client of an MPS server, which the driver cannot checkpoint"
            if released.fallback is not None and released.fallback is not Fallback.NOT_ASKED:
                why += f", and {released.fallback.explain(released.detail)}"
        return {"ok": False, "why": why, "undone": undone["ok"], "undo_why": undone.get("why", "")}
    facts = released.facts()
    if kept:
        facts["path"] = SuspendPath.CONTEXT_KEPT.value
    elif in_place or released.released - set(found):
        facts["path"] = SuspendPath.IN_PLACE.value
    return {"ok": True, "pids": sorted(found), "steps": steps, "path": facts}


def resume(
    cuda: Checkpointer, box: Box | None, leader: int, fast: str | None = None, keep: bool = False
) -> dict[str, Any]:
    """``keep``: the job's processes keep their pinned host memory for the next suspend (a pool)."""
    steps: dict[str, float] = {}
    pool = 0
    try:
        at = time.monotonic()
        freeze(box, leader, False)
        steps["thaw"] = time.monotonic() - at
        found = cuda_processes(cuda, box, leader)
        at = time.monotonic()
        for pid, state in found.items():
            if state is CudaState.CHECKPOINTED:
                cuda.restore(pid)
        steps["restore"] = time.monotonic() - at
        at = time.monotonic()
        for pid in found:
            if cuda.state(pid) is CudaState.LOCKED:
                cuda.unlock(pid)
        steps["unlock"] = time.monotonic() - at
        at = time.monotonic()
        # Every process of the job, not only those the driver still knows: an MPS client suspended in place
        # was never checkpointed, and its memory is the job's own to bring back.
        members = {leader} | (containment.members(box, leader) if box is not None else set())
        pool = fastpath.restore(sorted(members), fast, keep)
        steps["fast"] = time.monotonic() - at
    except (CheckpointError, OSError) as err:
        return {"ok": False, "why": str(err)}
    return {"ok": True, "pids": sorted(found), "steps": steps, "pool": pool}


def act(order: dict[str, Any], opened: Opened | None = None) -> dict[str, Any]:
    """Do what ``order`` says (``action``: suspend or resume; ``leader``, ``box``, ``fake``, ``usage``: which
    job and which checkpoint): the result the daemon reads, with the wall times the helper began and ended.
    ``opened``: the checkpoint this helper opened before its order came (a spare's, ``forker.Spare``)."""
    began = time.time()
    box = Box.from_json(order.get("box"))
    leader = int(order["leader"])
    if opened is None or opened.kind != (bool(order.get("fake")), order.get("usage")):
        opened = Opened.open(bool(order.get("fake")), order.get("usage"))
        took = time.time() - began  # the driver's library loaded and cuInit: before the first call
    else:
        took = 0.0  # opened ahead, while the helper waited for its order
    if isinstance(opened.cuda, str):
        return {"ok": False, "why": f"no CUDA checkpoint here: {opened.cuda}", "began": began, "ended": time.time()}
    fast = order.get("fast_dir")
    if order["action"] == "suspend":
        result = suspend(
            opened.cuda,
            box,
            leader,
            fast,
            int(order.get("bytes") or 0),
            bool(order.get("fake")),
            bool(order.get("room_coming")),
            int(order.get("keep_context") or 0),
        )
    else:
        result = resume(opened.cuda, box, leader, fast, bool(order.get("keep")))
    steps = {"open": took, **result.get("steps", {})}
    return {**result, "steps": steps, "began": began, "ended": time.time()}


@dataclass(frozen=True)
class Opened:
    """A checkpoint opened for orders of one kind (``fake``, ``usage``), or why it could not be."""

    kind: tuple[bool, str | None]
    cuda: Checkpointer | str

    @classmethod
    def open(cls, fake: bool, usage: str | None) -> Opened:
        try:
            return cls((fake, usage), checkpointer(fake, usage))
        except (OSError, CheckpointError) as err:
            return cls((fake, usage), str(err))


class Helper:
    """The child acting on one job, seen from the daemon: its pid and start time (for the pause file, which
    a later daemon reads to wait for it) and its result, once it has written it and closed its pipe."""

    def __init__(self, pid: int, started: float, pipe: int, spawned: float, keep: object = None) -> None:
        self.pid, self.started, self.spawned = pid, started, spawned
        self._pipe, self._out, self._keep = pipe, bytearray(), keep  # keep: an exec'd child's Popen
        os.set_blocking(pipe, False)

    def times(self, result: dict[str, Any]) -> dict[str, float]:
        """When the daemon started the helper, and when it began and ended (wall times, from its result):
        where the time between a command and its record goes (bench/suspend_overhead.py)."""
        found = {"spawned": self.spawned} | {
            key: float(result[key]) for key in ("began", "ended") if isinstance(result.get(key), (int, float))
        }
        return {key: round(value, 4) for key, value in found.items()}

    def result(self) -> dict[str, Any] | None:
        """None while it runs; then what it said (``ok`` False if it ended saying nothing: killed, say)."""
        if self._pipe < 0:
            raise ValueError("the helper's result was read already")
        try:
            while chunk := os.read(self._pipe, 65536):
                self._out += chunk
        except BlockingIOError:
            return None  # its write end is still open: it runs
        os.close(self._pipe)
        self._pipe = -1
        self._keep = None
        try:
            found = json.loads(bytes(self._out).strip().splitlines()[-1])
            if isinstance(found, dict):
                return found
        except (ValueError, IndexError):
            pass
        return {"ok": False, "why": "its helper ended saying nothing"}


_RESET = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE)


class Forks(Protocol):
    """What forks helpers for a daemon with threads (``forker.Forker``): a helper's pid (0 if none) and
    start time, read by its parent, which a helper quick to end may not leave for anyone else to read."""

    def fork(self, order: dict[str, Any], wake: str, pipe: int) -> tuple[int, float]: ...


def start_helper(order: dict[str, Any], wake: str, forker: Forks | None = None) -> Helper:
    """Start the child for ``order`` in a session of its own (it finishes even if the daemon dies), which
    wakes the daemon through the FIFO ``wake`` once its result is written: forked here if this process has
    one thread, else by ``forker``, else (none, or it failed) a fresh interpreter. OSError if none starts."""
    spawned = time.time()
    read_end, write_end = os.pipe()
    keep: object = None
    started = 0.0
    try:
        if len(os.listdir("/proc/self/task")) == 1:
            pid = fork_helper(order, write_end, wake)
        else:
            pid, started = forker.fork(order, wake, write_end) if forker is not None else (0, 0.0)
            if pid <= 0:
                child = subprocess.Popen(
                    [sys.executable, "-m", __name__, json.dumps({**order, "wake": wake})],
                    stdin=subprocess.DEVNULL,
                    stdout=write_end,
                    start_new_session=True,
                    close_fds=True,
                )
                pid, keep = child.pid, child
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return Helper(pid, started or start_time(pid) or 0.0, read_end, spawned, keep)


def fork_helper(order: dict[str, Any], pipe: int, wake: str) -> int:
    """Fork the helper for ``order``, which answers down ``pipe`` (``forked``)."""
    return forked(pipe, lambda: answer(pipe, act(order), wake))


def forked(kept: int, run: Callable[[], None]) -> int:
    """Fork a helper that runs ``run``: in a session of its own, every descriptor but ``kept`` closed, signals
    default. Its pid."""
    # A SIGTERM must not meet the daemon's handler in the child (it would set the daemon's stop flag in the
    # copy and write to the daemon's wake-up pipe): blocked across the fork until the child's are default.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        pid = os.fork()
        if pid == 0:  # the child: never returns into the daemon's code
            code = 70
            try:
                os.setsid()
                for signum in _RESET:
                    signal.signal(signum, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                # The daemon's lock, database, FIFO and shims' pipes: a helper that outlives a daemon killed
                # with kill -9 must not hold its lock, nor anything else of it.
                os.closerange(3, kept)
                os.closerange(kept + 1, 65536)
                with contextlib.suppress(OSError):
                    Path("/proc/self/comm").write_text("gpuq-suspender")
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                run()
                code = 0
            finally:
                os._exit(code)
        return pid
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def answer(pipe: int, result: dict[str, Any], wake: str | None) -> None:
    """Write the result, close the pipe (the daemon reads it whole at its end), then wake the daemon."""
    view = memoryview((json.dumps(result) + "\n").encode())
    while view:
        view = view[os.write(pipe, view) :]
    # Closed by putting /dev/null in its place: an exec'd child's stdout stays a valid descriptor to the end.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, pipe)
    os.close(devnull)
    if wake:
        with contextlib.suppress(OSError):  # no daemon listening: the next one reads the job's state anyway
            fd = os.open(wake, os.O_WRONLY | os.O_NONBLOCK)
            with contextlib.suppress(OSError):
                os.write(fd, b"!")
            os.close(fd)


def main(argv: list[str]) -> int:
    order = json.loads(argv[0])
    answer(sys.stdout.fileno(), act(order), order.get("wake"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
