"""Suspend and resume on a lent GPU host (#28), run by the lead:

    python3 bench/gpu_suspend.py --out bench/results/gpu_suspend.json [--sizes 4 16 40] [--pairs 2]

For each size, one PyTorch job holding N GiB (a known pattern) runs in a private gpuq queue on the real GPUs, and is
suspended and resumed in cycles: through gpuq (`gpuq suspend`, `gpuq resume`) and bare (the driver's calls from this
process on the same job's pid), in the order gpuq, bare, bare, gpuq, ... (``--pairs`` of each), after a first cycle
through gpuq kept apart (a process's first checkpoint is its dearest). The same process with the same memory on both
sides: the driver's time for a checkpoint moves 10-20 % from one run to the next (bench/checkpoint_probe.py), more
than the bar being measured. Through gpuq: the time from the moment before the command to the job recorded suspended
(its ``suspended`` event's time in events.jsonl, read from the file, not by polling `gpuq show`), and from `gpuq
resume` to it recorded running again, split into the command itself, the daemon's part (from the pass that took the
request to the one that recorded the result) and the helper's driver calls. Bare: lock + checkpoint, restore +
unlock. Each cycle checks that the GPU was empty of the job while suspended (NVML), that its count made no progress
then and went on from where it stopped; the job checks its whole tensor at its end. The medians give gpuq's time
beside the bare calls (the issue's bar: within 5 %), and gpuq's own part (its time less its driver calls)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpuq_scheduler.launcher.gpus.checkpoint import DriverCheckpoint  # noqa: E402

GPUQ_ROOT = [ROOT]  # the gpuq source tree the queue runs (--root: another checkout, to compare)

GB = 1e9
GiB = 1 << 30

# The job: fills N GiB with a pattern, counts in COUNTS every 50 ms (on the GPU: a locked process's CUDA
# calls block, so its count stops), and once STOP exists checks the whole tensor and exits 0 if intact.
JOB = """
import sys, time, torch
from pathlib import Path
size, counts, stop = float(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
row = 1 << 20
pattern = torch.arange(row, device="cuda", dtype=torch.int32).remainder(251).to(torch.uint8)
x = torch.empty((int(size * 1024), row), dtype=torch.uint8, device="cuda")
x.copy_(pattern.expand_as(x))
count = torch.zeros(1, dtype=torch.int64, device="cuda")
torch.cuda.synchronize()
print(f"holding {size} GiB on {torch.cuda.get_device_name()}", flush=True)
with counts.open("a") as out:
    while not stop.exists():
        count += 1
        out.write(f"{int(count.item())}\\n")
        out.flush()
        time.sleep(0.05)
intact = all(bool(x[at : at + 1024].eq(pattern).all().item()) for at in range(0, x.shape[0], 1024))  # 1 GiB at a time
print("INTACT" if intact else "CORRUPT", flush=True)
sys.exit(0 if intact else 1)
"""


COMMAND = os.environ.get("GPUQ_BENCH_COMMAND")  # the `gpuq` command as users have it, installed; else this tree


def gpuq(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_") or k == "GPUQ_FAST_POOL"}
    env["GPUQ_HOME"] = str(home)
    if COMMAND:
        argv = [COMMAND, *args]
    else:
        env["PYTHONPATH"] = os.pathsep.join([str(GPUQ_ROOT[0]), *filter(None, [os.environ.get("PYTHONPATH")])])
        argv = [sys.executable, "-m", "gpuq_scheduler.launcher.cli.entry", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=600)


def show(home: Path, job: int) -> dict[str, Any]:
    return dict(json.loads(gpuq(home, "show", "--json", str(job)).stdout))


def until(what: str, check: Any, timeout: float = 600.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def counts(path: Path) -> list[int]:
    return [int(v) for v in path.read_text().split()] if path.exists() else []


def gpu_processes() -> dict[int, int]:
    """pid -> bytes, every compute process NVML lists."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {}
    for line in out.strip().splitlines():
        pid, used = (part.strip() for part in line.split(","))
        found[int(pid)] = int(used) << 20
    return found


def event(home: Path, job: int, kind: str) -> dict[str, Any]:
    for line in reversed((home / "events.jsonl").read_text().splitlines()):
        data = json.loads(line)
        if data.get("job") == job and data.get("event") == kind:
            return dict(data)
    return {}


def event_after(home: Path, job: int, kind: str, since: float, timeout: float = 600.0) -> dict[str, Any]:
    """The job's first event of this kind at or after wall time ``since``, once events.jsonl has it."""

    def found() -> dict[str, Any] | None:
        path = home / "events.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            data = json.loads(line)
            if data.get("job") == job and data.get("event") == kind and data.get("t", 0.0) >= since:
                return dict(data)
        return None

    return dict(until(f"job {job}'s {kind} event", found, timeout))


def phases(command_at: float, command_s: float, seen: dict[str, Any], done: dict[str, Any]) -> dict[str, Any]:
    """Where the time from a command to its record went: the command, the daemon's part (the pass that
    took the request to the one that recorded the result), the helper's life within it, its driver calls."""
    steps = done.get("steps") or {}
    helper = done.get("helper") or {}
    return {
        "total_s": round(done["t"] - command_at, 3),
        "command_s": round(command_s, 3),
        "seen_after_s": round(seen["t"] - command_at, 3),
        "daemon_s": round(done["t"] - seen["t"], 3),
        "helper_s": round(helper["ended"] - helper["spawned"], 3) if {"ended", "spawned"} <= set(helper) else None,
        "driver_calls_s": round(sum(float(v) for k, v in steps.items() if k in DRIVER_CALLS), 3),
    }


DRIVER_CALLS = ("lock", "checkpoint", "restore", "unlock")


class Job:
    """A PyTorch job holding N GiB, run by a private gpuq queue on the real GPUs."""

    def __init__(self, size: float, work: Path, more: tuple[str, ...] = ()) -> None:
        self.size, self.home = size, work / f"queue-{size:g}"
        script = work / "job.py"
        script.write_text(JOB)
        self.counts, self.stop = work / f"counts-{size:g}", work / f"stop-{size:g}"
        self.id = int(
            json.loads(
                gpuq(
                    self.home,
                    "submit",
                    "--json",
                    *more,
                    "--gpus",
                    "1",
                    sys.executable,
                    str(script),
                    str(size),
                    str(self.counts),
                    str(self.stop),
                ).stdout
            )["id"]
        )
        until("the job to count", lambda: len(counts(self.counts)) > 5 and show(self.home, self.id)["peak_mem"])
        self.pid = int(json.loads((self.home / "run" / f"{self.id}.pid").read_text())["pid"])
        # One thread: the helper is forked from the daemon; more (NVML's, say): from its Forker.
        self.threads = len(os.listdir(f"/proc/{int((self.home / 'daemon.pid').read_text())}/task"))
        self.held = gpu_processes().get(self.pid, 0)

    def through_gpuq(self) -> dict[str, Any]:
        """One suspend and resume by `gpuq suspend` and `gpuq resume`, timed to their events' records."""
        wall_at = time.time()
        gpuq(self.home, "suspend", str(self.id))
        command_s = time.time() - wall_at
        suspended = event_after(self.home, self.id, "suspended", wall_at)
        down = phases(wall_at, command_s, event_after(self.home, self.id, "suspending", wall_at - 1), suspended)
        checks = self._while_suspended()
        resume_wall_at = time.time()
        gpuq(self.home, "resume", str(self.id))
        command_s = time.time() - resume_wall_at
        done = event_after(self.home, self.id, "resumed", resume_wall_at)
        up = phases(
            resume_wall_at, command_s, event_after(self.home, self.id, "resume-requested", resume_wall_at - 1), done
        )
        return {
            "suspend_s": down["total_s"],
            "resume_s": up["total_s"],
            "host_bytes": suspended.get("bytes"),
            "phases": {"suspend": down, "resume": up},
            "helper_steps": {"suspend": suspended.get("steps"), "resume": done.get("steps")},
            "path": {k: suspended.get(k) for k in ("path", "fallback", "detail", "fast_bytes", "fast_seconds")},
            "helper_times": {"suspend": suspended.get("helper"), "resume": done.get("helper")},
            **checks,
            **self._counting_on(checks),
        }

    def bare(self, cuda: DriverCheckpoint) -> dict[str, Any]:
        """The same job's lock + checkpoint and restore + unlock, called from this process, timed."""
        times = {}
        for name, call in (("lock", cuda.lock), ("checkpoint", cuda.checkpoint)):
            at = time.monotonic()
            call(self.pid)
            times[name] = round(time.monotonic() - at, 3)
        checks = self._while_suspended()
        for name, call in (("restore", cuda.restore), ("unlock", cuda.unlock)):
            at = time.monotonic()
            call(self.pid)
            times[name] = round(time.monotonic() - at, 3)
        down, up = times["lock"] + times["checkpoint"], times["restore"] + times["unlock"]
        return {
            "times_s": times,
            "suspend_s": round(down, 3),
            "resume_s": round(up, 3),
            **checks,
            **self._counting_on(checks),
        }

    def _while_suspended(self) -> dict[str, Any]:
        stopped = counts(self.counts)
        on_gpu = gpu_processes()
        time.sleep(2)  # the count must not move while suspended: looked at after a while
        return {
            "gpu_empty_of_job": self.pid not in on_gpu,
            "no_progress": counts(self.counts) == stopped,
            "stopped_at": len(stopped),
        }

    def _counting_on(self, checks: dict[str, Any]) -> dict[str, Any]:
        at = checks["stopped_at"]
        until("the job to count on", lambda: len(counts(self.counts)) > at + 5)
        return {"counted_on": counts(self.counts)[: at + 5] == list(range(1, at + 6))}

    def end(self) -> dict[str, Any]:
        self.stop.touch()
        until("the job to end", lambda: show(self.home, self.id)["state"] not in ("running", "suspended"))
        ended = show(self.home, self.id)
        gpuq(self.home, "daemon", "stop")
        return {"intact_after": ended["state"] == "succeeded", "outcome": ended["state"]}


def one_size(
    size: float, pairs: int, work: Path, cuda: DriverCheckpoint, more: tuple[str, ...] = (), again: int = 0
) -> dict[str, Any]:
    """``pairs`` cycles through gpuq and as many bare, on one job, in the order gpuq, bare, bare, gpuq, ...
    (so that neither side keeps a drift of the host to itself), after a first cycle through gpuq, apart: a
    process's first checkpoint is the dearest (16.6 s, then 8.4-10.7 s for 16 GiB on an H200: the driver
    allocates its host memory then), and whichever side had it would lose by it."""
    job = Job(size, work, more)
    cycles: list[dict[str, Any]] = [{"kind": "first", **job.through_gpuq()}]
    print(json.dumps({"size_gib": size, **cycles[-1]}), flush=True)
    for _ in range(again):  # through gpuq only (a pool of 100 GiB kept leaves no room for the driver's copy)
        cycles.append({"kind": "gpuq", **job.through_gpuq()})
        print(json.dumps({"size_gib": size, **cycles[-1]}), flush=True)
    for index in range(2 * pairs):
        through = index % 4 in (0, 3)
        cycles.append({"kind": "gpuq", **job.through_gpuq()} if through else {"kind": "bare", **job.bare(cuda)})
        print(json.dumps({"size_gib": size, **cycles[-1]}), flush=True)
    ended = job.end()
    gb = job.held / GB
    for cycle in cycles:
        cycle["suspend_gb_s"] = round(gb / cycle["suspend_s"], 2)
        cycle["resume_gb_s"] = round(gb / cycle["resume_s"], 2)
    return {
        "size_gib": size,
        "held_bytes": job.held,
        "daemon_threads": job.threads,
        "cycles": cycles,
        **ended,
        "median": _medians(cycles, gb) if {"gpuq", "bare"} <= {c["kind"] for c in cycles} else {},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", type=float, nargs="+", default=[4.0, 16.0, 40.0])
    parser.add_argument("--pairs", type=int, default=2, help="cycles through gpuq, and as many bare, per size")
    parser.add_argument("--preemptible", action="store_true", help="the job --preemptible: the fast path (#40)")
    parser.add_argument("--again", type=int, default=0, help="cycles through gpuq alone after the first")
    parser.add_argument("--root", type=Path, default=ROOT, help="run this gpuq source tree (default: this one)")
    args = parser.parse_args()
    GPUQ_ROOT[0] = args.root.resolve()
    results: dict[str, Any] = {
        "machine": subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "root": str(GPUQ_ROOT[0]),
        "sizes": [],
    }
    cuda = DriverCheckpoint()  # opened once: the bare calls' process holds the driver, as gpuq's spare helper does
    floor = []
    for _ in range(10):
        at = time.monotonic()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        floor.append(time.monotonic() - at)
    results["python_floor_s"] = round(statistics.median(floor), 4)  # what any Python command costs here
    results["command"] = COMMAND or f"{sys.executable} -m gpuq_scheduler.launcher.cli.entry"
    with tempfile.TemporaryDirectory(prefix="gpuq-suspend-") as tmp:
        for size in args.sizes:
            work = Path(tmp) / f"{size:g}"
            work.mkdir()
            more = ("--preemptible",) if args.preemptible else ()
            row = one_size(size, args.pairs, work, cuda, more, args.again)
            results["sizes"].append(row)
            print(json.dumps({"size_gib": size, "median": row["median"]}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


def _medians(cycles: list[dict[str, Any]], gb: float) -> dict[str, float]:
    """Medians over the cycles, suspend and resume each: gpuq's whole time (from the moment before the command
    to the state recorded in events.jsonl), the command's own part, the daemon's part (the pass that took the
    request to the one that recorded it), its helper's driver calls alone (lock + checkpoint; restore +
    unlock), the bare calls, each of gpuq's against the bare calls, gpuq's own part (its whole less its
    driver calls) against the bare calls, and GB/s."""

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    through = [c for c in cycles if c["kind"] == "gpuq"]  # not the first cycle
    found: dict[str, float] = {}
    for action in ("suspend", "resume"):
        bare = median([c[f"{action}_s"] for c in cycles if c["kind"] == "bare"])
        found[f"bare_{action}_s"] = bare
        found[f"bare_{action}_gb_s"] = round(gb / bare, 2)
        for part in ("total", "command", "daemon", "driver_calls"):
            value = median([c["phases"][action][f"{part}_s"] for c in through])
            found[f"gpuq_{part}_{action}_s"] = value
            if part != "command":
                found[f"ratio_{part}_{action}"] = round(value / bare, 3)
        found[f"gpuq_{action}_gb_s"] = round(gb / found[f"gpuq_total_{action}_s"], 2)
        own = median([c["phases"][action]["total_s"] - c["phases"][action]["driver_calls_s"] for c in through])
        found[f"gpuq_own_{action}_s"] = own
        found[f"own_over_bare_{action}"] = round(own / bare, 3)
    return found


if __name__ == "__main__":
    main()
