"""`gpuq top` and `gpuq serve` on real GPUs, their figures against nvidia-smi's (run on a lent GPU machine):

    python bench/gpu_live.py --out DIR

A process outside gpuq holds 10 GiB of GPU 0; two packed gpuq jobs hold 4 and 6 GiB there and keep it busy.
Then, at the same moment: `gpuq top` in tmux at 80x24 (its screen is saved), `gpuq serve`'s /api/gpus and
/metrics, and nvidia-smi's per-GPU and per-process figures. Checks: the memory gpuq says its jobs use and
what it says outside processes use equal nvidia-smi's per-process figures for those pids, and top's screen
shows the same figures and a utilisation nvidia-smi also reports as non-zero. gpuq counts the MPS server of
its fence with its jobs (it holds memory for them), so that is what it is compared with. Writes DIR/gpu_live.json
and DIR/top-screen.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_validation import GiB, Gpuq, hold_memory, job_of

BUSY = r"""
import sys, time, torch
held = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
x = torch.randn(4096, 4096, device="cuda")
end = time.time() + float(sys.argv[2])
while time.time() < end:
    x = torch.tanh(x @ x)
    torch.cuda.synchronize()
"""


NO_UTIL = r"^ \d+ +\S+ +busy\.py +0 +\S+ +\S+ +- "  # a job row of top's whose UTIL is "-"


def smi(*query: str) -> list[list[str]]:
    done = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True)
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.strip().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    work = Path(tempfile.mkdtemp(prefix="gpuq-live-"))
    (work / "busy.py").write_text(BUSY)
    gpuq = Gpuq(work / "queue")
    outside = hold_memory(0, 10)
    server = None
    try:
        gpuq("daemon", "start")
        count = len(json.loads(gpuq("gpus", "--json")))
        if count > 1:
            gpuq("drain", *(str(i) for i in range(1, count)))  # everything on GPU 0, beside the outsider
        shares = (("6G", "4"), ("8G", "6"))  # --mem, and the GiB each job holds
        jobs = [gpuq.submit("--mem", mem, "--cwd", str(work), "busy.py", gib, "120") for mem, gib in shares]
        server = subprocess.Popen([gpuq.gpuq, "serve", "--port", "0"], env=gpuq.env, stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        url = server.stdout.readline().split()[1]

        def api(path: str) -> str:
            with urllib.request.urlopen(url + path, timeout=30) as answer:
                return str(answer.read().decode())

        deadline = time.time() + 120
        while time.time() < deadline:  # both jobs have allocated and NVML has been read since
            gpus = json.loads(api("api/gpus"))
            if gpus[0]["used_by_gpuq_jobs"] >= 10 * GiB:
                break
            time.sleep(1)
        time.sleep(3)  # the kernels run: utilisation has a sample period to show it
        screen = ""
        if shutil.which("tmux"):
            sock = work / "tmux.sock"
            env = {**gpuq.env, "TERM": "xterm-256color"}
            subprocess.run(
                ["tmux", "-S", str(sock), "new-session", "-d", "-x", "80", "-y", "24", f"{gpuq.gpuq} top; sleep 60"],
                env=env,
                check=True,
            )
            time.sleep(4)
            screen = subprocess.run(
                ["tmux", "-S", str(sock), "capture-pane", "-p"], capture_output=True, text=True
            ).stdout
            subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True)
        gpus, metrics = json.loads(api("api/gpus")), api("metrics")
        per_gpu = smi("--query-gpu=index,memory.used,memory.total,utilization.gpu")
        apps = smi("--query-compute-apps=pid,used_memory")
        owners: dict[int, int | None] = {}
        job_pids = {int(pid): int(mib) for pid, mib in apps if job_of(int(pid), owners) in jobs}
        servers = {int(pid): int(mib) for pid, mib in apps if _command(int(pid)) == "nvidia-cuda-mps-server"}
        smi_jobs = (sum(job_pids.values()) + sum(servers.values())) << 20  # gpuq counts its fence's server as its own
        smi_outside = sum(int(mib) for pid, mib in apps if int(pid) == outside.pid) << 20
        (args.out / "top-screen.txt").write_text(screen)
        line = next((s for s in screen.splitlines() if s.startswith("[") and " jobs " in s), "")
        top_util = re.search(r"GPU 0 .* util +(\d+)%", screen)
        result.update(
            tmux=bool(shutil.which("tmux")),
            screen=screen,
            mps_servers=servers,
            gpu0=gpus[0],
            smi_per_gpu=per_gpu,
            smi_apps=apps,
            smi_jobs_bytes=smi_jobs,
            smi_outside_bytes=smi_outside,
            top_gpu0_line=line,
            metrics_gpu0=[m for m in metrics.splitlines() if 'gpu="0"' in m],
        )
        checks = {
            "jobs_use_matches_nvidia_smi": gpus[0]["used_by_gpuq_jobs"] == smi_jobs,
            "outside_matches_nvidia_smi": gpus[0]["used_outside_gpuq"] == smi_outside,
            "top_shows_the_same_jobs_use": f"jobs {_size(smi_jobs)}" in line,
            "top_shows_the_same_outside_use": f"out {_size(smi_outside)}" in line,
            "utilisation_busy_in_both": bool(top_util) and int(top_util.group(1)) > 0 and int(per_gpu[0][3]) > 0,
            # Under MPS, NVML files the clients' utilisation under the MPS server's pid (bench/
            # nvml_process_util_probe.py): a job's own share is unknown there, and top says "-", not a guess.
            "mps_jobs_show_no_made_up_utilisation": len(re.findall(NO_UTIL, screen, re.M)) == 2,
            "metrics_agree": any(
                'holder="jobs"' in m and float(m.split()[-1]) == smi_jobs for m in result["metrics_gpu0"]
            ),
        }
        result["checks"], result["passed"] = checks, all(checks.values())
        for job in jobs:
            gpuq("cancel", str(job))
    finally:
        if server is not None:
            server.terminate()
        outside.kill()
        subprocess.run([gpuq.gpuq, "daemon", "stop"], env=gpuq.env, capture_output=True)
    (args.out / "gpu_live.json").write_text(json.dumps(result, indent=1) + "\n")
    print(screen)
    print(json.dumps({k: result[k] for k in ("checks", "passed", "smi_per_gpu", "top_gpu0_line")}, indent=1))
    os._exit(0 if result.get("passed") else 1)


def _command(pid: int) -> str:
    try:
        return os.path.basename(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode())
    except OSError:
        return ""


def _size(n: int) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from gpuq_scheduler.jobs.units import format_size

    return format_size(n)


if __name__ == "__main__":
    main()
