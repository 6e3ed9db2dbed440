"""The daemon's pass over 10,000 pending jobs (the harness's D) and what their records weigh, for several git
revisions side by side.

    python bench/daemon_pass.py [--rounds 3] REV...      e.g. python bench/daemon_pass.py 5bb972f HEAD

For each revision in turn and for ``--rounds`` rounds, a fresh interpreter imports that revision's code (a
temporary git worktree; ``python -S``, so that this checkout's editable install does not shadow it) and runs
its own ``bench/gpuq_scale.daemon_pass`` (the pass after an event with 10,000 pending and 8 busy GPUs: the
median of 15) and measures, with tracemalloc, the 10,000 pending records as the daemon loads them.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import revisions

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
    args = revisions.arguments(__doc__)
    with tempfile.TemporaryDirectory(prefix="gpuq-daemon-pass-") as tmp:
        work = Path(tmp)
        with revisions.worktrees(work, args.revs):
            for round_, rev in revisions.turns(args):
                out = revisions.run(work, rev, TIMER, str(revisions.tree(work, rev)))
                print(f"round {round_}  {rev:12s} {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
