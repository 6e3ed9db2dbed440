"""What makes the driver's checkpoint calls slower under gpuq than bare (#28 (c)), on a lent GPU host, as root:

    python3 bench/checkpoint_probe.py --out probe.json [--sizes 4 16] [--rounds 3]

Two questions, each answered by measurement rather than guessed:

1. The first ``cuInit`` of a fresh process: gpuq's helper opens the driver for every suspend and resume,
   and 2 of 6 resumes on a lent H200 took 196 ms to open it, against 11-19 ms otherwise. Timed in a fresh
   process with no other process holding the GPUs, then beside a process that holds only ``cuInit``, then
   beside one that holds only ``nvmlInit`` (what gpuq's daemon holds).
2. The same job's lock + checkpoint and restore + unlock under conditions taken in turn, shuffled each
   round, on one job per size (the issue's 17 GB job went through three cycles in a row): the calls from
   this process (``plain``); the same with a thread polling NVML every 0.1 s, as a daemon samples
   (``nvml``); with the job in a cgroup of its own that has the cpu and memory controllers, as gpuq's jobs
   are on such a host, so that the checkpoint's host memory is charged to it (``cgroup``); and from a fresh
   interpreter that opens the driver first, as gpuq's exec'd helper does (``fresh``: its open timed apart).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

JOB = """
import sys, time, torch
row = 1 << 20
x = torch.empty((int(float(sys.argv[1]) * 1024), row), dtype=torch.uint8, device="cuda")
x.fill_(7)
count = torch.zeros(1, dtype=torch.int64, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    count += 1
    count.item()
    time.sleep(0.05)
"""

OPEN = """
import ctypes, json, sys, time
at = time.monotonic()
cuda = ctypes.CDLL("libcuda.so.1")
loaded = time.monotonic()
code = cuda.cuInit(0)
done = time.monotonic()
state = ctypes.c_int(-1)
pid = int(sys.argv[1]) if len(sys.argv) > 1 else 0
times = {"dlopen_s": loaded - at, "cuinit_s": done - loaded, "cuinit_code": code}
for name in ("Lock", "Checkpoint", "Restore", "Unlock") if pid else ():
    at = time.monotonic()
    rc = getattr(cuda, "cuCheckpointProcess" + name)(ctypes.c_int(pid), None)
    times[name.lower()] = time.monotonic() - at
    times[name.lower() + "_code"] = rc
print(json.dumps(times))
"""

HOLD_CUDA = "import ctypes, time; ctypes.CDLL('libcuda.so.1').cuInit(0); print('held', flush=True); time.sleep(600)"
HOLD_NVML = "import pynvml, time; pynvml.nvmlInit(); print('held', flush=True); time.sleep(600)"


def fresh_open(pid: int | None = None) -> dict[str, Any]:
    args = [sys.executable, "-c", OPEN] + ([str(pid)] if pid else [])
    return dict(json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout))


def holder(code: str) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def first_open(repeat: int) -> dict[str, Any]:
    """A fresh process's dlopen + cuInit: alone (waiting 3 s between tries, so the driver may let the GPUs go),
    beside a cuInit holder, beside an nvmlInit holder."""
    found: dict[str, Any] = {"alone": [], "beside_cuinit": [], "beside_nvml": []}
    for _ in range(repeat):
        time.sleep(3)
        found["alone"].append(fresh_open())
    for name, code in (("beside_cuinit", HOLD_CUDA), ("beside_nvml", HOLD_NVML)):
        child = holder(code)
        try:
            for _ in range(repeat):
                time.sleep(1)
                found[name].append(fresh_open())
        finally:
            child.kill()
            child.wait()
    return found


class Poller:
    """NVML queried as a daemon samples it: every GPU's processes and memory, every ``every`` seconds."""

    def __init__(self, every: float) -> None:
        import pynvml

        self.nvml, self.every, self.calls = pynvml, every, 0
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            for handle in self.handles:
                self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                self.nvml.nvmlDeviceGetMemoryInfo(handle)
            self.calls += 1

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


CGROUP = "/sys/fs/cgroup/gpuq-probe"


def into_cgroup(pid: int, cgroup: str) -> None:
    with open(f"{cgroup}/cgroup.procs", "w") as handle:
        handle.write(str(pid))


def own_cgroup(pid: int) -> str:
    line = Path(f"/proc/{pid}/cgroup").read_text().splitlines()[0]
    return "/sys/fs/cgroup" + line.split("::", 1)[1]


def cycle(cuda: ctypes.CDLL, pid: int) -> dict[str, float]:
    times = {}
    for name in ("Lock", "Checkpoint", "Restore", "Unlock"):
        at = time.monotonic()
        code = getattr(cuda, f"cuCheckpointProcess{name}")(ctypes.c_int(pid), None)
        times[name.lower()] = time.monotonic() - at
        if code != 0:
            raise RuntimeError(f"cuCheckpointProcess{name} of {pid}: CUDA error {code}")
    return times


def one_size(size: float, rounds: int, work: Path) -> dict[str, Any]:
    script = work / "job.py"
    script.write_text(JOB)
    job = subprocess.Popen([sys.executable, str(script), str(size)], stdout=subprocess.PIPE, text=True)
    assert job.stdout is not None and job.stdout.readline().strip() == "ready"
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    home = own_cgroup(job.pid)
    os.makedirs(CGROUP, exist_ok=True)
    Path(f"{CGROUP}/cgroup.subtree_control").write_text("+cpu +memory")
    leaf = f"{CGROUP}/job"
    os.makedirs(leaf, exist_ok=True)
    conditions = ["plain", "nvml", "cgroup", "fresh"]
    results: dict[str, list[dict[str, float]]] = {c: [] for c in conditions}
    try:
        for _ in range(rounds):
            random.shuffle(conditions)
            for condition in conditions:
                time.sleep(1)
                if condition == "plain":
                    results[condition].append(cycle(cuda, job.pid))
                elif condition == "nvml":
                    with Poller(0.1) as poller:
                        times = cycle(cuda, job.pid)
                    results[condition].append({**times, "nvml_polls": poller.calls})
                elif condition == "cgroup":
                    into_cgroup(job.pid, leaf)
                    try:
                        times = cycle(cuda, job.pid)
                        peak_file = Path(f"{leaf}/memory.peak")
                        peak = int(peak_file.read_text()) if peak_file.exists() else -1
                    finally:
                        into_cgroup(job.pid, home)
                    results[condition].append({**times, "memory_peak": peak})
                else:
                    results[condition].append(fresh_open(job.pid))
                print(condition, json.dumps(results[condition][-1]), flush=True)
    finally:
        job.kill()
        job.wait()
        for path in (leaf, CGROUP):
            try:
                os.rmdir(path)
            except OSError as err:
                print(f"left {path}: {err}", flush=True)
    medians = {
        c: {k: round(statistics.median(r[k] for r in rows), 4) for k in ("lock", "checkpoint", "restore", "unlock")}
        for c, rows in results.items()
    }
    return {"size_gib": size, "rounds": results, "medians": medians}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", type=float, nargs="+", default=[4.0, 16.0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--opens", type=int, default=3)
    args = parser.parse_args()
    persistence = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,name,driver_version,persistence_mode", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "gpus": persistence}
    print(persistence, flush=True)
    out["first_open"] = first_open(args.opens)  # before this process touches the driver
    print(json.dumps(out["first_open"]), flush=True)
    with tempfile.TemporaryDirectory(prefix="gpuq-probe-") as tmp:
        out["sizes"] = [one_size(size, args.rounds, Path(tmp)) for size in args.sizes]
    for row in out["sizes"]:
        print(row["size_gib"], json.dumps(row["medians"]), flush=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
