"""A packed job suspended in place on a lent GPU host (#40), run by the lead:

    python3 bench/gpu_inplace.py --out bench/results/h200-packed-2026-11-29/inplace.json [--ballast 16]

Two deterministic PyTorch training runs packed on GPU 0 under gpuq's MPS fence: a neighbour (``--mem 8G``) and
a ``--preemptible`` one (``--mem 24G``, holding BALLAST GiB of other state). Once both train, the second is
suspended through `gpuq suspend`: its PyTorch memory goes to host memory on the fast path, the driver's lock
answers 801 for an MPS client, so its context stays on the GPU and it is frozen in its cgroup (the path
``fast-in-place``). While it is suspended, a third packed job takes all the GPU but the neighbour's share
(allocating and touching it: it would not fit if the suspended job's memory were still there), `gpuq resume`
is asked, and the suspended job waits until its share fits again; the third ends, and it resumes in place.

Recorded: the suspend from the command to the job recorded suspended, and the helper's steps; the resume from
the pass that began it to the job recorded running; what NVML lists for the suspended process (its context);
the neighbour's steps during the suspend (its count must move); the suspended job's reason while it waited;
and whether every loss of both runs is bit-identical to the same run alone, outside gpuq (``float.hex``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu_suspend import event, event_after, gpu_processes, gpuq, show, until  # noqa: E402

GiB = 1 << 30
ENDED = ("succeeded", "failed", "cancelled")

# A deterministic training run: an MLP on data generated on the GPU from each step's seed, AdamW,
# deterministic algorithms, BALLAST GiB of other state (int32 7s, checked at the end); its loss at each step
# written as float.hex(). Exit 0 if its ballast is intact.
TRAIN = """
import os, sys, time
os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
import torch
losses, steps, ballast_gib = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
ballast = torch.full((int(ballast_gib * 2**28),), 7, dtype=torch.int32, device="cuda")
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024), torch.nn.GELU(),
                            torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
def batch(step):
    g = torch.Generator(device="cuda").manual_seed(step)
    return torch.randn(256, 512, generator=g, device="cuda"), torch.randint(0, 10, (256,), generator=g, device="cuda")
with open(losses, "a") as out:
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        out.write(loss.item().hex() + "\\n")
        out.flush()
        time.sleep(0.02)
intact = bool(ballast.eq(7).all().item())
print("INTACT" if intact else "CORRUPT", flush=True)
sys.exit(0 if intact else 1)
"""

# The third job: holds GIB GiB (touched) for a few seconds, then exits 0.
FILL = """
import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print(f"held {sys.argv[1]} GiB", flush=True)
time.sleep(8)
"""


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def gpu_total() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.strip()) << 20


def mps_controls() -> list[str]:
    """The MPS control daemons and servers running (by their program's name, not a shell that names it)."""
    found = subprocess.run(["pgrep", "-af", "nvidia-cuda-mps"], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "nvidia-cuda-mps" in (line.split()[1:2] or [""])[0]]


def scenario(
    work: Path, ballast: float = 16.0, steps: int = 600, facts: dict[str, Any] | None = None, keep: Path | None = None
) -> dict[str, Any]:
    """The run the module's doc describes, in ``work``; its facts and times (into ``facts``, as they come).
    ``keep``: a folder the queue's daemon log, journal and job logs are copied to at the end."""
    home = work / "state"
    script, fill = work / "train.py", work / "fill.py"
    script.write_text(TRAIN)
    fill.write_text(FILL)
    alone = work / "alone"
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    env.pop("CUDA_MPS_PIPE_DIRECTORY", None)
    subprocess.run([sys.executable, str(script), str(alone), str(steps), "1"], env=env, check=True, timeout=600)
    facts = {} if facts is None else facts
    facts.update(ballast_gib=ballast, steps=steps)
    theirs, ours = work / "neighbour", work / "packed"
    submitted: list[int] = []
    try:
        train = [sys.executable, str(script)]
        neighbour = _submit(home, submitted, "--mem", "8G", *train, str(theirs), str(steps), "2")
        job = _submit(home, submitted, "--mem", "24G", "--preemptible", *train, str(ours), str(steps), str(ballast))
        until("both to train", lambda: len(lines(ours)) > 100 and len(lines(theirs)) > 100, 600)
        until("its memory seen", lambda: (show(home, job)["peak_mem"] or 0) >= ballast * GiB, 120)
        facts["gpus"] = gpuq(home, "gpus").stdout  # its FENCE column: mps
        facts["mps_processes"] = mps_controls()
        pid = json.loads((home / "run" / f"{job}.pid").read_text())["pid"]
        facts["held_before"] = gpu_processes().get(pid, 0)
        at = time.time()
        gpuq(home, "suspend", str(job))
        suspended = event_after(home, job, "suspended", at, 300)
        facts["suspend_s"] = round(suspended["t"] - at, 3)  # the command to the job recorded suspended
        facts["suspended_event"] = suspended
        facts["held_suspended"] = gpu_processes().get(pid, 0)  # its context, still on the GPU
        stopped, seen = len(lines(ours)), len(lines(theirs))
        total = gpu_total()
        big = total // GiB - 12  # all but the neighbour's share, the margin and two contexts
        third = _submit(home, submitted, "--mem", f"{big}G", sys.executable, str(fill), str(big - 2))
        until("the third job to run", lambda: show(home, third)["state"] != "pending", 120)
        at = time.time()
        gpuq(home, "resume", str(job))
        waits = lambda: "share to fit" in (r := show(home, job)["reason"] or "") and r  # noqa: E731
        facts["waiting_reason"] = until("its reason", waits)
        # Still suspended, the third job on its share: it made no step, its neighbour many.
        facts["packed_steps_during_suspend"] = len(lines(ours)) - stopped
        facts["neighbour_steps_during_suspend"] = len(lines(theirs)) - seen
        third_end = until("the third job to end", lambda: (s := show(home, third))["state"] in ENDED and s)
        facts["third"] = {"mem_gib": big, "held_gib": big - 2, "state": third_end["state"], "gpu_total": total}
        until("it to run again", lambda: show(home, job)["state"] == "running", 300)
        resuming, resumed = event(home, job, "resuming"), event_after(home, job, "resumed", at, 300)
        facts["resume_s"] = round(resumed["t"] - resuming["t"], 3)  # the pass that began it to it recorded running
        facts["resumed_event"] = resumed
        facts["stopped_at_step"] = stopped
        states = {
            name: until(f"{name} to end", lambda j=j: (s := show(home, j))["state"] in ENDED and s)["state"]
            for name, j in (("packed", job), ("neighbour", neighbour))
        }
        facts["states"] = states
        reference = lines(alone)
        facts["packed_bit_identical"] = lines(ours) == reference
        facts["neighbour_bit_identical"] = lines(theirs) == reference
        facts["losses"] = len(reference)
        facts["shown"] = gpuq(home, "show", str(job)).stdout
    finally:
        cli = [sys.executable, "-m", "gpuq_scheduler.launcher.cli.entry"]
        quiet = {"env": {**os.environ, "GPUQ_HOME": str(home)}, "capture_output": True, "timeout": 120}
        for each in submitted:  # after a failure: nothing of the run is left behind
            subprocess.run([*cli, "cancel", str(each)], **quiet)  # type: ignore[call-overload]
        with contextlib.suppress(Exception):
            until("the jobs to end", lambda: all(show(home, j)["state"] in ENDED for j in submitted), 120)
        subprocess.run([*cli, "daemon", "stop"], **quiet)  # type: ignore[call-overload]
        with contextlib.suppress(TimeoutError):  # a control daemon told to quit takes a moment to go
            until("the MPS control daemons to quit", lambda: not mps_controls(), 20)
        facts["mps_left"] = mps_controls()
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("daemon.log", "events.jsonl"):
                if (home / name).exists():
                    shutil.copy(home / name, keep / name)
            with (keep / "jobs.log").open("w") as out:
                for log in sorted((home / "logs").glob("*.log")):
                    out.write(f"== {log.name}\n{log.read_text(errors='replace')[-4000:]}\n")
    return facts


def _submit(home: Path, submitted: list[int], *args: str) -> int:
    submitted.append(int(json.loads(gpuq(home, "submit", "--json", *args).stdout)["id"]))
    return submitted[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ballast", type=float, default=16.0)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--keep", type=Path, help="copy the queue's daemon log, journal and job logs here")
    args = parser.parse_args()
    facts: dict[str, Any] = {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix="gpuq-inplace-") as work:
            scenario(Path(work), args.ballast, args.steps, facts, args.keep)
    finally:  # what came before a failure is kept too
        facts["when"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        args.out.write_text(json.dumps(facts, indent=1))
    keys = (
        "suspend_s",
        "resume_s",
        "held_before",
        "held_suspended",
        "packed_steps_during_suspend",
        "neighbour_steps_during_suspend",
        "states",
        "packed_bit_identical",
        "neighbour_bit_identical",
        "mps_left",
    )
    for key in keys:
        print(f"{key}: {facts.get(key)}")


if __name__ == "__main__":
    main()
