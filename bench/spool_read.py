"""What the daemon's intake pays to read and check one submit, for several git revisions side by side.

    python bench/spool_read.py [--rounds 3] REV...      e.g. python bench/spool_read.py 5bb972f HEAD

Every submit to an idle queue waits for ``spool.read_request`` (open, read, parse, type and check the request)
before the daemon can place it. This writes one submit the way the CLI does (this checkout's `gpuq submit`,
against a queue whose daemon lock is held, so that the request stays in the spool), then, for each revision in
turn and for ``--rounds`` rounds, times ``read_request`` on it in a fresh interpreter that imports that
revision's code (a temporary git worktree; ``python -S``, so that this checkout's editable install does not
shadow it): the median of 2000 calls, in microseconds.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import revisions

TIMER = """
import shutil, statistics, sys, time
from gpuq_scheduler.jobs.store import spool
path = sys.argv[1]
for _ in range(200):
    spool.read_request(path)
times = []
for _ in range(2000):
    began = time.perf_counter()
    spool.read_request(path)
    times.append(time.perf_counter() - began)
print(f"{statistics.median(times) * 1e6:.1f} us ({spool.__file__.rsplit('/jobs/', 1)[0]})")
"""


def request(work: Path) -> Path:
    """A submit as `gpuq submit` writes it (the environment of this process), left in the spool."""
    home = work / "state"
    env = {**os.environ, "GPUQ_HOME": str(home), "GPUQ_FAKE_GPUS": "1x80GiB"}
    gpuq = Path(sys.executable).with_name("gpuq")
    subprocess.run([str(gpuq), "pause"], env=env, check=True, capture_output=True)  # makes the state directory
    subprocess.run([str(gpuq), "daemon", "stop"], env=env, check=True, capture_output=True)
    with open(home / "daemon.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # no daemon can start: the request stays
        subprocess.run([str(gpuq), "submit", "--", "sh", "-c", "date +%s.%N"], env=env, check=True, capture_output=True)
    (found,) = (home / "spool").glob("submit-*.json")
    return found


def main() -> int:
    args = revisions.arguments(__doc__)
    with tempfile.TemporaryDirectory(prefix="gpuq-spool-read-") as tmp:
        work = Path(tmp)
        path = request(work)
        print(f"one submit of {path.stat().st_size} bytes ({len(os.environ)} environment variables)")
        with revisions.worktrees(work, args.revs):
            for round_, rev in revisions.turns(args):
                print(f"round {round_}  {rev:12s} read_request {revisions.run(work, rev, TIMER, str(path))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
