"""The first run of a --mem auto sweep against the same sweep with a hand-given --mem, side by side (issue 40).

    python bench/memauto_first.py --out DIR [--jobs 16] [--epochs 20] [--runs mem_4G,mem_auto,...]
    python bench/memauto_first.py --out DIR --fake     # the fake inventory, fake_cuda.py jobs (no GPU)

Each run is a fresh queue (a fresh state directory: nothing learned), one array of ``--jobs`` digits
trainers (examples/train_digits.py), the daemon started before the submit and stopped after. Runs:

  mem_4G                      --mem 4G, the hand-given figure
  mem_auto                    --mem auto, first run: every member at once on a fenced first share
  mem_auto_probe              GPUQ_AUTO_FIRST=probe: one probe, the others once its peak held still 4 s
  mem_auto_probe_steady_2     the same with GPUQ_AUTO_STEADY=2
  mem_auto_probe_settle_only  ... and GPUQ_AUTO_STEADY=off: after GPUQ_AUTO_SETTLE (20 s), as before issue 40

(At 611e0db, the H200 run of bench/results/h200-memauto-2026-11-29, there was no first share yet: its
mem_auto, mem_auto_steady_2 and mem_auto_settle_only are the three probe runs here.)
For each: the makespan (submit to the last end), how long the others waited for the probe (probe start to
the next member's start), what they learned, and their attempts (one stopped at its fence comes back).
Writes DIR/memauto_first.json after every run, so a run cut short still leaves the ones before it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUNS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "mem_4G": (("--mem", "4G"), {}),
    "mem_auto": (("--mem", "auto"), {}),
    "mem_auto_probe": (("--mem", "auto"), {"GPUQ_AUTO_FIRST": "probe"}),
    "mem_auto_probe_steady_2": (("--mem", "auto"), {"GPUQ_AUTO_FIRST": "probe", "GPUQ_AUTO_STEADY": "2"}),
    "mem_auto_probe_settle_only": (("--mem", "auto"), {"GPUQ_AUTO_FIRST": "probe", "GPUQ_AUTO_STEADY": "off"}),
}


class Queue:
    """The gpuq command against one state directory."""

    def __init__(self, home: Path, cwd: Path, env: dict[str, str]) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
        self.env.update(GPUQ_HOME=str(home), GPUQ_KILL_GRACE="5", **env)
        self.env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + self.env.get("PATH", "")
        self.cwd = cwd

    def __call__(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "gpuq_scheduler.launcher.cli.entry", *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"gpuq {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout


def machine(fake: bool) -> dict[str, Any]:
    found: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "commit": _commit(),
    }
    if fake:
        found["gpus"] = ["fake 1x80GiB (GPUQ_FAKE_GPUS), fake MPS"]
        return found
    import pynvml
    import torch

    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    found["gpus"] = [str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
    found["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
    found["torch"] = torch.__version__
    return found


def _commit() -> str:
    """GPUQ_BENCH_COMMIT where the tree was copied without its history (the lent machine), else git's."""
    if os.environ.get("GPUQ_BENCH_COMMIT"):
        return os.environ["GPUQ_BENCH_COMMIT"]
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def one_run(label: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    options, env = RUNS[label]
    home = work / label / "state"
    if args.fake:
        usage = work / label / "usage"
        usage.mkdir(parents=True)
        env = {**env, "GPUQ_FAKE_GPUS": "1x80GiB", "GPUQ_FAKE_USAGE": str(usage), "GPUQ_FAKE_MPS": "1"}
        job: tuple[str, ...] = ("fake_cuda.py", "1", str(args.seconds))  # 1.5 GiB held for SECONDS
        cwd = work.parent  # where main() put fake_cuda.py
    else:
        job = ("examples/train_digits.py", "--seed", "{index}", "--epochs", str(args.epochs))
        cwd = ROOT
    queue = Queue(home, cwd, env)
    queue("daemon", "start")
    try:
        submitted = time.time()
        array = int(json.loads(queue("submit", "--json", *options, "--array", f"0-{args.jobs - 1}", *job))["id"])
        queue("wait", "--array", str(array), check=False)
        records = [r for r in json.loads(queue("status", "--all", "--json")) if r.get("array_id") == array]
    finally:
        queue("daemon", "stop", check=False)
    starts = sorted(r["started_at"] for r in records if r.get("started_at"))
    result = {
        "makespan_s": round(max(r["ended_at"] for r in records) - submitted, 2),
        "first_start_s": round(starts[0] - submitted, 2),
        "probe_wait_s": round(starts[1] - starts[0], 2) if len(starts) > 1 else None,
        "states": sorted({r["state"] for r in records}),
        "attempts": sorted(r["attempt"] for r in records),
        "mem_from": sorted({r.get("mem_from") or "" for r in records}),
        "env": env if not args.fake else RUNS[label][1],
    }
    print(f"{label}: {json.dumps(result)}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--fake", action="store_true", help="the fake inventory and fake_cuda.py jobs")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each fake job holds its memory")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    args = parser.parse_args()
    labels = args.runs.split(",")
    unknown = [label for label in labels if label not in RUNS]
    if unknown:
        parser.error(f"unknown runs {unknown}: choose from {', '.join(RUNS)}")
    results: dict[str, Any] = {"machine": machine(args.fake), "jobs": args.jobs, "runs": {}}
    results["job"] = f"fake_cuda.py 1 {args.seconds:g}" if args.fake else f"train_digits.py --epochs {args.epochs}"
    print(json.dumps(results["machine"]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copy(ROOT / "tests" / "fixtures" / "fake_cuda.py", work / "fake_cuda.py")
        for count, label in enumerate(labels):
            results["runs"].setdefault(label, []).append(one_run(label, work / str(count), args))
            hand = [run["makespan_s"] for run in results["runs"].get("mem_4G", [])]
            results["vs_mem_4G"] = (
                {
                    name: round(statistics.median(r["makespan_s"] for r in runs) / statistics.median(hand), 3)
                    for name, runs in results["runs"].items()
                }
                if hand
                else {}
            )
            (args.out / "memauto_first.json").write_text(json.dumps(results, indent=1) + "\n")
    left = subprocess.run(["pgrep", "-a", "-x", "nvidia-cuda-mps"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"vs_mem_4G (medians)": results["vs_mem_4G"], "mps_left": left}), flush=True)


if __name__ == "__main__":
    main()
