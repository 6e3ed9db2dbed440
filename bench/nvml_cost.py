"""What each NVML call the daemon makes costs, per GPU, on a lent GPU host (prints JSON; ``--json FILE`` too).

The daemon takes a GPU snapshot (``launcher/gpus/nvml.py``) in every pass, so whatever NVML takes to answer
was paid at every submit and every job's end before anything was placed. The harness runs on the fake
inventory and never sees it (``GPUQ_BENCH_REAL_GPUS=1`` makes it use the host's GPUs); this measures the
calls one by one, and the snapshot of this checkout as a whole, plain (every pass) and with the fields it
reads only when asked, median of ``--passes`` (wall and CPU, microseconds).

    python bench/nvml_cost.py --passes 50 --json nvml_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(call: Callable[[], object], passes: int) -> dict[str, float | str]:
    walls, cpus = [], []
    for _ in range(passes):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            call()
        except pynvml.NVMLError as err:
            return {"error": str(err)}
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return {"wall_us": round(statistics.median(walls) * 1e6, 1), "cpu_us": round(statistics.median(cpus) * 1e6, 1)}


def calls(handle: Any) -> dict[str, Callable[[], object]]:
    return {
        "GetUUID": lambda: pynvml.nvmlDeviceGetUUID(handle),
        "GetName": lambda: pynvml.nvmlDeviceGetName(handle),
        "GetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle),
        "GetComputeRunningProcesses": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
        "GetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle),
        "GetProcessUtilization": lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, 0),
        "GetTotalEnergyConsumption": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--passes", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpus": count,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "per_gpu": {},
    }
    for index in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        by_index = timed(lambda: pynvml.nvmlDeviceGetHandleByIndex(index), args.passes)  # noqa: B023
        found: dict[str, Any] = {"GetHandleByIndex": by_index}
        found |= {name: timed(call, args.passes) for name, call in calls(handle).items()}
        result["per_gpu"][str(index)] = found
    pynvml.nvmlShutdown()
    from gpuq_scheduler.launcher.gpus.nvml import NvmlGpus

    source = NvmlGpus()
    result["snapshot"] = timed(source.snapshot, args.passes)  # what every daemon pass takes
    try:
        result["snapshot_with_energy"] = timed(lambda: source.snapshot(energy=True), args.passes)
        result["snapshot_with_shares"] = timed(lambda: source.snapshot(process_utilization=True), args.passes)
    except TypeError:
        pass  # a revision whose snapshot reads everything, always
    source.close()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
