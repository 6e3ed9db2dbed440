"""A longer crash soak than CI can afford, run by hand::

    python bench/soak.py --minutes 10                 # waves of jobs while the daemon is killed -9 at random
    python bench/soak.py --concurrency                # 16 clients x 500 operations at once (tests/test_concurrency.py)
    python bench/soak.py --concurrency --processes 32 --operations 1000 --keep
    python bench/soak.py --memory --minutes 10       # one daemon, never killed: does its memory stay flat?

The crash soak submits waves of mixed jobs (tests/fixtures/report.py, on 4 fake 80 GiB GPUs) and kills
the daemon with SIGKILL at random moments, restarting it each time, until the time is up. Then it checks,
from the jobs' own reports, that every job ran exactly once and no GPU was over-committed or shared by a
whole-GPU job, that every job succeeded, and that `gpuq doctor` finds nothing. Exit code 0 when all held.

The memory soak runs one daemon (never killed) on 4 fake 80 GiB GPUs and keeps it busy with a steady
stream of short shell jobs (single jobs, --mem jobs sharing GPUs, 2-GPU jobs, CPU jobs, small arrays,
failing jobs, time-outs, cancels of jobs and arrays) while it samples the daemon's VmRSS and open file
descriptors from /proc every few seconds, and the largest of its shims (which live on, job after job).
It writes the figures and every sample as JSON (--out) and checks that every job ended as intended, ran
at most once, and that `gpuq doctor` finds nothing. Exit code 0 when memory stayed flat (under 5% growth
after the warm-up for the daemon and its largest shim, no more fds) and every check held.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.soak_concurrency import concurrency_soak  # noqa: E402
from bench.soak_crash import crash_soak  # noqa: E402
from bench.soak_memory import memory_main  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the crash (or memory) soak runs")
    parser.add_argument("--wave", type=int, default=20, help="jobs submitted between kills")
    parser.add_argument("--concurrency", action="store_true", help="run the many-clients workload instead")
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--operations", type=int, default=500)
    parser.add_argument("--memory", action="store_true", help="run the memory soak instead: one daemon, never killed")
    parser.add_argument("--inflight", type=int, default=32, help="memory soak: jobs kept submitted and not ended")
    parser.add_argument("--sample-every", type=float, default=2.0, help="memory soak: seconds between samples")
    parser.add_argument("--warmup-jobs", type=int, default=1000, help="memory soak: warm-up ends after this many jobs")
    parser.add_argument("--warmup-seconds", type=float, default=60.0, help="...or this long, whichever is first")
    parser.add_argument(
        "--out",
        type=Path,
        help="memory soak: the JSON to write, or a directory for soak-memory-<date>.json "
        "(default bench/results/soak-memory-<date>.json)",
    )
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--keep", action="store_true", help="keep the state directory for a look afterwards")
    args = parser.parse_args()
    if args.memory and args.concurrency:
        parser.error("--memory and --concurrency are two different soaks: choose one")

    # The memory soak's directory is named soakmem-*, so that its daemon (`--home /tmp/soakmem-...`) is easy to
    # tell from others' by its command line.
    scratch = Path(tempfile.mkdtemp(prefix="soakmem-" if args.memory else "gpuq soak "))
    home = scratch / "state dir 'quoted'"
    print(f"seed {args.seed}, state directory {home}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # cleanup runs on kill too
    started = time.monotonic()
    try:
        if args.memory:
            return memory_main(args, home)
        if args.concurrency:
            failures = concurrency_soak(home, args.processes, args.operations, args.seed)
        else:
            failures = crash_soak(home, args.minutes, args.wave, args.seed)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps({"seconds": round(time.monotonic() - started, 1), "failures": len(failures)}))
    for failure in failures[:50]:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
