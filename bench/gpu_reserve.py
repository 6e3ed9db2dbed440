"""A reservation starting while a large preemptible job holds the GPU (#42), on a lent GPU host:

    python3 bench/gpu_reserve.py --size 24 --out results.json

A --preemptible PyTorch job fills SIZE GiB with a known pattern and counts every 50 ms on GPU 0 (the other GPUs,
if any, drained). Once it counts, `gpuq reserve --gpus 1 --start +LEAD` is made, and the owner's job is
submitted with --reservation at once (it waits for the start). Figures, from the daemon's journal and the
reservation's start: start -> the victim's suspend decided, the suspend itself (decided -> recorded
suspended), recorded suspended -> the owner's job started. The issue's bar: the owner's job starts within
the victim's suspend time + 1 s of the start. Then the reservation is cancelled: the victim resumes, made no
progress while suspended, counts on from where it stopped, and finds its tensor intact.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu_preempt import HOLDER, Queue, gpu_count  # noqa: E402  (the preemption bench's victim and queue)
from bench.gpu_suspend import counts, until  # noqa: E402

OWNER = """
import sys, time, torch
Path = __import__("pathlib").Path
Path(sys.argv[1]).write_text(repr(time.time()))
a = torch.randn(4096, 4096, device="cuda")
for _ in range(50):
    a = a @ a / 64
torch.cuda.synchronize()
"""


def run(work: Path, size: float, lead: float, fake: bool) -> dict[str, Any]:
    """``fake``: a dry run of this script on the fake inventory, the jobs' tensors on the CPU (no figures)."""
    extra = {"GPUQ_FAKE_GPUS": "1x80GiB", "GPUQ_FAKE_HOST_MEMORY": "256GiB"} if fake else {}
    queue = Queue(work / "queue", **extra)
    for gpu in range(1, 1 if fake else gpu_count()):
        queue("drain", str(gpu))
    for name, text in (("holder.py", HOLDER), ("owner.py", OWNER)):
        if fake:
            text = text.replace('device="cuda"', 'device="cpu"').replace("torch.cuda.synchronize()", "pass")
        (work / name).write_text(text)
    count_file, stop = work / "counts", work / "stop"
    victim = queue.submit(
        "--preemptible",
        "--name",
        "victim",
        sys.executable,
        str(work / "holder.py"),
        str(size),
        str(count_file),
        str(stop),
    )
    until("the victim counting", lambda: len(counts(count_file)) > 20, 300)
    made = queue("reserve", "--gpus", "1", "--start", f"+{lead:g}s", "--duration", "10m", "--name", "deadline")
    booked = json.loads(queue("reserve", "--list", "--json"))[0]
    owner = queue.submit(
        "--reservation",
        "deadline",
        "--name",
        "owner",
        sys.executable,
        str(work / "owner.py"),
        str(work / "owner-started"),
    )
    until("the owner's job ended", lambda: queue.show(owner)["state"] in ("succeeded", "failed"), 300)
    at_suspend = len(counts(count_file))
    held_while = queue.show(victim)["state"]
    time.sleep(1.0)
    still = len(counts(count_file))  # no progress while suspended
    queue("reserve", "--cancel", "deadline")
    until("the victim resumed", lambda: len(counts(count_file)) > still + 20, 300)
    stop.touch()
    until("the victim ended", lambda: queue.show(victim)["state"] in ("succeeded", "failed"), 300)
    numbers = counts(count_file)
    start = booked["start"]
    decided = queue.first(victim, "preempted")["t"]
    suspended = queue.first(victim, "suspended")
    began = queue.first(owner, "started")["t"]
    suspend_time = suspended["t"] - decided
    figures = {
        "size_gib": size,
        "reserve_output": made.strip(),
        "victim": victim,
        "owner": owner,
        "start_to_decided_s": round(decided - start, 3),
        "suspend_s": round(suspend_time, 3),
        "suspended_to_owner_started_s": round(began - suspended["t"], 3),
        "start_to_owner_started_s": round(began - start, 3),
        "bar_s": round(suspend_time + 1.0, 3),
        "within_bar": began - start <= suspend_time + 1.0,
        "owner_process_began_after_start_s": round(float((work / "owner-started").read_text()) - start, 3),
        "suspended_event": suspended,
        "victim_state_while_owner_ran": held_while,
        "no_progress_while_suspended": at_suspend == still,
        "count_whole": numbers == list(range(1, len(numbers) + 1)),
        "victim_outcome": queue.show(victim)["state"],
        "owner_outcome": queue.show(owner)["state"],
        "log_tail": (queue.home / "logs" / f"{victim}.log").read_text()[-200:],
    }
    queue("daemon", "stop")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=float, default=24.0)
    parser.add_argument("--lead", type=float, default=8.0, help="seconds from the reserve to its start")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fake", action="store_true", help="a dry run on the fake inventory")
    args = parser.parse_args()
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    machine = "fake" if args.fake else subprocess.run(query, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as work:
        results = {"machine": machine, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        results.update(run(Path(work), args.size, args.lead, args.fake))
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
