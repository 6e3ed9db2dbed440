"""The crash soak (``bench/soak.py``, the default): it measures whether gpuq loses or repeats work when its
daemon dies at any moment. Waves of mixed jobs (tests/fixtures/report.py, on 4 fake 80 GiB GPUs) are
submitted while the daemon is killed with SIGKILL at random and restarted, until the time is up; then the
jobs' own reports must show every job ran exactly once, no GPU over-committed or shared by a whole-GPU
job, every job succeeded, and `gpuq doctor` finds nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from pathlib import Path

from gpuq_scheduler.jobs import api
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.views import doctor
from tests.conftest import REPORT, Gpuq, make_env, read_reports
from tests.invariants import check_exactly_once, check_no_overcommit

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
    from gpuq_scheduler.launcher.daemon.lifetime import running_pid

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
        journal = [json.loads(line) for line in (home / "events.jsonl").read_text().splitlines()]
        handed = sum(1 for e in journal if e.get("event") == "started" and "after" in e)
        print(f"{handed} of {len(ids)} jobs were started by a hand-off from the shim of the job before them")
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
