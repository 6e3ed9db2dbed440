"""What reading the journal costs (``events.jsonl``), for several git revisions side by side.

    python bench/journal_read.py [--rounds 3] [--events 100000] REV...    e.g. python bench/journal_read.py 1f61ec5 HEAD

``gpuq show N`` reads one job's preemptions and suspends from the journal (``suspend_costs.read(path, N)``);
``gpuq report``, ``gpuq status --json`` and ``/metrics`` read every job's (``suspend_costs.read(path)``). The
journal is made once: the lines of tests/fixtures/journal-1f61ec5/events.jsonl (a real daemon's, 20 kinds)
repeated, job ids renumbered, to ``--events`` lines. For each revision in turn and for ``--rounds`` rounds, a
fresh interpreter that imports that revision's code (``git archive`` of it laid out as it installs; ``python
-S``, so this checkout's editable install does not shadow it) reads it: the least CPU time
(``time.process_time``, which others' load on a shared machine does not inflate as it does wall time) of 5
reads, in milliseconds, of one job's events and of every job's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "journal-1f61ec5" / "events.jsonl"

TIMER = """
import sys, time
from pathlib import Path
from gpuq_scheduler.launcher.views import suspend_costs
path, job = Path(sys.argv[1]), int(sys.argv[2])
best = {}
for name, read in (("one job", lambda: suspend_costs.read(path, job)), ("all jobs", lambda: suspend_costs.read(path))):
    times = []
    for _ in range(5):
        began = time.process_time()
        found = read()
        times.append(time.process_time() - began)
    best[name] = (min(times) * 1000, sum(m.suspends for m in found.values()))
print("  ".join(f"{name} {ms:.0f} ms ({suspends} suspends)" for name, (ms, suspends) in best.items()))
"""


def journal(path: Path, count: int) -> int:
    """Write ``count`` events like the fixture's, each of its jobs again under fresh ids; the id of a job
    in the middle that was suspended."""
    lines = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    jobs = max(event.get("job", 0) for event in lines)
    written, turn, middle = 0, 0, 0
    with path.open("w") as out:
        while written < count:
            for event in lines[: count - written]:
                if "job" in event:
                    event = {**event, "job": event["job"] + turn * jobs}
                out.write(json.dumps(event, separators=(",", ":")) + "\n")
                if event.get("event") == "suspended" and written < count // 2:
                    middle = event["job"]
                written += 1
            turn += 1
    return middle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revs", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    site = next(path for path in sys.path if path.endswith("site-packages"))
    with tempfile.TemporaryDirectory(prefix="gpuq-journal-read-") as tmp:
        work = Path(tmp)
        events = work / "events.jsonl"
        job = journal(events, args.events)
        for rev in args.revs:  # laid out as it installs: gpuq_scheduler/ with jobs/ and launcher/ in it
            source, package = work / rev / "source", work / rev / "gpuq_scheduler"
            source.mkdir(parents=True)
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True)
            subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
            shutil.copytree(source / "gpuq_scheduler", package)
            for folder in ("jobs", "launcher"):
                (package / folder).symlink_to(source / folder)
        print(f"{args.events} events ({events.stat().st_size >> 20} MiB); job {job}; least CPU time of 5 reads")
        for round_ in range(1, args.rounds + 1):
            for rev in args.revs:
                done = subprocess.run(
                    [sys.executable, "-S", "-c", TIMER, str(events), str(job)],
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
