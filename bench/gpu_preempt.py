# One module past 400 lines on purpose: one device run for every preemption scenario, sharing its helpers.
"""Automatic preemption on a lent GPU host (#28, scenarios a, b, d and e), run by the lead:

    .venv/bin/python bench/gpu_preempt.py --out bench/results/gpu_preempt.json [--only a|b|d|e] [--size 16]

(a) A deterministic training run (a small conv net on data generated on the GPU from a seed, AdamW,
    torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8, plus 4 GiB of other GPU state;
    STEPS steps, 0.1 s apart, each loss written as float.hex()), --preemptible on GPU 0 (the others drained).
    Three urgent jobs (--priority 10, a whole GPU, 3 s of matmuls) are submitted one after another, each once
    the previous ended and the trainer resumed and stepped on: it is suspended three times. Then the same run
    alone. Figures: its suspends, each suspend and resume (begun to done, and the helper's steps), the urgent
    jobs' waits. The check: the two loss files identical, bit for bit (and its ballast intact).

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

(e) kill -9 of the daemon in the middle of a suspend: a --preemptible job of SIZE GiB on GPU 0 (the others
    drained) and an urgent job that preempts it. Once the suspend's helper started (named in the job's pause
    file), the daemon is killed; 2 s later it starts again. Figures: kill to the victim's suspend settled in
    the journal, and to the victim stable (no step under way). Checks: the victim never suspended, or
    suspended and resumed; never lost or started twice, its tensor intact and its count whole; the urgent
    job succeeded; GPU 0 never held by both at once (per the journal); no process of the queue left.

Each runs a private queue on the real GPUs with GPUQ_PREEMPT=on and a 1 s minimum runtime.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu_suspend import counts as numbers  # noqa: E402  (the suspend bench's helpers, one copy)
from bench.gpu_suspend import until  # noqa: E402

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

# The victim of (a): a deterministic training run (a small conv net, AdamW, data generated on the GPU from a
# seed), with BALLAST GiB of other GPU state checked at the end. Each step's loss goes to LOSSES as
# float.hex(); PACE seconds of sleep between steps (no effect on the numbers) keep it running long enough to
# be preempted three times. Exits 1 if its ballast was changed.
DETERMINISTIC = """
import os, sys, time
os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
import torch
from torch import nn
steps, losses, ballast_gib, pace = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.benchmark = False
torch.manual_seed(0)
ballast = torch.full((int(ballast_gib * 2**30) // 4,), 3.0, device="cuda")
data = torch.Generator(device="cuda").manual_seed(1)
inputs = torch.randn(8192, 3, 32, 32, generator=data, device="cuda")
labels = torch.randint(0, 10, (8192,), generator=data, device="cuda")
model = nn.Sequential(
    nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
    nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(2),
).cuda()
head = nn.Linear(128, 10).cuda()
params = [*model.parameters(), *head.parameters()]
optimizer = torch.optim.AdamW(params, lr=1e-3)
batch = 256
with open(losses, "w") as out:
    for step in range(steps):
        at = (step * batch) % inputs.shape[0]
        logits = head(model(inputs[at : at + batch]).mean(dim=2))  # mean, not adaptive pooling: deterministic
        loss = nn.functional.cross_entropy(logits, labels[at : at + batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        out.write(float(loss.item()).hex() + "\\n")
        out.flush()
        time.sleep(pace)
intact = bool(ballast.eq(3.0).all().item())
print("INTACT" if intact else "CORRUPT", flush=True)
sys.exit(0 if intact else 1)
"""


class Queue:
    def __init__(self, home: Path, **extra: str) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
        self.env.update(GPUQ_HOME=str(home), PYTHONPATH=str(ROOT), GPUQ_PREEMPT="on", GPUQ_PREEMPT_MIN_RUNTIME="1s")
        self.env.update(extra)

    def __call__(self, *args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "gpuq_scheduler.launcher.cli.entry", *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        ).stdout

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


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    return len([line for line in out.splitlines() if line.startswith("GPU ")])


def urgent_takes_a_gpu(work: Path, size: float, rounds: int = 1, pool: bool = False) -> dict[str, Any]:
    """(b): every GPU held by a preemptible job; an urgent one's wait against its victim's checkpoint, ``rounds``
    times over (each once the victim resumed and counted on; with ``pool``, GPUQ_FAST_POOL=on: the victim keeps
    its pinned host memory, so every suspend after its first copies at the link's speed)."""
    queue = Queue(work / "queue-b", **({"GPUQ_FAST_POOL": "on"} if pool else {}))
    (work / "holder.py").write_text(HOLDER)
    (work / "urgent.py").write_text(URGENT)
    holders = []
    for n in range(gpu_count()):
        counts, stop = work / f"counts-{n}", work / f"stop-{n}"
        job = queue.submit(
            "--preemptible", "--gpus", "1", sys.executable, str(work / "holder.py"), str(size), str(counts), str(stop)
        )
        holders.append((job, counts, stop))
    for job, counts, _ in holders:
        seen = lambda job=job, counts=counts: len(numbers(counts)) > 5 and queue.show(job)["peak_mem"]  # noqa: E731
        until(f"job {job} to count", seen)
    result: dict[str, Any] = {"size_gib": size, "gpus": len(holders), "pool": pool, "rounds": []}
    went_on, victims = True, set()
    for _ in range(rounds):
        time.sleep(1.5)  # past the queue's minimum runtime of 1 s
        submitted = time.time()
        urgent = queue.submit("--priority", "10", "--gpus", "1", sys.executable, str(work / "urgent.py"), "4", "5")
        until("the urgent job to end", lambda u=urgent: queue.show(u)["state"] not in ("pending", "running"))
        ended = queue.show(urgent)
        preempted = [e for e in queue.events() if e.get("event") == "preempted" and e.get("for") == urgent]
        if not preempted:
            result["problem"] = "no job was preempted"
            break
        victim = preempted[0]["job"]
        victims.add(victim)
        counts = next(c for j, c, _ in holders if j == victim)
        suspended = queue.first(victim, "suspended", submitted)
        stopped = numbers(counts)
        until("the victim to resume", lambda v=victim, t=submitted: queue.first(v, "resumed", t))
        resumed_event = queue.first(victim, "resumed", submitted)
        resuming = queue.first(victim, "resuming", submitted)
        at = len(stopped)
        until("the victim to count on", lambda c=counts, n=at: len(numbers(c)) > n + 5)
        went_on = went_on and numbers(counts)[: len(stopped) + 5] == list(range(1, len(stopped) + 6))
        wait = ended["started_at"] - ended["submitted_at"]
        steps = suspended.get("steps") or {}
        suspend_s = suspended["t"] - preempted[0]["t"]
        result["rounds"].append(
            {
                "urgent": urgent,
                "urgent_outcome": ended["state"],
                "victim": victim,
                "urgent_wait_s": round(wait, 3),
                "victim_helper_steps_s": steps,
                "victim_suspend_s": round(suspend_s, 3),
                "victim_bytes": suspended.get("bytes"),
                "path": suspended.get("path"),
                "fallback": suspended.get("fallback"),
                "detail": suspended.get("detail"),
                "fast_bytes": suspended.get("fast_bytes"),
                "fast_seconds": suspended.get("fast_seconds"),
                "resume_helper_steps_s": resumed_event.get("steps"),
                "resume_s": round(resumed_event["t"] - resuming["t"], 3) if resuming else None,
                "wait_within_15s": wait <= 15.0,
                "resumed_after_urgent_ended": bool(resuming) and resuming["t"] >= (ended["ended_at"] or 0.0),
            }
        )
        print(json.dumps(result["rounds"][-1]), flush=True)
    for _, _, stop in holders:
        stop.touch()
    outcomes = {}
    for j, _, _ in holders:
        state = lambda j=j: (s := queue.show(j)["state"]) not in ("running", "suspended") and s  # noqa: E731
        outcomes[j] = until(f"job {j} to end", state)
    queue("daemon", "stop")
    result.update(
        {
            "counted_on_from_where_it_stopped": went_on,
            "others_never_suspended": all(not queue.first(j, "suspended") for j, _, _ in holders if j not in victims),
            "outcomes": outcomes,
            "all_intact": all(s == "succeeded" for s in outcomes.values()),
        }
    )
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
    victim = queue.submit(
        "--preemptible",
        "--mem",
        f"{gib + 4:g}G",
        sys.executable,
        str(work / "trainer.py"),
        str(gib),
        str(steps_file),
        str(steps),
    )
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
    signalled = (
        [float(v) for v in steps_file.with_suffix(".signalled").read_text().split()]
        if steps_file.with_suffix(".signalled").exists()
        else []
    )
    requeued = queue.first(victim, "requeued")
    seen = numbers(steps_file)
    starts = steps_file.with_suffix(".starts").read_text().splitlines()
    return {
        "fence": fence,
        "victim_gib": gib,
        "urgent_outcome": ended["state"],
        "urgent_wait_s": round(ended["started_at"] - ended["submitted_at"], 3),
        "why_not_suspended": preempted.get("requeue"),
        "preempted_event": preempted,
        "signal_to_exit_s": round(requeued["t"] - signalled[0], 3) if signalled and requeued else None,
        "requeued_reason": requeued.get("reason"),
        "starts": starts,
        "restarted_with_preempted_and_count_1": len(starts) == 2 and starts[1].startswith("1 1 "),
        "steps_whole": seen == list(range(1, steps + 1)),
        "victim_outcome": done["state"],
        "attempt": done["attempt"],
    }


def only_gpu_zero(queue: Queue) -> None:
    """Start the queue's daemon and drain every GPU but 0: the victim and the urgent jobs meet there."""
    count = gpu_count()
    queue("status")
    if count > 1:
        queue("drain", *(str(i) for i in range(1, count)))


def until_ended(queue: Queue, job: int, what: str, *live: str, timeout: float = 600.0) -> dict[str, Any]:
    """The job once its state is none of ``live`` (by default: it ended)."""
    live = live or ("pending", "running", "suspended")
    return dict(until(what, lambda: (s := queue.show(job))["state"] not in live and s, timeout))


def resumed(queue: Queue, job: int) -> bool:
    """Running, and no suspend or resume under way."""
    shown = queue.show(job)
    return bool(shown["state"] == "running" and shown["step"] is None)


def gone(queue: Queue, job: int) -> bool:
    return queue.show(job)["state"] not in ("pending", "running", "suspended")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def cycles(queue: Queue, job: int) -> list[dict[str, Any]]:
    """Each suspend and resume of the job from the journal: seconds from begun (preempted, or ``gpuq suspend``;
    a resume begun) to done, and the helper's steps. A suspend undone is not counted."""
    found: list[dict[str, Any]] = []
    begun: dict[str, float] = {}
    done = {"suspended": "suspend", "resumed": "resume"}
    for event in (e for e in queue.events() if e.get("job") == job):
        kind = event.get("event")
        if kind in ("preempted", "suspending") and not event.get("requeue"):
            begun["suspend"] = float(event["t"])
        elif kind == "resuming":
            begun["resume"] = float(event["t"])
        elif kind == "suspend-undone":
            begun.pop("suspend", None)
        elif kind in done and done[kind] in begun:
            what = done[kind]
            start = begun.pop(what)
            found.append(
                {"what": what, "t": start, "s": round(float(event["t"]) - start, 3), "steps": event.get("steps")}
            )
    return found


def training_is_bit_identical(work: Path, steps: int, ballast: float, pace: float) -> dict[str, Any]:
    """(a): a deterministic training run suspended three times for urgent jobs, against the same run alone."""
    queue = Queue(work / "queue-a")
    (work / "deterministic.py").write_text(DETERMINISTIC)
    (work / "urgent.py").write_text(URGENT)
    only_gpu_zero(queue)
    script = [sys.executable, str(work / "deterministic.py"), str(steps)]
    interrupted = work / "losses-interrupted"
    trainer = queue.submit("--preemptible", "--gpus", "1", *script, str(interrupted), str(ballast), str(pace))
    until("the trainer to step", lambda: len(lines(interrupted)) > 20 and queue.show(trainer)["peak_mem"])
    urgent: list[dict[str, Any]] = []
    for n in range(3):
        since, seen = time.monotonic(), len(lines(interrupted))

        def stepped_on(since: float = since, seen: int = seen) -> bool:  # past the minimum runtime of 1 s, and on
            return (time.monotonic() - since > 1.5 and len(lines(interrupted)) > seen + 10) or gone(queue, trainer)

        until(f"the trainer to step on ({n})", stepped_on)
        if queue.show(trainer)["state"] != "running":
            break
        job = queue.submit("--priority", "10", "--gpus", "1", sys.executable, str(work / "urgent.py"), "4", "3")
        done = until_ended(queue, job, f"urgent job {job} to end")
        urgent.append(
            {"job": job, "outcome": done["state"], "wait_s": round(done["started_at"] - done["submitted_at"], 3)}
        )
        until(f"the trainer to resume ({n})", lambda: resumed(queue, trainer) or gone(queue, trainer))
    first = until_ended(queue, trainer, "the trainer to end")
    alone = work / "losses-alone"
    again = queue.submit("--preemptible", "--gpus", "1", *script, str(alone), str(ballast), str(pace))
    second = until_ended(queue, again, "the second run to end")
    moves = cycles(queue, trainer)
    queue("daemon", "stop")
    a, b = lines(interrupted), lines(alone)
    differs = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return {
        "steps": steps,
        "ballast_gib": ballast,
        "pace_s": pace,
        "urgent": urgent,
        "suspends": sum(1 for m in moves if m["what"] == "suspend"),
        "moves": moves,
        "suspend_s": [m["s"] for m in moves if m["what"] == "suspend"],
        "resume_s": [m["s"] for m in moves if m["what"] == "resume"],
        "interrupted_outcome": first["state"],
        "alone_outcome": second["state"],
        "suspended_for_s": round(float(first.get("suspended_for") or 0.0), 3),
        "losses": [len(a), len(b)],
        "first_loss": a[0] if a else None,
        "last_loss": a[-1] if a else None,
        "first_differing_step": differs,
        "bit_identical": len(a) == steps and interrupted.read_bytes() == alone.read_bytes(),
    }


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def leftovers(home: Path) -> list[str]:
    """Processes of ours (a shim, a job, a suspender, an MPS daemon) still running with this queue's state dir."""
    marker = f"GPUQ_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name} {command[:120]}")
        except OSError:
            continue
    return found


def occupied(queue: Queue, job: int, ended_at: float) -> list[tuple[float, float]]:
    """When the job held its GPU, per the journal: from its start or a resume begun, to a suspend done or its end."""
    spans: list[tuple[float, float]] = []
    held_from: float | None = None
    for event in (e for e in queue.events() if e.get("job") == job):
        if event.get("event") in ("started", "resuming") and held_from is None:
            held_from = float(event["t"])
        elif event.get("event") == "suspended" and held_from is not None:
            spans.append((held_from, float(event["t"])))
            held_from = None
    if held_from is not None:
        spans.append((held_from, ended_at))
    return spans


def daemon_killed_mid_suspend(work: Path, size: float) -> dict[str, Any]:
    """(e): kill -9 of the daemon while its helper checkpoints a preempted job; the next daemon sorts it out."""
    queue = Queue(work / "queue-e")
    (work / "holder.py").write_text(HOLDER)
    (work / "urgent.py").write_text(URGENT)
    only_gpu_zero(queue)
    counts, stop = work / "counts-e", work / "stop-e"
    victim = queue.submit(
        "--preemptible", "--gpus", "1", sys.executable, str(work / "holder.py"), str(size), str(counts), str(stop)
    )
    until("the victim to count", lambda: len(numbers(counts)) > 5 and queue.show(victim)["peak_mem"])
    daemon = int(json.loads(queue("daemon", "status", "--json"))["pid"])
    time.sleep(1.5)  # past the queue's minimum runtime of 1 s
    urgent = queue.submit("--priority", "10", "--gpus", "1", sys.executable, str(work / "urgent.py"), "4", "5")
    pause = queue.home / "run" / f"{victim}.paused"

    def helper() -> list[int]:  # the suspend's helper, once started (see suspending._begin)
        try:
            child = json.loads(pause.read_text()).get("child")
        except (OSError, ValueError):
            return []
        return [int(child[0])] if isinstance(child, list) and child else []

    (child,) = until("the suspend to begin", helper, timeout=120)
    os.kill(daemon, signal.SIGKILL)
    killed = time.time()
    helper_alive_at_kill = alive(child)
    until("the daemon to die", lambda: not alive(daemon), timeout=30)
    time.sleep(2)
    queue("daemon", "start")
    restarted = time.time()
    stable = until(
        "the victim to be stable",
        lambda: (s := queue.show(victim))["step"] is None and s["state"] in ("running", "suspended") and s,
    )
    stable_at = time.time()
    try:
        finished = until_ended(queue, urgent, "the urgent job to end", timeout=180)
        urgent_waited_for_victim_end = False
    except TimeoutError:  # never preempted again: let the victim end so the urgent job can run
        urgent_waited_for_victim_end = True
        stop.touch()
        finished = until_ended(queue, urgent, "the urgent job to end")
    if not urgent_waited_for_victim_end:
        until("the victim to run again", lambda: resumed(queue, victim) or gone(queue, victim))
        seen = len(numbers(counts))
        until("the victim to count on", lambda: len(numbers(counts)) > seen + 5)
        stop.touch()
    done = until_ended(queue, victim, "the victim to end")
    events = [e for e in queue.events() if e.get("job") == victim]
    spans = occupied(queue, victim, float(done["ended_at"] or time.time()))
    urgent_span = (float(finished["started_at"] or 0.0), float(finished["ended_at"] or 0.0))
    queue("daemon", "stop")
    with contextlib.suppress(TimeoutError):
        until("no process of the queue left", lambda: not leftovers(queue.home), timeout=30)
    left = leftovers(queue.home)
    settles = ("suspend-undone", "suspended", "resumed")
    settled = next((e for e in events if e["t"] >= killed and e["event"] in settles), {})
    kinds = [e["event"] for e in events]
    suspends, resumes = kinds.count("suspended"), kinds.count("resumed")
    return {
        "victim_gib": size,
        "helper_alive_at_kill": helper_alive_at_kill,
        "kill_to_stable_s": round(stable_at - killed, 3),
        "restart_to_stable_s": round(stable_at - restarted, 3),
        "stable_state": stable["state"],
        "victim_events": kinds,
        "settled_event": settled.get("event"),
        "kill_to_settled_s": round(settled["t"] - killed, 3) if settled else None,
        "victim_path": "never suspended"
        if suspends == 0
        else "suspended then resumed"
        if suspends == resumes
        else "suspended, not resumed",
        "victim_outcome": done["state"],
        "victim_attempt": done["attempt"],
        "victim_started_once": kinds.count("started") == 1,
        "victim_intact": done["state"] == "succeeded",  # HOLDER exits 0 only when its tensor is intact
        "counts_whole": numbers(counts) == list(range(1, len(numbers(counts)) + 1)),
        "urgent_outcome": finished["state"],
        "urgent_wait_s": round(urgent_span[0] - float(finished["submitted_at"]), 3),
        "urgent_waited_for_victim_end": urgent_waited_for_victim_end,
        "gpu_never_double_booked": all(end <= urgent_span[0] or start >= urgent_span[1] for start, end in spans),
        "victim_spans": spans,
        "urgent_span": urgent_span,
        "processes_left": left,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", choices=("a", "b", "d", "e"))
    parser.add_argument("--size", type=float, default=16.0, help="GiB each victim of (b) and (e) holds")
    parser.add_argument("--steps", type=int, default=400, help="training steps of (a)")
    parser.add_argument("--rounds", type=int, default=1, help="urgent jobs of (b), one after another")
    parser.add_argument("--pool", action="store_true", help="(b) with GPUQ_FAST_POOL=on")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    with tempfile.TemporaryDirectory(prefix="gpuq-preempt-") as tmp:
        work = Path(tmp)
        if args.only in (None, "a"):
            results["a_training_bit_identical"] = training_is_bit_identical(work, args.steps, 4.0, 0.1)
            print(json.dumps(results["a_training_bit_identical"]), flush=True)
        if args.only in (None, "b"):
            results["b_urgent_takes_a_gpu"] = urgent_takes_a_gpu(work, args.size, args.rounds, args.pool)
            print(json.dumps(results["b_urgent_takes_a_gpu"]), flush=True)
        if args.only in (None, "d"):
            results["d_mps_job_requeued"] = mps_job_is_requeued(work, 8.0, 600)
            print(json.dumps(results["d_mps_job_requeued"]), flush=True)
        if args.only in (None, "e"):
            results["e_daemon_killed_mid_suspend"] = daemon_killed_mid_suspend(work, args.size)
            print(json.dumps(results["e_daemon_killed_mid_suspend"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
