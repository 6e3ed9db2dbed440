"""Automatic preemption on a lent GPU host (#28, scenarios b and d), run by the lead:

    .venv/bin/python bench/gpu_preempt.py --out bench/results/gpu_preempt.json [--only b|d] [--size 16]

(b) Every GPU held by a --preemptible PyTorch job of SIZE GiB (a known pattern, counting every 50 ms on the
    GPU); then an urgent job (--priority 10, a whole GPU, 4 GiB of matmuls for a few seconds) is submitted.
    Figures: its wait from submit to start, against its victim's checkpoint (the helper's lock, checkpoint,
    freeze; and the whole suspend from the decision to the job recorded suspended). The issue's bar: the wait
    no longer than the victims' checkpoint time plus 1 s. Checks: the victim resumed only after the urgent
    job ended, made no progress while suspended, counted on from where it stopped, and its tensor was intact
    at the end; the other GPUs' jobs were never suspended.
(d) The requeue fallback of an MPS-fenced job: a packed (--mem) --preemptible job on GPU 0 (the others
    drained), a client of gpuq's MPS server, which the driver cannot checkpoint. A whole-GPU urgent job
    preempts it: it gets SIGUSR1, saves its step and exits; it is requeued (not counted against its retries)
    and, once the urgent job ended, runs again with GPUQ_PREEMPTED=1 and GPUQ_RESTART_COUNT=1, goes on from
    its saved step and finishes. Figures: signal to exit, the urgent job's wait, whether the steps are whole.

Each runs a private queue on the real GPUs with GPUQ_PREEMPT=on and a 1 s minimum runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# The victim of (b): as bench/gpu_suspend.py's job (fills SIZE GiB with a pattern, counts on the GPU in
# COUNTS, checks its whole tensor once STOP exists and exits 0 if intact).
HOLDER = """
import sys, time, torch
from pathlib import Path
size, counts, stop = float(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
row = 1 << 20
pattern = torch.arange(row, device="cuda", dtype=torch.int32).remainder(251).to(torch.uint8)
x = torch.empty((int(size * 1024), row), dtype=torch.uint8, device="cuda")
x.copy_(pattern.expand_as(x))
count = torch.zeros(1, dtype=torch.int64, device="cuda")
torch.cuda.synchronize()
with counts.open("a") as out:
    while not stop.exists():
        count += 1
        out.write(f"{int(count.item())}\\n")
        out.flush()
        time.sleep(0.05)
intact = all(bool(x[at : at + 1024].eq(pattern).all().item()) for at in range(0, x.shape[0], 1024))
print("INTACT" if intact else "CORRUPT", flush=True)
sys.exit(0 if intact else 1)
"""

# The urgent job: GIB GiB and matmuls for SECONDS.
URGENT = """
import sys, time, torch
gib, seconds = float(sys.argv[1]), float(sys.argv[2])
held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
x = torch.randn(4096, 4096, device="cuda")
end = time.time() + seconds
while time.time() < end:
    x = (x @ x).clamp_(-1, 1)
torch.cuda.synchronize()
"""

# The victim of (d): a preemption-safe training loop (docs/suspend.md). Steps to STEPS (a file), one every
# 20 ms of GPU work; on its signal it saves the step it reached and exits 0; run again, it goes on from there.
TRAINER = """
import os, signal, sys, time, torch
from pathlib import Path
gib, steps_file, last = float(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
saved = steps_file.with_suffix(".saved")
with steps_file.with_suffix(".starts").open("a") as starts:
    starts.write(f"{os.environ.get('GPUQ_PREEMPTED', '')} {os.environ.get('GPUQ_RESTART_COUNT', '')} {time.time()}\\n")
step = int(saved.read_text()) if os.environ.get("GPUQ_PREEMPTED") == "1" and saved.exists() else 0
held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
x = torch.randn(1024, 1024, device="cuda")

def save(signum, frame):
    saved.write_text(str(step))
    with steps_file.with_suffix(".signalled").open("a") as out:
        out.write(f"{time.time()}\\n")
    sys.exit(0)

signal.signal(getattr(signal, os.environ.get("GPUQ_PREEMPT_SIGNAL", "SIGUSR1")), save)
with steps_file.open("a") as out:
    while step < last:
        x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
        step += 1
        out.write(f"{step}\\n")
        out.flush()
        time.sleep(0.02)
"""


class Queue:
    def __init__(self, home: Path, **extra: str) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
        self.env.update(GPUQ_HOME=str(home), PYTHONPATH=str(ROOT), GPUQ_PREEMPT="on", GPUQ_PREEMPT_MIN_RUNTIME="1s")
        self.env.update(extra)

    def __call__(self, *args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "gpuq_scheduler.launcher.cli.entry", *args], env=self.env, capture_output=True,
            text=True, check=True, timeout=600,
        ).stdout  # fmt: skip

    def submit(self, *args: str) -> int:
        return int(json.loads(self("submit", "--json", *args))["id"])

    def show(self, job: int) -> dict[str, Any]:
        return dict(json.loads(self("show", "--json", str(job))))

    def events(self) -> list[dict[str, Any]]:
        path = self.home / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    def first(self, job: int, kind: str, after: float = 0.0) -> dict[str, Any]:
        found = (e for e in self.events() if e.get("job") == job and e.get("event") == kind and e["t"] >= after)
        return next(found, {})


def until(what: str, check: Any, timeout: float = 600.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def numbers(path: Path) -> list[int]:
    return [int(v) for v in path.read_text().split()] if path.exists() else []


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    return len([line for line in out.splitlines() if line.startswith("GPU ")])


def urgent_takes_a_gpu(work: Path, size: float) -> dict[str, Any]:
    """(b): every GPU held by a preemptible job; an urgent one's wait against its victim's checkpoint."""
    queue = Queue(work / "queue-b")
    (work / "holder.py").write_text(HOLDER)
    (work / "urgent.py").write_text(URGENT)
    holders = []
    for n in range(gpu_count()):
        counts, stop = work / f"counts-{n}", work / f"stop-{n}"
        job = queue.submit("--preemptible", "--gpus", "1", sys.executable, str(work / "holder.py"), str(size),
                           str(counts), str(stop))  # fmt: skip
        holders.append((job, counts, stop))
    for job, counts, _ in holders:
        seen = lambda job=job, counts=counts: len(numbers(counts)) > 5 and queue.show(job)["peak_mem"]  # noqa: E731
        until(f"job {job} to count", seen)
    time.sleep(1.5)  # past the queue's minimum runtime of 1 s
    urgent = queue.submit("--priority", "10", "--gpus", "1", sys.executable, str(work / "urgent.py"), "4", "5")
    until("the urgent job to end", lambda: queue.show(urgent)["state"] not in ("pending", "running"))
    ended = queue.show(urgent)
    events = queue.events()
    preempted = [e for e in events if e.get("event") == "preempted" and e.get("for") == urgent]
    victims = [e["job"] for e in preempted]
    victim = victims[0] if victims else None
    result: dict[str, Any] = {"size_gib": size, "gpus": len(holders), "urgent_outcome": ended["state"],
                              "victims": victims}  # fmt: skip
    if victim is None:
        result["problem"] = "no job was preempted"
        return result
    counts = next(c for j, c, _ in holders if j == victim)
    decided = preempted[0]["t"]
    suspended = queue.first(victim, "suspended")
    stopped = numbers(counts)
    until("the victim to resume", lambda: queue.show(victim)["state"] == "running")
    resuming = queue.first(victim, "resuming")
    until("the victim to count on", lambda: len(numbers(counts)) > len(stopped) + 5)
    went_on = numbers(counts)[: len(stopped) + 5] == list(range(1, len(stopped) + 6))
    for _, _, stop in holders:
        stop.touch()
    outcomes = {}
    for j, _, _ in holders:
        state = lambda j=j: (s := queue.show(j)["state"]) not in ("running", "suspended") and s  # noqa: E731
        outcomes[j] = until(f"job {j} to end", state)
    queue("daemon", "stop")
    wait = ended["started_at"] - ended["submitted_at"]
    steps = suspended.get("steps") or {}
    checkpoint = sum(float(steps.get(k, 0.0)) for k in ("lock", "checkpoint", "freeze"))
    suspend_s = suspended["t"] - decided
    result.update({
        "urgent_wait_s": round(wait, 3), "victim_helper_steps_s": steps, "victim_checkpoint_s": round(checkpoint, 3),
        "victim_suspend_s": round(suspend_s, 3), "victim_bytes": suspended.get("bytes"),
        "wait_within_checkpoint_plus_1s": wait <= suspend_s + 1.0,
        "resumed_after_urgent_ended": bool(resuming) and resuming["t"] >= (ended["ended_at"] or 0.0),
        "counted_on_from_where_it_stopped": went_on,
        "others_never_suspended": all(not queue.first(j, "suspended") for j, _, _ in holders if j != victim),
        "outcomes": outcomes, "all_intact": all(s == "succeeded" for s in outcomes.values()),
    })  # fmt: skip
    return result


def mps_job_is_requeued(work: Path, gib: float, steps: int) -> dict[str, Any]:
    """(d): the requeue fallback of an MPS-fenced packed job."""
    queue = Queue(work / "queue-d", GPUQ_FENCE="auto", GPUQ_PREEMPT_GRACE="30s")
    (work / "trainer.py").write_text(TRAINER)
    (work / "urgent.py").write_text(URGENT)
    count = gpu_count()
    queue("status")
    if count > 1:
        queue("drain", *(str(i) for i in range(1, count)))
    steps_file = work / "steps"
    victim = queue.submit("--preemptible", "--mem", f"{gib + 4:g}G", sys.executable, str(work / "trainer.py"),
                          str(gib), str(steps_file), str(steps))  # fmt: skip
    until("the trainer to step", lambda: len(numbers(steps_file)) > 20 and queue.show(victim)["peak_mem"])
    fence = json.loads((queue.home / "gpus.json").read_text()).get("gpus", [{}])[0].get("fence")
    time.sleep(1.5)  # past the queue's minimum runtime of 1 s
    urgent = queue.submit("--priority", "10", "--gpus", "1", sys.executable, str(work / "urgent.py"), "8", "5")
    until("the urgent job to end", lambda: queue.show(urgent)["state"] not in ("pending", "running"))
    ended = queue.show(urgent)
    until("the trainer to finish", lambda: queue.show(victim)["state"] not in ("pending", "running"), timeout=900)
    done = queue.show(victim)
    queue("daemon", "stop")
    preempted = queue.first(victim, "preempted")
    signalled = [float(v) for v in steps_file.with_suffix(".signalled").read_text().split()] if steps_file.with_suffix(
        ".signalled").exists() else []  # fmt: skip
    requeued = queue.first(victim, "requeued")
    seen = numbers(steps_file)
    starts = steps_file.with_suffix(".starts").read_text().splitlines()
    return {
        "fence": fence, "victim_gib": gib, "urgent_outcome": ended["state"],
        "urgent_wait_s": round(ended["started_at"] - ended["submitted_at"], 3),
        "why_not_suspended": preempted.get("requeue"), "preempted_event": preempted,
        "signal_to_exit_s": round(requeued["t"] - signalled[0], 3) if signalled and requeued else None,
        "requeued_reason": requeued.get("reason"), "starts": starts,
        "restarted_with_preempted_and_count_1": len(starts) == 2 and starts[1].startswith("1 1 "),
        "steps_whole": seen == list(range(1, steps + 1)), "victim_outcome": done["state"], "attempt": done["attempt"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", choices=("b", "d"))
    parser.add_argument("--size", type=float, default=16.0, help="GiB each victim of (b) holds")
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True, text=True,
    ).stdout.strip(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpuq-preempt-") as tmp:
        work = Path(tmp)
        if args.only in (None, "b"):
            results["b_urgent_takes_a_gpu"] = urgent_takes_a_gpu(work, args.size)
            print(json.dumps(results["b_urgent_takes_a_gpu"]), flush=True)
        if args.only in (None, "d"):
            results["d_mps_job_requeued"] = mps_job_is_requeued(work, 8.0, 600)
            print(json.dumps(results["d_mps_job_requeued"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
