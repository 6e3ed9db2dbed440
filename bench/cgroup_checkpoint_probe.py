"""Is the driver's checkpoint charged to the job's cgroup? (#40: which way a --ram job goes when its GPU state
would not fit under its limit.) On a lent GPU host, as root, cgroup v2 with the memory controller:

    python3 bench/cgroup_checkpoint_probe.py --out cgroup.json [--gib 4]

A PyTorch process holding GIB GiB on its GPU, in a cgroup of its own whose memory.max leaves it 1 GiB of room
(memory.swap.max 0, memory.oom.group 1, as gpuq sets a --ram job's); then the driver's lock and checkpoint of
it from outside, as gpuq's helper calls them. Records: memory.current before and after, memory.events'
oom_kill, whether the process is still alive, and whether its tensor is intact after the restore.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

JOB = """
import sys, time, torch
x = torch.full((int(float(sys.argv[1]) * 2**28),), 7, dtype=torch.int32, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
print("intact" if bool(x.eq(7).all().item()) else "corrupt", flush=True)
"""


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as err:
        return f"unreadable: {err}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gib", type=float, default=4.0)
    args = parser.parse_args()
    root = Path("/sys/fs/cgroup")
    found: dict[str, Any] = {
        "root_controllers": read(root / "cgroup.controllers"),
        "root_subtree": read(root / "cgroup.subtree_control"),
    }
    group = root / "gpuq-cgroup-probe"
    job = None
    try:
        if "memory" not in found["root_subtree"].split():
            (root / "cgroup.subtree_control").write_text("+memory")
        group.mkdir(exist_ok=True)
        enter = lambda: (group / "cgroup.procs").write_text(str(os.getpid()))  # noqa: E731  (born in it)
        job = subprocess.Popen(
            [sys.executable, "-c", JOB, str(args.gib)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=enter,
        )
        assert job.stdout is not None and job.stdin is not None
        found["ready"] = job.stdout.readline().strip()
        current = int(read(group / "memory.current"))
        found["current_before"] = current
        (group / "memory.swap.max").write_text("0")
        (group / "memory.oom.group").write_text("1")
        (group / "memory.max").write_text(str(current + (1 << 30)))
        cuda = ctypes.CDLL("libcuda.so.1")
        cuda.cuInit(0)
        pid = ctypes.c_int(job.pid)
        at = time.monotonic()
        found["lock"] = cuda.cuCheckpointProcessLock(pid, None)
        found["checkpoint"] = cuda.cuCheckpointProcessCheckpoint(pid, None)
        found["checkpoint_s"] = round(time.monotonic() - at, 3)
        time.sleep(1.0)
        found["current_after_checkpoint"] = int(read(group / "memory.current") or 0)
        found["events_after_checkpoint"] = read(group / "memory.events")
        found["alive_after_checkpoint"] = job.poll() is None
        (group / "memory.max").write_text("max")
        if job.poll() is None:
            found["restore"] = cuda.cuCheckpointProcessRestore(pid, None)
            found["unlock"] = cuda.cuCheckpointProcessUnlock(pid, None)
            job.stdin.write("\n")
            job.stdin.flush()
            found["after"] = job.stdout.readline().strip()
        found["returncode"] = job.wait(timeout=60)
    except Exception as err:  # recorded: the probe's answer may be that it could not run here
        found["error"] = f"{type(err).__name__}: {err}"
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait()
        if group.exists():
            time.sleep(0.5)
            try:
                group.rmdir()
            except OSError as err:
                found["rmdir"] = str(err)
    print(json.dumps(found), flush=True)
    args.out.write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
