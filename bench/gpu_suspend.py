"""Suspend and resume on a lent GPU host (#28), run by the lead:

    .venv/bin/python bench/gpu_suspend.py --out bench/results/gpu_suspend.json [--sizes 4 16 40] [--repeat 3]

For each size, a PyTorch job holding N GiB (a known pattern) is suspended and resumed through gpuq (a
private queue on the real GPUs): the time from the moment before `gpuq suspend` starts to the job recorded
suspended (its ``suspended`` event's time in events.jsonl, read from the file, not by polling `gpuq show`)
and from `gpuq resume` to it recorded running again, split into the command itself, the daemon's part (from
the pass that took the request to the one that recorded the result) and the helper's driver calls (lock +
checkpoint; restore + unlock, from events.jsonl), and GB/s; whether the GPU was empty of the job while
suspended (NVML), whether its count made no progress then, and whether its tensor was intact after. Then
the bare driver calls on a plain process holding the same size, timed the same way, for the comparison
(gpuq's time within 5 % of the driver's is the issue's bar). With --repeat, gpuq and the bare calls take
turns going first; the medians give each part of gpuq's time beside the bare calls, and their ratios.
"""

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


def gpuq(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env.update(GPUQ_HOME=str(home), PYTHONPATH=str(GPUQ_ROOT[0]))
    return subprocess.run(
        [sys.executable, "-m", "gpuq_scheduler.launcher.cli.entry", *args], env=env, capture_output=True, text=True,
        check=True, timeout=600,
    )  # fmt: skip


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
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
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
        "total_s": round(done["t"] - command_at, 3), "command_s": round(command_s, 3),
        "seen_after_s": round(seen["t"] - command_at, 3), "daemon_s": round(done["t"] - seen["t"], 3),
        "helper_s": round(helper["ended"] - helper["spawned"], 3) if {"ended", "spawned"} <= set(helper) else None,
        "driver_calls_s": round(sum(float(v) for k, v in steps.items() if k in DRIVER_CALLS), 3),
    }  # fmt: skip


DRIVER_CALLS = ("lock", "checkpoint", "restore", "unlock")


def through_gpuq(size: float, work: Path) -> dict[str, Any]:
    home, script = work / f"queue-{size:g}", work / "job.py"
    script.write_text(JOB)
    count_file, stop = work / f"counts-{size:g}", work / f"stop-{size:g}"
    job = int(json.loads(gpuq(home, "submit", "--json", "--gpus", "1", sys.executable, str(script), str(size),
                              str(count_file), str(stop)).stdout)["id"])  # fmt: skip
    until("the job to count", lambda: len(counts(count_file)) > 5 and show(home, job)["peak_mem"])
    pid = json.loads((home / "run" / f"{job}.pid").read_text())["pid"]
    # One thread: the helper is forked from the daemon; more (NVML's, say): a fresh interpreter instead.
    threads = len(os.listdir(f"/proc/{int((home / 'daemon.pid').read_text())}/task"))
    held = gpu_processes().get(pid, 0)
    wall_at = time.time()
    gpuq(home, "suspend", str(job))
    command_s = time.time() - wall_at
    down = phases(wall_at, command_s, event_after(home, job, "suspending", wall_at - 1),
                  event_after(home, job, "suspended", wall_at))  # fmt: skip
    stopped = counts(count_file)
    on_gpu = gpu_processes()
    time.sleep(2)  # the count must not move while suspended: looked at after a while
    still = counts(count_file) == stopped
    resume_wall_at = time.time()
    gpuq(home, "resume", str(job))
    command_s = time.time() - resume_wall_at
    up = phases(resume_wall_at, command_s, event_after(home, job, "resume-requested", resume_wall_at - 1),
                event_after(home, job, "resumed", resume_wall_at))  # fmt: skip
    suspend_s, resume_s = down["total_s"], up["total_s"]
    until("the job to count on", lambda: len(counts(count_file)) > len(stopped) + 5)
    went_on = counts(count_file)[: len(stopped) + 5] == list(range(1, len(stopped) + 6))
    stop.touch()
    until("the job to end", lambda: show(home, job)["state"] not in ("running", "suspended"))
    ended = show(home, job)
    gpuq(home, "daemon", "stop")
    down_event, up_event = event(home, job, "suspended"), event(home, job, "resumed")
    steps = {"suspend": down_event.get("steps"), "resume": up_event.get("steps")}
    helper = {"suspend": down_event.get("helper"), "resume": up_event.get("helper")}
    return {
        "size_gib": size, "held_bytes": held, "host_bytes": event(home, job, "suspended").get("bytes"),
        "suspend_s": suspend_s, "resume_s": resume_s, "helper_steps": steps, "helper_times": helper,
        "daemon_threads": threads,
        "phases": {"suspend": down, "resume": up},
        "suspend_gb_s": round(held / GB / suspend_s, 2), "resume_gb_s": round(held / GB / resume_s, 2),
        "gpu_empty_of_job_while_suspended": pid not in on_gpu, "gpu_processes_while_suspended": on_gpu,
        "no_progress_while_suspended": still, "counted_on_from_where_it_stopped": went_on,
        "intact_after": ended["state"] == "succeeded", "outcome": ended["state"],
    }  # fmt: skip


def bare_driver(size: float, work: Path, first: bool = False) -> dict[str, Any]:
    """The same job, not through gpuq: this process drives the driver's calls on it, timed."""
    count_file, stop = work / f"bare-counts-{size:g}", work / f"bare-stop-{size:g}"
    if first:
        (work / "job.py").write_text(JOB)
    child = subprocess.Popen([sys.executable, str(work / "job.py"), str(size), str(count_file), str(stop)])
    until("the bare job to count", lambda: len(counts(count_file)) > 5)
    cuda = DriverCheckpoint()
    held = gpu_processes().get(child.pid, 0)
    times = {}
    for name, call in (("lock", cuda.lock), ("checkpoint", cuda.checkpoint)):
        at = time.monotonic()
        call(child.pid)
        times[name] = round(time.monotonic() - at, 3)
    empty = child.pid not in gpu_processes()
    for name, call in (("restore", cuda.restore), ("unlock", cuda.unlock)):
        at = time.monotonic()
        call(child.pid)
        times[name] = round(time.monotonic() - at, 3)
    stop.touch()
    code = child.wait(600)
    down, up = times["lock"] + times["checkpoint"], times["restore"] + times["unlock"]
    return {
        "size_gib": size, "held_bytes": held, "times_s": times, "suspend_s": round(down, 3),
        "resume_s": round(up, 3), "suspend_gb_s": round(held / GB / down, 2), "resume_gb_s": round(held / GB / up, 2),
        "gpu_empty_while_checkpointed": empty, "intact_after": code == 0,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", type=float, nargs="+", default=[4.0, 16.0, 40.0])
    parser.add_argument("--repeat", type=int, default=1, help="rounds per size, gpuq and the bare calls in turn")
    parser.add_argument("--root", type=Path, default=ROOT, help="run this gpuq source tree (default: this one)")
    args = parser.parse_args()
    GPUQ_ROOT[0] = args.root.resolve()
    results: dict[str, Any] = {"machine": subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True, text=True,
    ).stdout.strip(), "date": time.strftime("%Y-%m-%d %H:%M %Z"), "root": str(GPUQ_ROOT[0]), "sizes": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpuq-suspend-") as tmp:
        for size in args.sizes:
            rounds = []
            for index in range(args.repeat):
                work = Path(tmp) / f"{size:g}-{index}"
                work.mkdir()
                # Which goes first alternates: the second run of a pair may find the host's memory warmer.
                if index % 2:
                    driver, through = bare_driver(size, work, first=True), through_gpuq(size, work)
                else:
                    through, driver = through_gpuq(size, work), bare_driver(size, work)
                rounds.append({"gpuq": through, "driver": driver, "gpuq_first": index % 2 == 0})
                print(json.dumps(rounds[-1]), flush=True)
            row = {"size_gib": size, "rounds": rounds, "median": _medians(rounds)}
            results["sizes"].append(row)
            print(json.dumps({"size_gib": size, "median": row["median"]}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


def _medians(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the rounds, suspend and resume each: gpuq's whole time (from the moment before the command
    to the state recorded in events.jsonl), the command's own part, the daemon's part (the pass that took the
    request to the one that recorded it), its helper's driver calls alone (lock + checkpoint; restore +
    unlock), the bare calls, and each of gpuq's against the bare calls."""

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    found: dict[str, float] = {}
    for action in ("suspend", "resume"):
        bare = median([r["driver"][f"{action}_s"] for r in rounds])
        found[f"bare_{action}_s"] = bare
        for part in ("total", "command", "daemon", "driver_calls"):
            value = median([r["gpuq"]["phases"][action][f"{part}_s"] for r in rounds])
            found[f"gpuq_{part}_{action}_s"] = value
            if part != "command":
                found[f"ratio_{part}_{action}"] = round(value / bare, 3)
    return found


if __name__ == "__main__":
    main()
