"""A longer crash soak than CI can afford, run by hand::

    python bench/soak.py --minutes 10                 # waves of jobs while the daemon is killed -9 at random
    python bench/soak.py --concurrency                # 16 clients x 500 operations at once (tests/test_concurrency.py)
    python bench/soak.py --concurrency --processes 32 --operations 1000 --keep

The crash soak submits waves of mixed jobs (tests/fixtures/report.py, on 4 fake 80 GiB GPUs) and kills
the daemon with SIGKILL at random moments, restarting it each time, until the time is up. Then it checks,
from the jobs' own reports, that every job ran exactly once and no GPU was over-committed or shared by a
whole-GPU job, that every job succeeded, and that `gpuq doctor` finds nothing. Exit code 0 when all held.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs import api  # noqa: E402
from jobs.statedir import StateDir  # noqa: E402
from launcher import doctor  # noqa: E402
from tests.conftest import REPORT, Gpuq, make_env, read_reports  # noqa: E402
from tests.invariants import check_exactly_once, check_no_overcommit  # noqa: E402

SHAPES: list[dict[str, object]] = [
    {"gpus": 1},
    {"gpus": 2},
    {"gpus": 1, "mem": "30G"},
    {"gpus": 2, "mem": "50G"},
    {"gpus": 1, "mem": "20G"},
    {"gpus": 0},
]


def kill_daemon(state: StateDir) -> bool:
    """SIGKILL the daemon if one runs; True if one was killed. A client may start the next one at once."""
    from launcher.daemon import running_pid

    pid = running_pid(state)
    if pid is None or pid <= 0:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while running_pid(state) == pid and time.monotonic() < deadline:
        time.sleep(0.01)
    with contextlib.suppress(ChildProcessError):  # daemons this process started are its children: reap them
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    return True


def crash_soak(home: Path, minutes: float, wave: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    work = home.parent / "work"
    work.mkdir(exist_ok=True)
    client = Gpuq(home, make_env(home), work)
    os.environ.update(client.env)  # api.submit starts any daemon it needs with these fake GPUs
    client.run("daemon", "start")
    state = StateDir(home)
    report = work / "seen.jsonl"
    ids: list[int] = []
    kills = 0
    deadline = time.monotonic() + minutes * 60
    try:
        while time.monotonic() < deadline:
            for _ in range(wave):
                shape = rng.choice(SHAPES)
                seconds = f"{rng.uniform(0.05, 1.5):.2f}"
                ids.append(api.submit([str(REPORT), str(report), seconds], home=home, cwd=work, **shape))  # type: ignore[arg-type]
                if rng.random() < 0.05:
                    kills += kill_daemon(state)
            for _ in range(rng.randint(1, 4)):  # jobs end while no daemon runs: their outcomes wait on disk
                time.sleep(rng.uniform(0.0, 1.0))
                kills += kill_daemon(state)
                time.sleep(rng.uniform(0.0, 0.5))
                client.run("daemon", "start")
        print(f"submitted {len(ids)} jobs, killed the daemon {kills} times; waiting for the queue to drain")
        api.wait(ids, home=home, timeout=max(600.0, len(ids) * 2.0))
        failures = []
        reports = read_reports(report)
        try:
            check_exactly_once(reports, ids)
        except AssertionError as err:
            failures.append(str(err))
        try:
            check_no_overcommit(reports, {gpu: 80 << 30 for gpu in range(4)})
        except AssertionError as err:
            failures.append(str(err))
        states = {job["id"]: job["state"] for job in client.status()}
        failures += [f"job {job_id} ended {state}" for job_id, state in sorted(states.items()) if state != "succeeded"]
        failures += [f"doctor: {p.severity}: {p.message}" for p in doctor.check(StateDir(home))]
        return failures
    finally:
        client.cleanup()


def concurrency_soak(home: Path, processes: int, operations: int, seed: int) -> list[str]:
    from tests.test_concurrency import ingest_between_reads, run_workload, settle, verify

    work = home.parent / "work"
    work.mkdir(exist_ok=True)
    client = Gpuq(home, make_env(home), work)
    try:
        client.run("daemon", "start")
        visibility = not ingest_between_reads(StateDir(home.parent / "probe"))
        done = run_workload(home, client.env, processes, operations, seed)
        submitted = sum(len(log.submitted) for log in done.clients)
        print(f"{processes} clients x {operations} operations: {submitted} jobs in {done.seconds:.1f}s; settling")
        settle(home, client.env, done, timeout=max(600.0, submitted * 1.0))
        failures = verify(home, done, visibility=visibility)
        if not visibility:
            unseen = sum(len(log.unseen) for log in done.clients)
            print(f"note: {unseen} reads missed a job being ingested (the known race in jobs/store.py); not counted")
        failures += [f"doctor: {p.severity}: {p.message}" for p in doctor.check(StateDir(home))]
        return failures
    finally:
        client.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the crash soak submits and kills")
    parser.add_argument("--wave", type=int, default=20, help="jobs submitted between kills")
    parser.add_argument("--concurrency", action="store_true", help="run the many-clients workload instead")
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--operations", type=int, default=500)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--keep", action="store_true", help="keep the state directory for a look afterwards")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="gpuq soak "))
    home = scratch / "state dir 'quoted'"
    print(f"seed {args.seed}, state directory {home}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # cleanup runs on kill too
    started = time.monotonic()
    try:
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
