"""The child process that suspends or resumes one job, beside the daemon's pass (a checkpoint of 40 GB takes
half a minute): ``python -m gpuq_scheduler.launcher.daemon.suspender '<json>'``, which prints one JSON line.

Both actions are idempotent: each step looks at where every process stands (``Checkpointer.state``) and
does only what is left, so a daemon restarted in the middle of one runs it again to finish it, or runs the
other to undo it. Suspend: lock every CUDA process of the job, checkpoint each, then freeze the job (its
cgroup, or SIGSTOP to each process in the fallback). Resume: thaw the job, restore every CUDA process,
unlock each. A suspend that fails part way is undone (the job runs on, on its GPUs) and says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from gpuq_scheduler.launcher.gpus.checkpoint import (
    Checkpointer,
    CheckpointError,
    CudaState,
    DriverCheckpoint,
    FakeCheckpoint,
)  # fmt: skip
from gpuq_scheduler.launcher.supervisor import containment
from gpuq_scheduler.launcher.supervisor.containment import Box

FREEZE_WITHIN = 10.0  # seconds a cgroup may take to report itself frozen


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
        deadline = time.monotonic() + FREEZE_WITHIN
        want = f"frozen {int(frozen)}"
        while want not in Path(f"{box.cgroup}/cgroup.events").read_text().splitlines():
            if time.monotonic() > deadline:
                raise OSError(f"{box.cgroup} did not report '{want}' within {FREEZE_WITHIN:g}s")
            time.sleep(0.01)
        return
    pids = containment.members(box, leader) if box is not None else set()
    for pid in {leader} | pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGSTOP if frozen else signal.SIGCONT)


def suspend(cuda: Checkpointer, box: Box | None, leader: int) -> dict[str, Any]:
    found = cuda_processes(cuda, box, leader)
    steps: dict[str, float] = {}
    try:
        at = time.monotonic()
        for pid, state in found.items():
            if state is CudaState.RUNNING:
                cuda.lock(pid)
        steps["lock"] = time.monotonic() - at
        at = time.monotonic()
        for pid in found:
            if cuda.state(pid) is CudaState.LOCKED:
                cuda.checkpoint(pid)
        steps["checkpoint"] = time.monotonic() - at
        at = time.monotonic()
        freeze(box, leader, True)
        steps["freeze"] = time.monotonic() - at
    except (CheckpointError, OSError) as err:
        undone = resume(cuda, box, leader)
        why = (
            "it runs as a client of an MPS server, which the driver cannot checkpoint"
            if isinstance(err, CheckpointError) and err.unsupported
            else str(err)
        )
        return {"ok": False, "why": why, "undone": undone["ok"], "undo_why": undone.get("why", "")}
    return {"ok": True, "pids": sorted(found), "steps": steps}


def resume(cuda: Checkpointer, box: Box | None, leader: int) -> dict[str, Any]:
    steps: dict[str, float] = {}
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
    except (CheckpointError, OSError) as err:
        return {"ok": False, "why": str(err)}
    return {"ok": True, "pids": sorted(found), "steps": steps}


def main(argv: list[str]) -> int:
    order = json.loads(argv[0])
    box = Box.from_json(order.get("box"))
    leader = int(order["leader"])
    try:
        cuda = checkpointer(bool(order.get("fake")), order.get("usage"))
    except (OSError, CheckpointError) as err:
        print(json.dumps({"ok": False, "why": f"no CUDA checkpoint here: {err}"}), flush=True)
        return 0
    act = suspend if order["action"] == "suspend" else resume
    print(json.dumps(act(cuda, box, leader)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
