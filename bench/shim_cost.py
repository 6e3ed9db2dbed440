"""The CPU a shim spends on each job of a hand-off chain, this checkout beside another revision, in one run.

    python bench/shim_cost.py [--jobs 80] [--rounds 3] [--against REV]

Runs the shim's own per-job code (``launcher.supervisor.shim``: supervise a job, with the next job staged
during it as the daemon would, then write its exit file) in a fresh interpreter, over a chain of short
jobs (``sh -c 'sleep 0.02'``), and reports the median CPU time (``time.process_time``) per job: what the
shim costs the machine at each hand-off, most of it between one job's end and the next one's start, when
on a small machine the jobs starting on the other GPUs want the same cores. Wall-clock time is not the
figure (the jobs sleep). ``--against REV`` measures a temporary git worktree of REV the same way,
alternating with this checkout round by round, so that both face the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs in a fresh interpreter with argv: the tree to import gpuq_scheduler from, and the number of jobs.
PROBE = r"""
import os, pickle, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
try:
    from gpuq_scheduler.launcher.supervisor import shim
except ImportError:  # --against a revision from before the supervisor had a room of its own
    from gpuq_scheduler.launcher.daemon import shim
jobs = int(sys.argv[2])
root = Path(tempfile.mkdtemp()); (root / "run").mkdir(); (root / "logs").mkdir()
wake = root / "wake"; os.mkfifo(wake); keep = os.open(wake, os.O_RDWR | os.O_NONBLOCK)
env = dict(os.environ)
def launch(i):
    return shim.Launch(i, ["sh", "-c", "sleep 0.02"], env, str(root), root / "logs" / f"{i}.log",
                       root / "run" / f"{i}.exit", root / "run" / f"{i}.pid", wake, None, 5.0)
pipe_read, pipe_write = os.pipe()
wake_read, _ = os.pipe(); os.set_blocking(wake_read, False)
costs = []
for i in range(1, jobs + 1):
    data = pickle.dumps(launch(i + 1))  # staged while job i runs, as the daemon sends it
    os.write(pipe_write, b"N" + len(data).to_bytes(8, "big") + data)  # the message's form in every revision
    job = launch(i)
    started = time.process_time()
    argv, cwd, credentials = shim.as_user(job.argv, job.cwd, job.account)
    outcome, following = shim._supervise(job, argv, cwd, dict(job.env), credentials, wake_read, pipe_read, True)
    shim._finish(job, outcome, following)
    costs.append(time.process_time() - started)
print(sorted(costs[5:])[len(costs[5:]) // 2] * 1e6)
"""


def measure(tree: Path, jobs: int) -> float:
    """Median CPU (us) per job of the shim code under ``tree``, in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", PROBE, str(tree), str(jobs)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the probe failed under {tree}:\n{done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def importable(checkout: Path, where: Path) -> Path:
    """A directory from which ``import gpuq_scheduler`` finds ``checkout``'s code, laid out as pyproject.toml
    installs it (jobs/ and launcher/ under the package's name)."""
    package = where / "gpuq_scheduler"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text((checkout / "gpuq_scheduler" / "__init__.py").read_text())
    for room in ("jobs", "launcher"):
        os.symlink(checkout / room, package / room)
    return where


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--jobs", type=int, default=80)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", help="a git revision to measure beside this checkout")
    args = parser.parse_args()
    if args.jobs < 10 or args.rounds < 1:
        parser.error("--jobs is at least 10 (the first 5 warm up) and --rounds at least 1")
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this checkout": importable(ROOT, Path(tmp) / "here")}
        other = Path(tmp) / "other"
        if args.against:
            added = subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(other), args.against],
                capture_output=True,
                text=True,
            )
            if added.returncode != 0:
                parser.error(f"--against {args.against}: {added.stderr.strip().splitlines()[-1]}")
            trees[args.against] = importable(other, Path(tmp) / "there")
        try:
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    results.setdefault(name, []).append(measure(tree, args.jobs))
        finally:
            if args.against:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], check=False)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"shim CPU per job of a hand-off chain ({args.jobs} jobs, {os.cpu_count()} cores, {stamp}):")
    for name, values in results.items():
        print(f"  {name}: {statistics.median(values):.0f} us (each round: {', '.join(f'{v:.0f}' for v in values)})")
    print(json.dumps({"us_per_job": results, "jobs": args.jobs, "at": stamp}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
