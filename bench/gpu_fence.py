"""Packing without a guess and without harm, on real GPUs (run by ``gpu_validation.py --fence``):

(a) a liar: a job declaring --mem 4G that allocates 20 GiB, packed beside three honest jobs on one GPU
    whose free memory a teammate's process has cut to 26 GiB; with the fence (MPS) and without it
    (GPUQ_FENCE=none). With it the liar alone dies, at its share; without it, its neighbours may.
(b) an ensemble of 16 small trainers with --mem auto and no other hint, against whole-GPU placement and
    against a hand-given --mem: makespan of each.
(c) four compute-heavy jobs packed on one GPU, as MPS clients and time-sliced (the cooperative fence).
(d) kill -9 of the daemon while packed jobs run under MPS: they are adopted, their outcomes recorded,
    and no MPS control daemon is left once the GPUs are idle.
(e) the personal queue of an ordinary (non-root) user: its daemon starts its own MPS control daemon, and
    a liar there dies at its share too.
Everything runs on GPU 0 (the others are drained), so it proves the same on a machine of any size.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

GiB = 1 << 30
# Allocates GIB GiB in 256 MiB steps over RAMP seconds, then computes for HOLD seconds: a neighbour that is
# still growing when a liar grabs the GPU's memory is the one a liar hurts.
GROWER = r"""
import sys, time, torch
gib, ramp, hold = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
steps = max(1, int(gib * 4))
held = []
for _ in range(steps):
    held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    time.sleep(ramp / steps)
x = torch.randn(2048, 2048, device="cuda")
end = time.time() + hold
while time.time() < end:
    x = (x @ x).clamp_(-1, 1)
torch.cuda.synchronize()
print(f"held {len(held) / 4:.2f} GiB", flush=True)
"""
# Matrix products for SECONDS seconds on a small working set: compute-bound, a few GiB at most.
HEAVY = r"""
import sys, time, torch
n, seconds = 4096, float(sys.argv[1])
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
done, end = 0, time.time() + seconds
while time.time() < end:
    for _ in range(20):
        a = torch.tanh(a @ a)
    torch.cuda.synchronize()
    done += 20
print(f"{done} products", flush=True)
"""


def write_scripts(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    (work / "grower.py").write_text(GROWER)
    (work / "heavy.py").write_text(HEAVY)


def mps_left() -> str:
    """MPS control daemons and servers still running (by process name: a command line may mention them)."""
    # Both are "nvidia-cuda-mps" to pgrep -x: the kernel keeps 15 characters of a process's name.
    return subprocess.run(["pgrep", "-a", "-x", "nvidia-cuda-mps"], capture_output=True, text=True).stdout.strip()


def only_gpu0(gpuq: Any) -> None:
    """Drain every GPU but 0: the checks crowd one GPU on purpose."""
    count = len(json.loads(gpuq("gpus", "--json")))
    if count > 1:
        gpuq("drain", *(str(i) for i in range(1, count)))


def wait_all(gpuq: Any) -> None:
    """`gpuq wait`, which exits non-zero when a job failed: here some are meant to."""
    try:
        gpuq("wait")
    except RuntimeError as err:
        print(f"(expected) {str(err).splitlines()[0]}", flush=True)


def liar(gpuq_factory: Any, work: Path, hold_memory: Any, total_gib: int) -> dict[str, Any]:
    teammate = hold_memory(0, total_gib - 26)  # 26 GiB free on GPU 0: room for 4 x (4G + 1G) and little more
    results: dict[str, Any] = {"free_gib_on_gpu0": 26}
    try:
        for label, fence in (("fenced", "auto"), ("unfenced", "none")):
            gpuq = gpuq_factory(work / f"liar-{label}", GPUQ_FENCE=fence)
            gpuq("daemon", "start")
            only_gpu0(gpuq)  # everything on GPU 0, beside the teammate
            honest = [gpuq.submit("--mem", "4G", "--cwd", str(work), "grower.py", "3", "12", "10") for _ in range(3)]
            time.sleep(1)
            lie = gpuq.submit("--mem", "4G", "--cwd", str(work), "grower.py", "20", "2", "10")
            wait_all(gpuq)
            records = {r["id"]: r for r in gpuq.records()}
            results[label] = {
                "fence": json.loads(gpuq("gpus", "--json"))[0]["fence"],
                "honest": [{k: records[i][k] for k in ("state", "reason", "peak_mem")} for i in honest],
                "liar": {k: records[lie][k] for k in ("state", "reason", "peak_mem")},
            }
            gpuq("daemon", "stop")
            print(f"liar {label}: {json.dumps(results[label])}", flush=True)
    finally:
        teammate.kill()
        teammate.wait()
    fenced = results["fenced"]
    results["passed"] = (
        fenced["fence"] == "mps"
        and all(h["state"] == "succeeded" for h in fenced["honest"])
        and fenced["liar"]["state"] == "failed"
        and "share (--mem 4.0G)" in fenced["liar"]["reason"]
    )
    return results


def ensemble(gpuq_factory: Any, work: Path, jobs: int, epochs: int, settle: float) -> dict[str, Any]:
    """The same array of ``jobs`` trainers four ways: whole GPUs, a hand-given --mem, and --mem auto with the
    default settle time (20 s) and with ``settle``."""
    makespans: dict[str, float] = {}
    notes: dict[str, list[str]] = {}
    # (label, gpuq's options, the daemon's environment, the queue it runs in): "mem_auto_again" is the next
    # night's run of the same sweep in the same queue, which starts from what the first night learned.
    runs: tuple[tuple[str, tuple[str, ...], dict[str, str], str], ...] = (
        ("mem_4G", ("--mem", "4G"), {}, "mem_4G"),
        ("mem_4G_time_sliced", ("--mem", "4G"), {"GPUQ_FENCE": "cooperative"}, "mem_4G_time_sliced"),
        ("mem_auto", ("--mem", "auto"), {}, "mem_auto"),
        ("mem_auto_again", ("--mem", "auto"), {}, "mem_auto"),
        (f"mem_auto_settle_{settle:g}s", ("--mem", "auto"), {"GPUQ_AUTO_SETTLE": str(settle)}, "settle"),
        ("whole_gpu", (), {}, "whole_gpu"),
    )
    for label, extra, env, queue in runs:
        gpuq = gpuq_factory(work / f"ensemble-{queue}", **env)
        gpuq("daemon", "start")
        started = time.time()
        array = gpuq.submit(
            *extra, "--array", f"0-{jobs - 1}", "examples/train_digits.py", "--seed", "{index}", "--epochs", str(epochs)
        )
        try:
            gpuq("wait", "--array", str(array))
        except RuntimeError as err:
            print(f"ensemble {label}: {str(err).splitlines()[0]}", flush=True)
        records = [r for r in gpuq.records() if r.get("array_id") == array]
        makespans[label] = max(r["ended_at"] for r in records) - started
        notes[label] = sorted({r.get("mem_from") or "" for r in records})
        failed = [r["reason"] for r in records if r["state"] != "succeeded"]
        print(f"ensemble {label}: {jobs} jobs in {makespans[label]:.1f}s; failed {failed}; {notes[label]}", flush=True)
        gpuq("daemon", "stop")
    return {
        "jobs": jobs,
        "epochs": epochs,
        "settle_s": settle,
        "makespan_s": makespans,
        "notes": notes,
        "mps_over_time_sliced": round(makespans["mem_4G_time_sliced"] / makespans["mem_4G"], 3),
        "auto_vs_hand": round(makespans["mem_auto"] / makespans["mem_4G"], 3),
        "auto_again_vs_hand": round(makespans["mem_auto_again"] / makespans["mem_4G"], 3),
        "whole_vs_auto_again": round(makespans["whole_gpu"] / makespans["mem_auto_again"], 2),
        "whole_vs_auto": round(makespans["whole_gpu"] / makespans["mem_auto"], 2),
        "auto_settle_vs_hand": round(makespans[f"mem_auto_settle_{settle:g}s"] / makespans["mem_4G"], 3),
        "whole_vs_auto_settle": round(makespans["whole_gpu"] / makespans[f"mem_auto_settle_{settle:g}s"], 2),
    }


def compute_heavy(gpuq_factory: Any, work: Path, jobs: int, seconds: float) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for label, fence in (("mps", "auto"), ("time_sliced", "cooperative")):
        gpuq = gpuq_factory(work / f"heavy-{label}", GPUQ_FENCE=fence)
        gpuq("daemon", "start")
        only_gpu0(gpuq)
        started = time.time()
        ids = [gpuq.submit("--mem", "6G", "--cwd", str(work), "heavy.py", str(seconds)) for _ in range(jobs)]
        wait_all(gpuq)
        records = [r for r in gpuq.records() if r["id"] in ids]
        products = []
        for r in records:
            text = Path(r["log"]).read_text()
            products.append(int(text.split()[-2]) if "products" in text else 0)
        figures[label] = {
            "wall_s": round(max(r["ended_at"] for r in records) - started, 2),
            "products": products,
            "products_per_s": round(sum(products) / seconds, 1),
            "states": [r["state"] for r in records],
        }
        print(f"compute-heavy {label}: {json.dumps(figures[label])}", flush=True)
        gpuq("daemon", "stop")
    figures["mps_over_time_sliced"] = round(
        figures["mps"]["products_per_s"] / max(figures["time_sliced"]["products_per_s"], 1e-9), 2
    )
    return figures


def kill_nine(gpuq_factory: Any, work: Path) -> dict[str, Any]:
    gpuq = gpuq_factory(work / "kill9")
    gpuq("daemon", "start")
    ids = [gpuq.submit("--mem", "4G", "--cwd", str(work), "grower.py", "2", "2", "15") for _ in range(4)]
    deadline = time.time() + 60
    while time.time() < deadline and sum(r["state"] == "running" for r in gpuq.records()) < 4:
        time.sleep(0.5)
    during = mps_left()
    pid = int(json.loads(gpuq("daemon", "status", "--json"))["pid"])
    os.kill(pid, signal.SIGKILL)
    time.sleep(3)
    gpuq("daemon", "start")
    wait_all(gpuq)
    records = [r for r in gpuq.records() if r["id"] in ids]
    time.sleep(3)
    left = mps_left()
    gpuq("daemon", "stop")
    result = {
        "mps_while_running": during,
        "states": [r["state"] for r in records],
        "mps_left_when_idle": left,
        "passed": bool(during) and all(r["state"] == "succeeded" for r in records) and not left,
    }
    print(f"kill -9 under MPS: {json.dumps(result)}", flush=True)
    return result


USER = "gpuqprobe"


def non_root(gpuq_factory: Any, work: Path) -> dict[str, Any]:
    """An ordinary user's personal queue: its daemon (running as that user) starts a private MPS control
    daemon for a packed job, the liar among two honest jobs dies at its share, and nothing is left."""
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-d", f"/tmp/{USER}-home", "-s", "/bin/sh", USER], check=True)
    home = Path(f"/tmp/{USER}-home")
    home.mkdir(exist_ok=True)
    (home / "grower.py").write_text((work / "grower.py").read_text())
    subprocess.run(["chown", "-R", f"{USER}:", str(home)], check=True)
    gpuq = gpuq_factory(home / "queue", user=USER)
    gpuq.cwd, gpuq.env["HOME"] = home, str(home)  # the user may have been made without a home of its own
    uid = int(subprocess.run(["id", "-u", USER], capture_output=True, text=True, check=True).stdout)
    result: dict[str, Any] = {"user": USER, "uid": uid}
    owners = ""
    try:
        gpuq("daemon", "start")
        only_gpu0(gpuq)
        honest = [gpuq.submit("--mem", "4G", "grower.py", "2", "6", "6") for _ in range(2)]
        lie = gpuq.submit("--mem", "2G", "grower.py", "8", "2", "6")
        deadline = time.time() + 60
        while time.time() < deadline and not owners:
            # By uid: ps cuts a user name longer than 8 characters ("gpuqpro+").
            owners = subprocess.run(
                ["ps", "-o", "uid=,comm=", "-C", "nvidia-cuda-mps"], capture_output=True, text=True
            ).stdout.strip()
            time.sleep(0.5)
        wait_all(gpuq)
        records = {r["id"]: r for r in gpuq.records()}
        result.update(
            fence=json.loads(gpuq("gpus", "--json"))[0]["fence"],
            mps_processes_while_running=owners,
            honest=[{k: records[i][k] for k in ("state", "reason", "peak_mem")} for i in honest],
            liar={k: records[lie][k] for k in ("state", "reason", "peak_mem")},
        )
    except RuntimeError as err:
        result["error"] = str(err)[-2000:]
    finally:
        subprocess.run([gpuq.gpuq, "daemon", "stop"], env=gpuq.env, cwd=gpuq.cwd, capture_output=True, **gpuq.as_user)
        time.sleep(2)
    result["mps_left"] = mps_left()
    result["passed"] = (
        result.get("fence") == "mps"
        and bool(owners)
        and all(line.split()[0] == str(uid) for line in owners.splitlines())
        and all(h["state"] == "succeeded" for h in result.get("honest", [{}]))
        and result.get("liar", {}).get("state") == "failed"
        and not result["mps_left"]
    )
    print(f"non-root user's queue: {json.dumps(result)}", flush=True)
    return result
