"""The daemon's pass over 10,000 pending jobs (the harness's D) and what their records weigh, for several git
revisions side by side.

    python bench/daemon_pass.py [--rounds 3] REV...      e.g. python bench/daemon_pass.py 5bb972f HEAD

For each revision in turn and for ``--rounds`` rounds, a fresh interpreter imports that revision's code (a
temporary git worktree; ``python -S``, so that this checkout's editable install does not shadow it) and runs
its own ``bench/gpuq_scale.daemon_pass`` (the pass after an event with 10,000 pending and 8 busy GPUs: the
median of 15) and measures, with tracemalloc, the 10,000 pending records as the daemon loads them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIMER = """
import importlib.util, sys, tempfile, tracemalloc
from pathlib import Path
tree = sys.argv[1]
found = importlib.util.spec_from_file_location("scale", f"{tree}/bench/gpuq_scale.py")
scale = importlib.util.module_from_spec(found)
sys.path.append(tree)  # its bench package, for gpuq_scale's own imports (its gpuq_scheduler comes first)
found.loader.exec_module(scale)
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
try:
    from gpuq_scheduler.jobs.outcome import JobState
except ImportError:  # an older revision's
    from gpuq_scheduler.jobs.model import JobState
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
with tempfile.TemporaryDirectory() as tmp:
    passed = scale.daemon_pass(Path(tmp), repeat=15)["daemon_pass_ms"]
    state = StateDir(Path(tmp) / "records")
    state.ensure()
    table = JobTable(state.db, create=True)
    spec = JobSpec(command=("python", "train.py"), cwd="/tmp", env={"PATH": "/usr/bin"})
    table.insert_pending([
        JobRecord(id=i, spec=JobSpec(command=("python", "train.py", str(i)), cwd="/tmp", env={"PATH": "/usr/bin"}),
                  uid=0, user="root", state=JobState.PENDING, submitted_at=0.0)
        for i in range(1, 10_001)
    ])
    tracemalloc.start()
    records = list(table.pending())
    weight = tracemalloc.get_traced_memory()[0]
    print(f"pass {passed:.2f} ms, 10,000 pending records {weight / 1e6:.1f} MB")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revs", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    site = next(p for p in sys.path if p.endswith("site-packages"))
    with tempfile.TemporaryDirectory(prefix="gpuq-daemon-pass-") as tmp:
        work = Path(tmp)
        for rev in args.revs:
            tree = work / f"tree-{rev}"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), rev], check=True)
            (work / f"pkg-{rev}").mkdir()
            (work / f"pkg-{rev}" / "gpuq_scheduler").symlink_to(tree)
        try:
            for round_ in range(1, args.rounds + 1):
                for rev in args.revs:
                    env = {**os.environ, "PYTHONPATH": f"{work / f'pkg-{rev}'}:{site}"}
                    # From the temporary directory: `python -c` puts its directory first on the path, and this
                    # checkout's root holds a gpuq_scheduler of its own.
                    out = subprocess.run([sys.executable, "-S", "-c", TIMER, str(work / f"tree-{rev}")], env=env,
                                         capture_output=True, text=True, cwd=work)  # fmt: skip
                    if out.returncode:
                        raise SystemExit(f"{rev}: {out.stderr.strip()}")
                    out = out.stdout.strip()
                    print(f"round {round_}  {rev:12s} {out}", flush=True)
        finally:
            for rev in args.revs:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / f"tree-{rev}")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
