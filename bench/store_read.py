"""What reading the job table's records costs, for several git revisions side by side.

    python bench/store_read.py [--rounds 3] [--jobs 10000] REV...      e.g. python bench/store_read.py 27056f3 HEAD

The daemon reads every pending and running record when it starts (``JobTable.pending``, ``running``), and
``gpuq status --json``, ``gpuq serve`` and the metrics read them all (``records``). For each revision in turn
and for ``--rounds`` rounds, a fresh interpreter that imports that revision's code (``git archive`` of it laid
out as it installs, in a temporary directory; ``python -S``, so this checkout's editable install does not
shadow it) fills a new table with ``--jobs`` pending jobs and reads them back: the least CPU time
(``time.process_time``, which another process on a busy machine does not inflate as it does wall time) of 12
reads, in milliseconds.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIMER = """
import sys, tempfile, time
from pathlib import Path
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.table import JobTable
count = int(sys.argv[1])
table = JobTable(Path(tempfile.mkdtemp()) / "jobs.db", create=True)
spec = JobSpec(command=("python", "train.py", "--lr", "1e-3"), cwd="/home/u/work",
               env={"PATH": "/usr/bin", "HOME": "/home/u"}, gpus=1, name="train")
records = [JobRecord(id=i, spec=spec, uid=1000, user="u", state=JobState.PENDING, submitted_at=1.0 + i)
           for i in range(1, count + 1)]
table.insert_pending(records, durable=False)
best = {}
for name, read in (("pending", table.pending), ("records", table.records)):
    times = []
    for _ in range(12):
        began = time.process_time()
        read()
        times.append(time.process_time() - began)
    best[name] = min(times) * 1000
print("  ".join(f"{name} {ms:.0f} ms" for name, ms in best.items()))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revs", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10_000)
    args = parser.parse_args()
    site = next(path for path in sys.path if path.endswith("site-packages"))
    with tempfile.TemporaryDirectory(prefix="gpuq-store-read-") as tmp:
        work = Path(tmp)
        for rev in args.revs:  # laid out as it installs: gpuq_scheduler/ with jobs/ and launcher/ in it
            source, package = work / rev / "source", work / rev / "gpuq_scheduler"
            source.mkdir(parents=True)
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True)
            subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
            shutil.copytree(source / "gpuq_scheduler", package)
            for folder in ("jobs", "launcher"):
                (package / folder).symlink_to(source / folder)
        print(f"{args.jobs} pending jobs; least CPU time of 12 reads")
        for round_ in range(1, args.rounds + 1):
            for rev in args.revs:
                done = subprocess.run(
                    [sys.executable, "-S", "-c", TIMER, str(args.jobs)],
                    cwd=work,
                    capture_output=True,
                    text=True,
                    env={"PYTHONPATH": f"{work / rev}:{site}", "PATH": "/usr/bin:/bin"},
                    check=True,
                )
                print(f"round {round_}  {rev:10s} {done.stdout.strip()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
