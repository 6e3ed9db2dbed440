"""What nvmlDeviceGetProcessUtilization reports for a busy plain CUDA process and for a busy MPS client
(run on a lent GPU machine; prints JSON). gpuq's per-job utilisation comes from it (gpus/nvml.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pynvml

BUSY = """
import torch, time
x = torch.randn(4096, 4096, device="cuda")
end = time.time() + 12
while time.time() < end:
    x = torch.tanh(x @ x)
    torch.cuda.synchronize()
"""


def sample(handle: object) -> object:
    try:
        return [(s.pid, s.smUtil, s.timeStamp) for s in pynvml.nvmlDeviceGetProcessUtilization(handle, 0)]
    except pynvml.NVMLError as err:
        return f"NVMLError: {err}"


def run(env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.Popen([sys.executable, "-c", BUSY], env=env)
    time.sleep(7)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    found = {"pid": proc.pid, "samples": sample(handle), "gpu_util": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu}
    proc.wait()
    return found


def main() -> None:
    pynvml.nvmlInit()
    out: dict[str, object] = {"plain": run(dict(os.environ, CUDA_VISIBLE_DEVICES="0"))}
    base = tempfile.mkdtemp()
    mps = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=f"{base}/pipe", CUDA_MPS_LOG_DIRECTORY=f"{base}/log")
    os.makedirs(f"{base}/pipe")
    os.makedirs(f"{base}/log")
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=mps, check=True)
    try:
        out["mps_client"] = run(dict(mps, CUDA_VISIBLE_DEVICES="0"))
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=mps)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
