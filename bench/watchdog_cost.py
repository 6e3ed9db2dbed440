"""What the GPU watchdog costs the daemon: CPU per sampling pass, on the fake inventory and on real NVML.

    python bench/watchdog_cost.py [--passes 300] [--processes 16] [--fake 8x80GiB] [--cuda 0] [--json OUT]

One pass is what the daemon does every two seconds while anything holds a GPU: the snapshot (NVML's memory
and per-process lists, which every tick takes anyway, for placement) and the watchdog's own work over it
(``launcher.daemon.watching.watchdog``: each GPU process attributed to its job through /proc, then the rules); while a
job holds a GPU the watchdog also reads each GPU's energy counter, after the pass's starts
(``snapshot_with_energy``).
Both are measured as CPU time (``time.process_time``), per pass, median of ``--passes``, in a real
``Scheduler`` over a fresh state directory, in these settings:

- ``idle``: no process on any GPU (an idle box): the watchdog returns before it reads anything;
- ``busy``: ``--processes`` live processes on the GPUs, half of them carrying a job's marker (the
  fallback's worst case: its environment is read), none of them a running job's.

On the fake inventory (``--fake``), the processes are real ``sleep`` processes that the fake NVML lists as
holding memory. On real NVML (when pynvml finds GPUs), ``idle`` is the box as it is, and ``--cuda N``
starts N small torch processes (256 MiB each, spread over the GPUs) for ``busy``.
Prints one JSON object (and writes it to ``--json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuq_scheduler.jobs.store.statedir import StateDir  # noqa: E402
from gpuq_scheduler.launcher.daemon.attribution import MARKER, queue_key  # noqa: E402
from gpuq_scheduler.launcher.daemon.scheduler import Scheduler  # noqa: E402
from gpuq_scheduler.launcher.daemon.watching.sight import Readings  # noqa: E402
from gpuq_scheduler.launcher.gpus.fake import FakeGpus  # noqa: E402
from gpuq_scheduler.launcher.gpus.snapshot import GpuSource  # noqa: E402

HOLD = (
    "import time, torch; x = torch.empty(256 << 20, dtype=torch.uint8, device='cuda'); "
    "print('ready', flush=True); time.sleep(3600)"
)


def cpu_ms(action: Callable[[], object], passes: int) -> dict[str, float]:
    """Median and 90th percentile CPU milliseconds of ``action`` over ``passes`` calls."""
    spent = []
    for _ in range(passes):
        start = time.process_time()
        action()
        spent.append((time.process_time() - start) * 1000)
    spent.sort()
    return {"median_ms": round(statistics.median(spent), 4), "p90_ms": round(spent[int(0.9 * (len(spent) - 1))], 4)}


def measure(root: Path, source: GpuSource, passes: int) -> dict[str, Any]:
    state = StateDir(root)
    state.ensure()
    scheduler = Scheduler(state, source)
    try:
        snapshot = source.snapshot()
        processes = sum(len(g.processes or {}) for g in snapshot)

        def check() -> None:
            scheduler.watch.next_at = 0.0  # every call is a sampling pass
            scheduler.watch.check(scheduler, time.time(), Readings(source, snapshot))

        return {
            "gpus": len(snapshot),
            "gpu_processes": processes,
            "snapshot": cpu_ms(source.snapshot, passes),
            "watchdog": cpu_ms(check, passes),
            "snapshot_with_energy": cpu_ms(lambda: source.snapshot(energy=True), passes),
        }
    finally:
        scheduler.close()


@contextlib.contextmanager
def sleepers(count: int, gpus: int, usage: Path, key: str) -> Iterator[None]:
    """``count`` live processes the fake NVML lists on the GPUs, half with a marker of this queue."""
    started = []
    try:
        for n in range(count):
            env = {"PATH": os.defpath, **({MARKER: f"{key}/{100000 + n}"} if n % 2 else {})}
            child = subprocess.Popen(["sleep", "3600"], env=env)
            started.append(child)
            (usage / f"{child.pid}.json").write_text(json.dumps({str(n % gpus): 2 << 30}))
        yield
    finally:
        for child in started:
            child.kill()
            child.wait()


@contextlib.contextmanager
def cuda_holders(count: int, gpus: int) -> Iterator[None]:
    started = []
    try:
        for n in range(count):
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(n % gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
            child = subprocess.Popen([sys.executable, "-c", HOLD], env=env, stdout=subprocess.PIPE, text=True)
            started.append(child)
        for child in started:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield
    finally:
        for child in started:
            child.kill()
            child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=300)
    parser.add_argument("--processes", type=int, default=16, help="fake GPU processes for the busy setting")
    parser.add_argument("--fake", default="8x80GiB", help="the fake inventory (an 8-GPU box by default)")
    parser.add_argument("--cuda", type=int, default=0, help="real torch processes for the busy setting on NVML")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "passes": args.passes,
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        usage = work / "usage"
        usage.mkdir()
        fake = FakeGpus(args.fake, str(usage))
        gpus = len(fake.snapshot())
        result["fake"] = {"spec": args.fake, "idle": measure(work / "fake-idle", fake, args.passes)}
        with sleepers(args.processes, gpus, usage, queue_key(work / "fake-busy")):
            result["fake"]["busy"] = measure(work / "fake-busy", fake, args.passes)
        from gpuq_scheduler.launcher.gpus.nvml import NvmlGpus

        nvml = NvmlGpus()  # each measure's scheduler closes its source (NVML shut down): a fresh one each
        real = nvml.snapshot()
        if real:
            result["nvml"] = {"gpus": [g.name for g in real], "idle": measure(work / "nvml-idle", nvml, args.passes)}
            if args.cuda:
                with cuda_holders(args.cuda, len(real)):
                    result["nvml"]["busy"] = measure(work / "nvml-busy", NvmlGpus(), args.passes)
        else:
            result["nvml"] = "no GPU found through NVML here"
            nvml.close()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
