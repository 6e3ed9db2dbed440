"""How long `gpuq submit` takes, as a user feels it, and how soon an idle queue starts the job.

    python bench/submit_latency.py [--runs 50] [--out bench/results/submit_latency.json]

Runs the installed `gpuq` console script against a fresh state directory on fake GPUs, with the
daemon already up (the usual case), and prints medians. Figures go to JSON with machine and date.
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


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env.update(GPUQ_HOME=str(home), GPUQ_FAKE_GPUS="4x80GiB")
    return env


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    gpuq = shutil.which("gpuq") or sys.exit("gpuq is not installed: pip install .")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "state"
        env = _env(home)
        subprocess.run([gpuq, "daemon", "start"], env=env, check=True, capture_output=True)
        try:
            submit = []
            for _ in range(args.runs):
                started = time.perf_counter()
                subprocess.run([gpuq, "submit", "--gpus", "0", "true"], env=env, check=True, capture_output=True)
                submit.append(time.perf_counter() - started)
            subprocess.run([gpuq, "wait"], env=env, check=True, capture_output=True)

            stamp = Path(tmp) / "stamp"
            to_start = []
            for _ in range(max(10, args.runs // 5)):
                stamp.unlink(missing_ok=True)
                proc = subprocess.run(
                    [gpuq, "submit", "--gpus", "1", "sh", "-c", f"date +%s.%N > {stamp}"],
                    env=env, check=True, capture_output=True,
                )  # fmt: skip
                returned = time.time()
                assert proc.returncode == 0
                subprocess.run([gpuq, "wait"], env=env, check=True, capture_output=True)
                to_start.append(float(stamp.read_text()) - returned)
        finally:
            subprocess.run([gpuq, "daemon", "stop"], env=env, capture_output=True)
    result = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "gpuq": gpuq,
        "submit_median_ms": round(statistics.median(submit) * 1000, 1),
        "submit_p90_ms": round(sorted(submit)[int(len(submit) * 0.9)] * 1000, 1),
        "idle_submit_to_start_median_ms": round(statistics.median(to_start) * 1000, 1),
        "runs": args.runs,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
