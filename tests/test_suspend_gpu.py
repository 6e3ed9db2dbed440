"""Suspend and resume on a lent GPU host (real driver, real PyTorch), run by the lead:

    .venv/bin/python -m pytest -q -m gpu tests/test_suspend_gpu.py

A PyTorch job holding 4 GiB is suspended through gpuq: the GPU no longer lists it (its memory is in host
memory), its count on the GPU stops; resumed, it counts on from where it stopped, and its tensor is intact.
Skipped where no NVIDIA driver is found. bench/gpu_suspend.py measures the times and GB/s.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.gpu_suspend import JOB, counts, gpu_processes
from tests.conftest import Gpuq, make_env, wait_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU and driver"),
]


@pytest.fixture
def real(tmp_path: Path) -> Iterator[Gpuq]:
    home, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    client = Gpuq(home, make_env(home, fake=None), work)
    yield client
    client.cleanup()


def test_a_suspended_torch_job_leaves_its_gpu_and_comes_back_intact(real: Gpuq) -> None:
    script, count_file, stop = real.cwd / "job.py", real.cwd / "counts", real.cwd / "stop"
    script.write_text(JOB)
    job = real.submit("--gpus", "1", sys.executable, str(script), "4", str(count_file), str(stop))
    # Until a sample saw its 4 GiB (the daemon's figure for what a suspend moves to host memory): a sample
    # taken while it started (14 MB on a lent H200) and none since would leave the check below racing it.
    wait_for(
        lambda: len(counts(count_file)) > 5 and (real.job(job)["peak_mem"] or 0) >= 4 << 30, 120, "the job to count"
    )
    pid = json.loads((real.home / "run" / f"{job}.pid").read_text())["pid"]
    assert gpu_processes().get(pid, 0) >= 4 << 30
    real.run("suspend", str(job))
    real.wait_state(job, "suspended", timeout=120)
    assert pid not in gpu_processes()  # the GPU holds nothing of it
    assert real.job(job)["host_bytes"] >= 4 << 30
    stopped = counts(count_file)
    real.run("resume", str(job))
    real.wait_state(job, "running", timeout=120)
    wait_for(lambda: len(counts(count_file)) > len(stopped) + 5, 60, "the job to count on")
    assert counts(count_file)[: len(stopped) + 5] == list(range(1, len(stopped) + 6))
    assert gpu_processes().get(pid, 0) >= 4 << 30
    stop.touch()
    assert real.wait_state(job, "succeeded", "failed", timeout=120)["state"] == "succeeded"  # INTACT
    # NVML gave the daemon a thread, so its helpers came from its Forker, which goes with the daemon.
    resumed = [e for e in _events(real) if e.get("job") == job and e.get("event") == "resumed"]
    assert resumed[0]["helper"]["began"] - resumed[0]["helper"]["spawned"] < 0.05  # a fork, not a fresh interpreter
    # The spare forked after the suspend had the driver open when the resume came (forker.Spare).
    assert resumed[0]["steps"]["open"] == 0.0
    forkers, spares = _named("gpuq-forker"), _named("gpuq-suspender")
    assert forkers and spares
    real.run("daemon", "stop")
    wait_for(lambda: not (_named("gpuq-forker") & forkers), 10, "the Forker to go with its daemon")
    wait_for(lambda: not (_named("gpuq-suspender") & spares), 10, "its spare to go with it")


def test_a_suspend_whose_copy_would_not_fit_under_the_jobs_ram_is_refused_and_the_job_runs_on(real: Gpuq) -> None:
    """#40: the copy of a job's GPU state is charged to its cgroup, the driver's checkpoint's too (measured:
    the kernel killed such a job, bench/cgroup_checkpoint_probe.py). A job of 4 GiB on its GPU with --ram 3G
    is not suspended: its reason says why, and it counts on to a clean end, intact."""
    script, count_file, stop = real.cwd / "job.py", real.cwd / "counts", real.cwd / "stop"
    script.write_text(JOB)
    real.wait_state(real.submit("--gpus", "0", "true"), "succeeded")  # the daemon records whether --ram holds
    job = real.submit(
        "--preemptible", "--ram", "3G", "--gpus", "1", sys.executable, str(script), "4", str(count_file), str(stop)
    )
    wait_for(
        lambda: len(counts(count_file)) > 5 and (real.job(job)["peak_mem"] or 0) >= 4 << 30, 120, "the job to count"
    )
    real.run("suspend", str(job))
    reason = wait_for(lambda: "not suspended" in (found := real.job(job)["reason"] or "") and found, 60, "refused")
    assert "left under its --ram" in reason and real.job(job)["state"] == "running"
    at = len(counts(count_file))
    wait_for(lambda: len(counts(count_file)) > at + 5, 60, "the job to count on")
    stop.touch()
    assert real.wait_state(job, "succeeded", "failed", timeout=120)["state"] == "succeeded"  # INTACT


# A --preemptible job of SIZE GiB that replays a CUDA graph at each count (its addresses must survive) and
# empties PyTorch's cache now and then (which the fast path's restore must not break).
GRAPH_JOB = """
import sys, time, torch
from pathlib import Path
size, counts, stop = float(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
row = 1 << 20
pattern = torch.arange(row, device="cuda", dtype=torch.int32).remainder(251).to(torch.uint8)
x = torch.empty((int(size * 1024), row), dtype=torch.uint8, device="cuda")
x.copy_(pattern.expand_as(x))
static = torch.zeros(1 << 20, device="cuda")
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    out = static * 2 + 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = static * 2 + 1
torch.cuda.synchronize()
count, good = 0, True
with counts.open("a") as log:
    while not stop.exists():
        count += 1
        static.fill_(count)
        graph.replay()
        good = good and bool(out.eq(2 * count + 1).all().item())
        if count % 20 == 0:
            torch.cuda.empty_cache()
        log.write(f"{count}\\n")
        log.flush()
        time.sleep(0.05)
intact = all(bool(x[at : at + 1024].eq(pattern).all().item()) for at in range(0, x.shape[0], 1024))
print("INTACT" if intact and good else f"CORRUPT intact={intact} graph={good}", flush=True)
sys.exit(0 if intact and good else 1)
"""


def test_a_preemptible_torch_job_takes_the_fast_path_keeps_its_graph_and_outlives_a_daemon_killed_meanwhile(
    real: Gpuq,
) -> None:
    """#40: its pages copied out by the job itself, its context alone left on its GPU, frozen (no driver's
    checkpoint); a daemon killed with kill -9 while it is suspended; the next daemon resumes it, and its
    tensor, its CUDA graph and its counting are as they were."""
    script, count_file, stop = real.cwd / "job.py", real.cwd / "counts", real.cwd / "stop"
    script.write_text(GRAPH_JOB)
    size = 16
    job = real.submit(
        "--preemptible", "--gpus", "1", sys.executable, str(script), str(size), str(count_file), str(stop)
    )
    wait_for(
        lambda: len(counts(count_file)) > 25 and (real.job(job)["peak_mem"] or 0) >= size << 30, 180, "the job to count"
    )
    pid = json.loads((real.home / "run" / f"{job}.pid").read_text())["pid"]
    real.run("suspend", str(job))
    real.wait_state(job, "suspended", timeout=300)
    suspended = [e for e in _events(real) if e.get("job") == job and e.get("event") == "suspended"][-1]
    assert (suspended["path"], suspended["fallback"]) == ("fast-context-kept", None), suspended
    assert suspended["fast_bytes"] >= size << 30
    assert 0 < gpu_processes().get(pid, 0) <= 1 << 30  # its context alone, kept on its GPU
    stopped = counts(count_file)
    real.kill_daemon()
    real.run("daemon", "start")
    real.run("resume", str(job))
    real.wait_state(job, "running", timeout=300)
    wait_for(lambda: len(counts(count_file)) > len(stopped) + 25, 120, "the job to count on")
    assert counts(count_file)[: len(stopped) + 25] == list(range(1, len(stopped) + 26))
    assert gpu_processes().get(pid, 0) >= size << 30
    stop.touch()
    assert real.wait_state(job, "succeeded", "failed", timeout=300)["state"] == "succeeded"  # INTACT, graph right


# A deterministic training run (--preemptible): an MLP on data generated on the GPU from each step's seed,
# AdamW, deterministic algorithms, 4 bytes x BALLAST GiB of other state; its loss at each step written as
# float.hex(). MODE: eager; compiled (torch.compile, mode="reduce-overhead": CUDA graphs through cudagraph
# trees, their own memory pool); graphed (the whole step, optimizer included, captured in one CUDA graph and
# replayed, as PyTorch's docs show). Exit 0 if its ballast is intact at the end.
TRAIN = """
import os, sys, time
os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
import torch
mode, losses, steps, ballast_gib = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
ballast = torch.full((int(ballast_gib * 2**28),), 7, dtype=torch.int32, device="cuda")
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024), torch.nn.GELU(),
                            torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=mode == "graphed")
forward = torch.compile(model, mode="reduce-overhead") if mode == "compiled" else model
def batch(step):
    g = torch.Generator(device="cuda").manual_seed(step)
    return torch.randn(256, 512, generator=g, device="cuda"), torch.randint(0, 10, (256,), generator=g, device="cuda")
def train(x, y):
    opt.zero_grad(set_to_none=mode != "graphed")
    loss = torch.nn.functional.cross_entropy(forward(x), y)
    loss.backward()
    opt.step()
    return loss
if mode == "graphed":
    sx, sy = batch(-1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            train(sx, sy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = train(sx, sy)
with open(losses, "a") as out:
    for step in range(steps):
        x, y = batch(step)
        if mode == "graphed":
            sx.copy_(x); sy.copy_(y); graph.replay(); loss = static_loss
        else:
            loss = train(x, y)
        out.write(loss.item().hex() + "\\n")
        out.flush()
        time.sleep(0.02)
intact = bool(ballast.eq(7).all().item())
print("INTACT" if intact else "CORRUPT", flush=True)
sys.exit(0 if intact else 1)
"""


@pytest.mark.parametrize("mode", ["eager", "graphed", "compiled"])
def test_a_training_run_suspended_on_the_fast_path_then_resumed_by_a_daemon_restarted_after_kill_9_is_bit_identical(
    real: Gpuq, mode: str
) -> None:
    """#40: the same deterministic run alone, then through gpuq: suspended at a step past 60 on the fast path
    (with torch.compile's CUDA graphs, or the whole step in one CUDA graph: their pools moved too), the daemon
    killed with kill -9 while it is suspended, the next daemon resumes it. Every loss is the same, bit for bit,
    and its other state is intact."""
    import os
    import subprocess

    script, alone, queued = real.cwd / "train.py", real.cwd / "alone", real.cwd / "queued"
    script.write_text(TRAIN)
    steps, ballast = "300", "4"
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    done = subprocess.run([sys.executable, str(script), mode, str(alone), steps, ballast], env=env, timeout=600)
    assert done.returncode == 0
    job = real.submit("--preemptible", "--gpus", "1", sys.executable, str(script), mode, str(queued), steps, ballast)
    wait_for(lambda: len(_lines(queued)) > 60 and (real.job(job)["peak_mem"] or 0) >= 4 << 30, 600, "the run to train")
    real.run("suspend", str(job))
    real.wait_state(job, "suspended", timeout=300)
    suspended = [e for e in _events(real) if e.get("job") == job and e.get("event") == "suspended"][-1]
    # a whole GPU, nothing else on it: its context alone is left, kept there (no driver's checkpoint)
    assert (suspended["path"], suspended["fallback"]) == ("fast-context-kept", None), suspended
    stopped = _lines(queued)
    real.kill_daemon()
    real.run("daemon", "start")
    assert real.job(job)["state"] == "suspended" and _lines(queued) == stopped
    real.run("resume", str(job))
    assert real.wait_state(job, "succeeded", "failed", timeout=600)["state"] == "succeeded"  # INTACT
    assert len(stopped) < int(steps) and _lines(queued) == _lines(alone)


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _events(queue: Gpuq) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (queue.home / "events.jsonl").read_text().splitlines() if line.strip()]


def _named(name: str) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == name:
                found.add(int(entry.name))
        except OSError:
            continue
    return found
