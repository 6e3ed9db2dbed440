"""Another user's submit during a flood of requests over the per-user cap, revisions side by side (issue 38).

A root shared daemon (fake GPUs, ``max_queued_per_user = 1000``, the queue paused so that nothing starts) per
revision and round. One real user writes ``--flood`` submit requests by hand into the spool, as fast as he
can, and pokes the daemon; meanwhile another real user submits one job after another through the client's
own path (``outbox.post_submit``: spool file, then the daemon's answer) and times each, from writing the
request to holding its id. Printed per revision: that latency while the flood is being read (median, 90th
percentile, worst), before the flood (idle), how long the daemon took to empty the spool of the flood, and
the rows the flood left in the table.

Needs root (it makes the users gqbflood and gqbother if missing, and removes those it made):

    sudo .venv/bin/python bench/flood_cap.py 34565a6 HEAD [--flood 3000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pwd
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import revisions

USERS = ("gqbflood", "gqbother")

FLOOD = r"""
import json, os, sys, time
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import StateDir
s, count = StateDir(sys.argv[1]), int(sys.argv[2])
spec = JobSpec(("true",), os.getcwd(), gpus=1).to_json()
for at in range(count):
    body = {"schema": 1, "kind": "submit", "submitted_at": time.time(), "spec": spec}
    write_atomic(s.token_request(os.urandom(16).hex()), json.dumps(body).encode(), durable=False)
    if at % 100 == 99:
        outbox.poke(s)
outbox.poke(s)
"""

# Submits until the file argv[2] exists, one after another; prints each submit-to-id latency in seconds.
OTHER = r"""
import json, os, sys, time
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.statedir import StateDir
s, stop, most = StateDir(sys.argv[1]), sys.argv[2], int(sys.argv[3])
spec = JobSpec(("true",), os.getcwd(), gpus=0).to_json()
took = []
while not os.path.exists(stop) and len(took) < most:
    begin = time.perf_counter()
    outbox.post_submit(s, spec, submitted_at=time.time(), patience=300)
    took.append(time.perf_counter() - begin)
    time.sleep(0.02)
print(json.dumps(took))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revs", nargs="+")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--flood", type=int, default=3000)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the bench runs a shared queue's root daemon and two real users")
    made = [name for name in USERS if subprocess.run(["id", name], capture_output=True).returncode != 0]
    for name in made:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", name], check=True)
    work = Path(tempfile.mkdtemp(prefix="gpuq-flood-"))
    work.chmod(0o755)
    try:
        with revisions.worktrees(work, args.revs):
            subprocess.run(["chmod", "-R", "a+rX", str(work)], check=True)
            print(
                f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
                f"a flood of {args.flood} requests over max_queued_per_user = 1000"
            )
            print("rev       round  idle ms (median)  during flood ms: median  p90     worst   n   drained s  rows")
            for round_, rev in revisions.turns(args):
                row = one(work, rev, round_, args.flood)
                print(
                    f"{rev:9} {round_:5}  {row['idle']:16.1f}  {row['median']:23.1f}  {row['p90']:6.1f}  "
                    f"{row['worst']:6.1f}  {row['n']:3}  {row['drained']:9.2f}  {row['rows']}",
                    flush=True,
                )
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["rm", "-rf", str(work)])


def one(work: Path, rev: str, round_: int, flood: int) -> dict[str, float]:
    base = work / f"q-{rev}-{round_}"
    base.mkdir(mode=0o755)
    home, config, stop = base / "queue", base / "config.toml", base / "stop"
    config.write_text(f'home = "{home}"\n[shared]\nmax_queued_per_user = 1000\n')
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "GPUQ_HOME": str(home),
        "GPUQ_SYSTEM_CONFIG": str(config),
        "GPUQ_CONFIG": str(base / "none.toml"),
        "LANG": "C.UTF-8",
        "GPUQ_FAKE_GPUS": "1x80GiB",
        "PYTHONPATH": f"{work / f'pkg-{rev}'}:{site}",
    }
    python = os.path.realpath(sys.executable)
    users_python = _python_for_users()
    with (base / "daemon.out").open("wb") as log:
        daemon = subprocess.Popen(
            [python, "-S", "-m", "gpuq_scheduler.launcher.daemon", "--shared"],
            env=env,
            cwd=work,
            stdout=log,
            stderr=log,
        )
    try:
        _wait(lambda: (home / "daemon.ready").exists(), 30)
        paused = subprocess.run(
            [python, "-S", "-m", "gpuq_scheduler.launcher.cli.entry", "pause"],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
        )
        if paused.returncode:
            raise SystemExit(f"{rev}: gpuq pause: {paused.stderr.strip()}")
        user_env = {**env, "PYTHONPATH": str(work / f"pkg-{rev}")}  # the users' clients need only the stdlib
        idle = json.loads(_as(USERS[1], users_python, OTHER, user_env, str(home), str(stop), "5").stdout)
        other = _start_as(USERS[1], users_python, OTHER, user_env, str(home), str(stop), "100000")
        begun = time.monotonic()
        _as(USERS[0], users_python, FLOOD, user_env, str(home), str(flood))
        spool = home / "spool"
        _wait(lambda: not any(p.name.startswith("submit-") for p in spool.iterdir()), 600)
        drained = time.monotonic() - begun
        stop.touch()
        out, err = other.communicate(timeout=300)
        if other.returncode:
            raise SystemExit(f"{rev}: the other user's submits failed: {err}")
        during = sorted(json.loads(out)) or [0.0]
        flooder = pwd.getpwnam(USERS[0]).pw_uid
        rows = sqlite3.connect(home / "jobs.db").execute("SELECT COUNT(*) FROM jobs WHERE uid=?", (flooder,))
        return {
            "idle": 1000 * statistics.median(idle),
            "median": 1000 * statistics.median(during),
            "p90": 1000 * during[math.ceil(0.9 * len(during)) - 1],
            "worst": 1000 * during[-1],
            "n": len(during),
            "drained": drained,
            "rows": rows.fetchone()[0],
        }
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)


def _python_for_users() -> str:
    """An interpreter any user may run (the users' clients need only the standard library)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (os.path.realpath(sys.executable), f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        path = Path(candidate)
        if path.exists() and all(p.stat().st_mode & 0o001 for p in [path, *path.parents]):
            return str(path)
    raise SystemExit(f"no {version} that other users may run (looked in /usr/bin, /usr/local/bin)")


def _as(name: str, python: str, code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    entry = pwd.getpwnam(name)
    done = subprocess.run(
        [python, "-S", "-c", code, *args],
        env={**env, "HOME": "/tmp", "USER": name},
        cwd="/tmp",
        user=entry.pw_uid,
        group=entry.pw_gid,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"as {name}: {done.stderr.strip()}")
    return done


def _start_as(name: str, python: str, code: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    entry = pwd.getpwnam(name)
    return subprocess.Popen(
        [python, "-S", "-c", code, *args],
        env={**env, "HOME": "/tmp", "USER": name},
        cwd="/tmp",
        user=entry.pw_uid,
        group=entry.pw_gid,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(condition: object, timeout: float) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.02)


if __name__ == "__main__":
    main()
