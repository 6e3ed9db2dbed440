"""Packing across users on a real GPU (run by ``gpu_validation.py --users``, as root on the lent machine):
a shared queue (a root daemon, ``--shared``) and two ordinary users, each with an honest packed job
(3 GiB under --mem 6G) and a liar (10 GiB under --mem 6G), all on GPU 0 (the others drained). Passes when
both users' honest jobs ran on GPU 0 at once and succeeded, both liars were refused past their share
(cause oom-past-share), a control daemon of each user was up at the same time (one per (GPU, user),
started as that user), and no MPS process is left once the daemon has stopped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gpu_fence

USERS = ("gpuqann", "gpuqben")
ROOT = Path(__file__).resolve().parent.parent


def _user(name: str, base: Path) -> int:
    if subprocess.run(["id", name], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-d", str(base / f"{name}-home"), "-s", "/bin/sh", name], check=True)
    home = base / f"{name}-home"
    home.mkdir(exist_ok=True)
    subprocess.run(["chown", f"{name}:", str(home)], check=True)
    return int(subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True).stdout)


def two_users(gpuq_factory: Any, work: Path) -> dict[str, Any]:
    base = Path("/tmp/gpuq-two-users")
    base.mkdir(exist_ok=True)
    base.chmod(0o755)
    script = base / "grower.py"
    script.write_text((work / "grower.py").read_text())
    script.chmod(0o644)
    config = base / "config.toml"
    config.write_text(f'home = "{base / "queue"}"\n[shared]\n')
    config.chmod(0o644)
    uids = {name: _user(name, base) for name in USERS}
    admin = gpuq_factory(base / "queue", GPUQ_SYSTEM_CONFIG=str(config))
    clients = {name: gpuq_factory(base / "queue", user=name, GPUQ_SYSTEM_CONFIG=str(config)) for name in USERS}
    for name, client in clients.items():
        client.cwd, client.env["HOME"] = base / f"{name}-home", str(base / f"{name}-home")
    log = (base / "daemon.out").open("ab")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpuq_scheduler.launcher.daemon", "--shared"],
        env=admin.env,
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    result: dict[str, Any] = {"users": uids}
    seen_together = ""
    try:
        deadline = time.time() + 30
        while not (base / "queue" / "daemon.pid").exists() and time.time() < deadline:
            time.sleep(0.2)
        gpu_fence.only_gpu0(admin)
        jobs: dict[int, tuple[str, str]] = {}
        for name, client in clients.items():
            jobs[client.submit("--mem", "6G", sys.executable, str(script), "3", "6", "12")] = (name, "honest")
            jobs[client.submit("--mem", "6G", sys.executable, str(script), "10", "2", "6")] = (name, "liar")
        deadline = time.time() + 120
        while time.time() < deadline:
            owners = subprocess.run(
                ["ps", "-o", "uid=,comm=", "-C", "nvidia-cuda-mps"], capture_output=True, text=True
            ).stdout.strip()
            if {str(uid) for uid in uids.values()} <= {line.split()[0] for line in owners.splitlines()}:
                seen_together = owners
                break
            time.sleep(0.3)
        gpu_fence.wait_all(admin)
        records = {r["id"]: r for r in admin.records()}
        result["jobs"] = {
            str(job): {
                "user": name,
                "role": role,
                **{
                    k: records[job][k]
                    for k in ("state", "cause", "reason", "peak_mem", "gpus", "started_at", "ended_at")
                },
            }
            for job, (name, role) in jobs.items()
        }
    except RuntimeError as err:
        result["error"] = str(err)[-2000:]
    finally:
        daemon.terminate()
        daemon.wait(60)
        time.sleep(2)
    result["mps_processes_while_running"] = seen_together
    result["mps_left"] = gpu_fence.mps_left()
    runs = list(result.get("jobs", {}).values())
    honest = [r for r in runs if r["role"] == "honest"]
    overlap = (
        len(honest) == 2
        and honest[0]["started_at"] < honest[1]["ended_at"]
        and (honest[1]["started_at"] < honest[0]["ended_at"])
    )
    result["honest_overlapped"] = overlap
    result["passed"] = (
        len(runs) == 4
        and overlap
        and bool(seen_together)
        and not result["mps_left"]
        and all(r["state"] == "succeeded" and r["gpus"] == [0] for r in honest)
        and all(r["state"] == "failed" and r["cause"] == "oom-past-share" for r in runs if r["role"] == "liar")
    )
    print(f"two users on one GPU: {json.dumps(result)}", flush=True)
    return result
