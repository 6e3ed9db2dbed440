"""A notebook kernel through gpuq on a real GPU: the documented path, `gpuq jupyter install-kernel`, then a
kernel started as Jupyter starts one (jupyter_client's KernelManager), which must wait its turn, hold its GPU
as a gpuq job of its user (in `gpuq gpus` and `gpuq status`, not as outside use), and free it at shutdown.
Then a whole-GPU kernel left idle past GPUQ_IDLE_LIMIT must be released.

    python bench/gpu_notebook.py [--out DIR]     (needs ipykernel and jupyter_client, torch with CUDA)
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

GPUQ = [sys.executable, "-m", "gpuq_scheduler.launcher.cli.entry"]
HOLD = "import torch, os; x = torch.empty(4 << 30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()"


def gpuq(*args: str) -> Any:
    done = subprocess.run([*GPUQ, *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"gpuq {' '.join(args)}: {done.stderr}")
    return json.loads(done.stdout) if "--json" in args else done.stdout


def run_cell(client: Any, code: str, timeout: float = 120.0) -> str:
    msg_id = client.execute(code)
    out = []
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("ERROR " + msg["content"]["ename"] + ": " + msg["content"]["evalue"])
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(out)


def kernel(name: str) -> tuple[Any, Any]:
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name=name)
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    return manager, client


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuq-notebook-"))
    os.environ.update(GPUQ_HOME=str(work / "home"), JUPYTER_DATA_DIR=str(work / "jupyter"), GPUQ_IDLE_LIMIT="20s")
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "checks": {}}
    checks = result["checks"]
    try:
        result["install"] = gpuq("jupyter", "install-kernel", "--gpus", "1", "--mem", "8G").strip()
        gpuq("jupyter", "install-kernel", "--gpus", "1", "--name", "gpuq-whole")
        started = time.monotonic()
        manager, client = kernel("gpuq-1gpu-8g")
        result["kernel_ready_s"] = round(time.monotonic() - started, 2)
        result["kernel_says"] = run_cell(
            client,
            HOLD + "; print(os.environ['CUDA_VISIBLE_DEVICES'], "
            "os.environ['GPUQ_JOB_ID'], torch.cuda.memory_allocated())",
        ).split()
        time.sleep(3)  # a sample of the GPU's processes
        jobs, gpus = gpuq("status", "--all", "--json"), gpuq("gpus", "--json")
        result["status"], result["gpus"] = jobs, gpus
        job = jobs[0]
        checks["kernel is a running gpuq job of its user"] = (
            job["state"] == "running" and job["user"] == os.environ.get("USER", job["user"]) and job["gpus"] == [0]
        )
        checks["gpuq gpus counts its memory as the job's, not outside use"] = (
            gpus[0]["jobs"] == [job["id"]] and gpus[0]["used_outside_gpuq"] < 1 << 30
        )
        # Under an MPS fence CUDA_VISIBLE_DEVICES names the GPU by its UUID (the MPS server sees one device).
        seen, job_id = result["kernel_says"][:2], str(job["id"])
        checks["kernel saw its GPU and job id"] = seen[0] in ("0", gpus[0]["uuid"]) and seen[1] == job_id
        manager.shutdown_kernel(now=False)
        client.stop_channels()
        ended = _wait_end(job["id"])
        result["ended"] = ended
        checks["shutdown ends the job and frees the GPU"] = ended["state"] in ("succeeded", "failed", "cancelled")
        # A whole-GPU kernel that does nothing: released at the idle limit (an MPS-fenced one never is).
        manager, client = kernel("gpuq-whole")
        run_cell(client, HOLD)
        whole = next(j for j in gpuq("status", "--all", "--json") if j["state"] == "running")
        released = _wait_end(whole["id"], timeout=90)
        result["idle"] = released
        checks["an idle whole-GPU kernel is released"] = released["state"] == "cancelled" and (
            "did no work" in released["reason"]
        )
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    except Exception as err:  # record what failed, with the rest of the run
        result["error"] = f"{type(err).__name__}: {err}"
    finally:
        subprocess.run([*GPUQ, "daemon", "stop"], capture_output=True)
    result["passed"] = bool(checks) and all(checks.values()) and "error" not in result
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_notebook.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("status", "gpus")}, indent=1))
    return 0 if result["passed"] else 1


def _wait_end(job_id: int, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record: dict[str, Any] = gpuq("show", "--json", str(job_id))
        if record["state"] not in ("pending", "running"):
            return record
        time.sleep(0.5)
    return gpuq("show", "--json", str(job_id))  # type: ignore[no-any-return]


if __name__ == "__main__":
    sys.exit(main())
