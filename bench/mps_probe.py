"""Facts about CUDA MPS on a lent GPU machine, before gpuq relies on them (run there as root):

    python bench/mps_probe.py OUT_DIR

1. A per-GPU MPS control daemon (its own pipe and log directories, CUDA_VISIBLE_DEVICES set to one GPU's
   UUID) enforces CUDA_MPS_PINNED_DEVICE_MEM_LIMIT on a client; how much of the limit tensors can use
   (does the CUDA context count against it?).
2. The same as an ordinary (non-root) user who starts their own control daemon.
3. Without MPS: does this torch read per_process_memory_fraction from PYTORCH_CUDA_ALLOC_CONF?
4. NVML lists an MPS client under its own pid, with its memory.
Every control daemon started here is quit, whatever happens; the JSON says none is left.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
USER = "gpuqprobe"
# Allocates 128 MiB tensors until CUDA refuses; prints what it got and how it was refused.
CLIENT = r"""
import json, os, sys, time, torch
step = 128 << 20
held, error = [], ""
try:
    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info()
    while len(held) * step < 200 << 30:
        held.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
        if len(held) == 4:
            open(sys.argv[1], "w").write(str(os.getpid()))  # the parent looks at NVML now
            time.sleep(3)
except Exception as err:
    error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
print(json.dumps({"allocated_mib": len(held) * 128, "error": error, "free_at_start_mib": free0 >> 20,
                  "total_mib": total >> 20, "torch": torch.__version__}))
"""


def run_client(env: dict[str, str], user: str | None, marker: Path) -> dict[str, object]:
    kwargs: dict[str, object] = {}
    if user is not None:
        entry = pwd.getpwnam(user)
        kwargs = {"user": entry.pw_uid, "group": entry.pw_gid}
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(marker)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )  # type: ignore[call-overload]
    nvml: object = None
    for _ in range(600):
        if marker.exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    if marker.exists():
        nvml = nvml_processes()
    out, err = proc.communicate(timeout=300)
    result: dict[str, object] = {"returncode": proc.returncode, "stderr_tail": err[-600:], "nvml_while_running": nvml}
    try:
        result.update(json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        result["stdout"] = out[-600:]
    return result


def nvml_processes() -> object:
    import pynvml

    pynvml.nvmlInit()
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                found.append({"gpu": index, "pid": proc.pid, "used_mib": (proc.usedGpuMemory or 0) >> 20})
        return found
    finally:
        pynvml.nvmlShutdown()


def gpu_uuids() -> list[str]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def control(base: Path, uuid: str, user: str | None, action: str) -> dict[str, object]:
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(base / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(base / "log")}
    kwargs: dict[str, object] = {}
    if user is not None:
        entry = pwd.getpwnam(user)
        kwargs = {"user": entry.pw_uid, "group": entry.pw_gid}
        env.update(HOME=entry.pw_dir, USER=user)
    if action == "start":
        env["CUDA_VISIBLE_DEVICES"] = uuid
        done = subprocess.run([CONTROL, "-d"], env=env, capture_output=True, text=True, timeout=30, **kwargs)  # type: ignore[call-overload]
    else:
        done = subprocess.run(
            [CONTROL], input=f"{action}\n", env=env, capture_output=True, text=True, timeout=30, **kwargs
        )  # type: ignore[call-overload]
    return {"action": action, "returncode": done.returncode, "out": (done.stdout + done.stderr)[-400:]}


def client_env(base: Path, limit_mib: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS")}
    env["CUDA_VISIBLE_DEVICES"] = "0"
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(base / "pipe")
    env["CUDA_MPS_LOG_DIRECTORY"] = str(base / "log")
    if limit_mib is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit_mib}M"
    return env


def mps_case(root: Path, uuid: str, user: str | None, name: str) -> dict[str, object]:
    base = root / name
    (base / "pipe").mkdir(parents=True)
    (base / "log").mkdir()
    if user is not None:  # the user's own directories, as gpuq's state directory is its user's
        shutil.chown(base, user)
        shutil.chown(base / "pipe", user)
        shutil.chown(base / "log", user)
        for folder in (root, base):
            folder.chmod(0o755)
    case: dict[str, object] = {"start": control(base, uuid, user, "start")}
    try:
        time.sleep(1)
        case["limited_2048M"] = run_client(client_env(base, 2048), user, base / "m1")
        case["server_list"] = control(base, uuid, user, "get_server_list")
        case["unlimited_capped_walk"] = "skipped"
    finally:
        case["quit"] = control(base, uuid, user, "quit")
        time.sleep(2)
    return case


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, object] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "control": shutil.which(CONTROL),
        "uuids": gpu_uuids(),
    }
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,compute_mode,driver_version", "--format=csv"], capture_output=True, text=True
    )
    report["nvidia_smi"] = smi.stdout
    root = Path(tempfile.mkdtemp(prefix="gpuq-mps-probe-"))
    root.chmod(0o755)
    uuid = report["uuids"][0]  # type: ignore[index]
    try:
        report["root"] = mps_case(root, uuid, None, "root")
        if subprocess.run(["id", USER], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "-M", "-s", "/bin/sh", USER], check=False)
        report["user"] = mps_case(root, uuid, USER, "user")
        plain = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS")}
        plain["CUDA_VISIBLE_DEVICES"] = "0"
        report["no_mps_plain"] = run_client({**plain}, None, root / "m3")
        report["no_mps_alloc_conf_fraction_0.02"] = run_client(
            {**plain, "PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.02"}, None, root / "m4"
        )
    finally:
        left = subprocess.run(["pgrep", "-a", "-f", "nvidia-cuda-mps"], capture_output=True, text=True).stdout
        report["mps_processes_left"] = left
        for line in left.splitlines():
            print("LEFT BEHIND:", line)
        (out / "mps_probe.json").write_text(json.dumps(report, indent=1))
        print(json.dumps(report, indent=1)[-6000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
