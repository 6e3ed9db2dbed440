"""The shared queue's daemon as users meet it (issue 25): `daemon start` returns once it is ready, the
systemd unit's own command runs it, and users read and submit with it stopped or killed again and again.
Real users and a root daemon on fake GPUs, as in tests/test_shared_security.py, whose users it shares.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys

import pytest

from tests.conftest import ROOT, wait_for
from tests.test_shared import HAS_TOOLS, SharedQueue, User, queue
from tests.test_shared_security import ADMINS, shared, users

__all__ = ["queue", "shared", "users"]  # the fixtures

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"), reason="needs root and useradd/groupadd to create real users"
)


def test_daemon_start_returns_once_ready_and_says_when_the_daemon_died(
    shared: SharedQueue, users: dict[str, User]
) -> None:
    """`daemon start --shared` then at once a user's `--gpus 1` (refused "more GPUs than this machine has
    (0)" when start returned before the daemon had seen its GPUs); a daemon that cannot run is reported
    with its log's words, not as "running"; setup refuses an admins group that does not exist."""
    etc, home = shared.base / "etc", shared.base / "q2"
    etc.mkdir()
    env = {
        **shared.env(None),
        "GPUQ_SYSTEM_CONFIG": str(etc / "config.toml"),
        "GPUQ_UNIT_DIR": str(shared.base),
        "PYTHONPATH": str(ROOT),
        "GPUQ_FAKE_GPUS": "2x80GiB",
    }
    del env["GPUQ_HOME"]
    root = [sys.executable, "-m", "gpuq_scheduler.launcher.cli.app"]

    def as_root(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*root, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)

    refused = as_root("daemon", "setup", "--admins", "gqs-no-such-group", "--home", str(home))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "no group" in refused.stderr
    assert not (etc / "config.toml").exists() and not home.exists()  # nothing changed
    assert as_root("daemon", "setup", "--admins", ADMINS, "--home", str(home)).returncode == 0
    try:
        started = as_root("daemon", "start", "--shared")
        assert started.returncode == 0 and "running" in started.stdout, started.stderr
        assert (home / "gpus.json").exists()  # seen its GPUs before it said it runs
        dave = users["dave"]
        user_env = {**shared.env(dave), "GPUQ_SYSTEM_CONFIG": str(etc / "config.toml")}
        del user_env["GPUQ_HOME"]
        submitted = subprocess.run(
            [shared.python, "-m", "gpuq_scheduler", "submit", "--gpus", "1", "true"],
            env=user_env,
            cwd=dave.home,
            user=dave.uid,
            group=dave.gid,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert submitted.returncode == 0 and submitted.stdout.startswith("submitted job"), submitted.stderr
        status = subprocess.run(
            [shared.python, "-m", "gpuq_scheduler", "daemon", "status", "--json"],
            env=user_env,
            cwd=dave.home,
            user=dave.uid,
            group=dave.gid,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(status.stdout)["running"] is True, status.stderr  # users see it run, lock or not
        # What every user reads is root's to write (the trust table): mallory changes none of it, nor adds a
        # file beside it for the daemon or a client to read.
        attempt = (
            "import sys\nfor path in sys.argv[1:]:\n    try:\n        open(path, 'a').close()\n"
            "        print('wrote', path)\n    except OSError:\n        pass\n"
        )
        public = (
            "gpus.json",
            "daemon.pid",
            "daemon.ready",
            "daemon.log",
            "jobs.db",
            "jobs.db-wal",
            "jobs.db-shm",
            "notices/pass.json",
            "notices/planted.json",
            "planted",
        )
        assert all((home / name).exists() for name in ("gpus.json", "daemon.pid", "jobs.db"))
        assert shared.python_as(users["mal"], attempt, *(str(home / name) for name in public)).strip() == ""
    finally:
        as_root("daemon", "stop")
    # Nobody but root can take the daemon's lock (flock needs no write access), to keep it from starting.
    take = (
        "import fcntl, sys\ntry:\n    fcntl.flock(open(sys.argv[1]), fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "    print('taken')\nexcept OSError:\n    print('refused')\n"
    )
    assert shared.python_as(users["mal"], take, str(home / "daemon.lock")).strip() == "refused"
    config = etc / "config.toml"
    config.write_text(config.read_text().replace(ADMINS, "gqs-gone-group"))  # the group was deleted since
    died = as_root("daemon", "start", "--shared")
    assert died.returncode == 2 and "running" not in died.stdout, died.stdout
    assert died.stderr.count("\n") == 1 and "gqs-gone-group" in died.stderr and "does not exist" in died.stderr


def test_the_systemd_units_own_command_starts_a_daemon_that_serves_a_job(
    shared: SharedQueue, users: dict[str, User]
) -> None:
    """The unit named `-m launcher.daemon.lifetime`, a module that no longer exists: run its ExecStart as is."""
    etc, units, home = shared.base / "etc", shared.base / "units", shared.base / "q3"
    etc.mkdir()
    units.mkdir()
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "GPUQ_SYSTEM_CONFIG": str(etc / "config.toml"),
        "GPUQ_UNIT_DIR": str(units),
        "GPUQ_FAKE_GPUS": "2x80GiB",
        "LANG": "C.UTF-8",
    }
    setup = subprocess.run(
        [sys.executable, "-m", "gpuq_scheduler.launcher.cli.app", "daemon", "setup", "--home", str(home)],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert setup.returncode == 0, setup.stderr
    unit = (units / "gpuq.service").read_text()
    command = shlex.split(next(line for line in unit.splitlines() if line.startswith("ExecStart=")).split("=", 1)[1])
    log = (shared.base / "unit.out").open("ab")
    daemon = subprocess.Popen(command, env=env, cwd="/", stdout=log, stderr=log)  # as systemd would: no PYTHONPATH
    try:
        wait_for(lambda: (home / "daemon.ready").exists() or daemon.poll() is not None, 30, "the unit's daemon")
        assert daemon.poll() is None, (shared.base / "unit.out").read_text()
        dave = users["dave"]
        user_env = {**shared.env(dave), "GPUQ_SYSTEM_CONFIG": str(etc / "config.toml")}
        del user_env["GPUQ_HOME"]
        ran = subprocess.run(
            [shared.python, "-m", "gpuq_scheduler", "submit", "--wait", "--gpus", "1", "sh", "-c", "id -u"],
            env=user_env,
            cwd=dave.home,
            user=dave.uid,
            group=dave.gid,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 0, ran.stderr
        job = int(ran.stdout.split()[-1])
        assert (home / "logs" / f"{job}.log").read_text().strip() == str(dave.uid)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)


def test_users_read_and_submit_with_the_daemon_stopped_or_killed(shared: SharedQueue, users: dict[str, User]) -> None:
    """After a clean `daemon stop` the table's -shm was gone and users got "attempt to write a readonly
    database" from status, show, submit and wait; the same after a kill -9 once root had read the table."""
    shared.start()
    dave = users["dave"]
    job = shared.submit(dave, "--gpus", "0", "true")
    shared.wait(dave, job)
    shared.stop()  # SIGTERM: a clean stop
    assert str(job) in shared.gpuq(dave, "status", "--all").stdout
    assert shared.gpuq(dave, "show", str(job)).returncode == 0
    assert shared.gpuq(dave, "wait", str(job)).returncode == 0
    queued = shared.gpuq(dave, "submit", "--gpus", "0", "true")
    assert queued.stdout == "" and queued.stderr.count("\n") == 1 and "no id yet" in queued.stderr
    api = (  # the Python API raises NoIdYet, naming the request, rather than return an id that may prove untrue
        "import json\nfrom gpuq_scheduler import submit\nfrom gpuq_scheduler.jobs.errors import NoIdYet\n"
        "try:\n    print(json.dumps({'id': submit(['true'], gpus=0)}))\n"
        "except NoIdYet as queued:\n    print(json.dumps({'request': queued.request}))\n"
    )
    token = json.loads(shared.python_as(dave, api))["request"]
    shared.start()  # the queued jobs get their ids and run
    answer = "import sys\ntry:\n    print(open(sys.argv[1]).read().strip())\nexcept OSError:\n    print(0)\n"
    by_api = wait_for(lambda: int(shared.python_as(dave, answer, str(shared.home / "answers" / token))), 30)
    done = lambda: [i for i, r in shared.records(dave).items() if i > job and r["state"] == "succeeded"]  # noqa: E731
    later = wait_for(lambda: len(done()) == 2 and done(), 30, "both queued jobs to run")
    assert by_api in later
    assert shared.daemon is not None
    os.kill(shared.daemon.pid, signal.SIGKILL)
    shared.daemon.wait(20)
    shared.daemon = None
    shared.gpuq(None, "status", "--all")  # root's connection, the last to close, takes the -shm with it
    assert str(later[0]) in shared.gpuq(dave, "status", "--all").stdout
    assert shared.gpuq(dave, "show", str(later[0])).returncode == 0


BURST = r"""
import json, sys
from gpuq_scheduler import submit
from gpuq_scheduler.jobs.errors import GpuqError, NoIdYet
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.statedir import StateDir
ids, tokens, failed = [], [], []
for n in range(int(sys.argv[1])):
    try:
        ids.append(submit(["true"], gpus=0))
    except NoIdYet as queued:
        tokens.append(queued.request)
    except GpuqError as err:
        failed.append(f"submit: {err}")
    try:
        Queue(StateDir.from_env()).records()
    except GpuqError as err:
        failed.append(f"status: {err}")
print(json.dumps({"ids": ids, "tokens": tokens, "failed": failed}))
"""


def test_submits_and_reads_during_kill_9_bursts_lose_duplicate_and_fail_nothing(
    shared: SharedQueue, users: dict[str, User]
) -> None:
    """1 submit in 300 failed "attempt to write a readonly database" while root's daemon was killed again
    and again. Now each submit gets its id or is queued without one, each read works, and every submit ends
    up as exactly one of dave's jobs, whichever daemon read it."""
    shared.start()
    dave, count = users["dave"], 40
    burst = subprocess.Popen(
        [shared.python, "-c", BURST, str(count)],
        env=shared.env(dave),
        cwd=dave.home,
        user=dave.uid,
        group=dave.gid,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for kill in range(5):
        wait_for(lambda kill=kill: len(shared.records(dave)) > kill * 5 or burst.poll() is not None, 60, "submits")
        assert shared.daemon is not None
        os.kill(shared.daemon.pid, signal.SIGKILL)
        shared.daemon.wait(20)
        shared.gpuq(None, "status", "--all")  # root's read, the last connection to close
        shared.start()
    out, err = burst.communicate(timeout=300)
    assert burst.returncode == 0, err
    done = json.loads(out)
    assert done["failed"] == []
    answer = "import sys\ntry:\n    print(open(sys.argv[1]).read().strip())\nexcept OSError:\n    print(0)\n"
    for token in done["tokens"]:
        path = str(shared.home / "answers" / token)
        done["ids"].append(wait_for(lambda path=path: int(shared.python_as(dave, answer, path)), 30, "an answer"))
    mine = wait_for(lambda: len(r := shared.records(dave)) >= count and r, 60, "every submit in the table")
    assert sorted(done["ids"]) == sorted(mine) and len(set(done["ids"])) == count  # none lost, none twice
    assert all(record["user"] == "gqsdave" for record in mine.values())


# What a read-write connection does first when it opens the table's -shm and no other connection holds it
# (SQLite's unixLockSharedMemory: the dead-man-switch byte 128 taken exclusive, the file truncated, the byte
# kept shared); its first read then rebuilds the index. Held here, as root, for as long as the test needs the
# moment that a real connection (root's daemon starting, root's `gpuq status`) passes through in microseconds.
FIRST_OPEN = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)
os.ftruncate(fd, 3)
fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 128)
print("opened", flush=True)
sys.stdin.read()
"""
# Dave, at that moment: SQLite's own read fails as the bursts' submit once did; gpuq's read says when it waits
# (its first sleep), then prints what it read.
READ_MEANWHILE = r"""
import json, sqlite3, sys, time
try:
    sqlite3.connect(sys.argv[1], isolation_level=None).execute("PRAGMA user_version")
    print("read", flush=True)
except sqlite3.OperationalError as err:
    print(err.sqlite_errorcode, err, flush=True)
sleep = time.sleep
def told(seconds):
    print("waiting", flush=True)
    time.sleep = sleep
    sleep(seconds)
time.sleep = told
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.statedir import StateDir
print(json.dumps(sorted(r.id for r in Queue(StateDir.from_env()).records())), flush=True)
"""


def test_a_users_read_waits_while_root_rebuilds_the_tables_index_after_a_kill_9(
    shared: SharedQueue, users: dict[str, User]
) -> None:
    """The kill -9 bursts once failed "attempt to write a readonly database": a user's connection, which cannot
    write the -shm, mapped it while a root connection that opened it first had truncated it and not yet rebuilt
    it, and SQLite fails such a reader at once (SQLITE_READONLY_RECOVERY) where a writer would wait. Now
    gpuq's reader waits for the index, and reads."""
    shared.start()
    dave = users["dave"]
    job = shared.submit(dave, "--gpus", "0", "true")
    shared.wait(dave, job)
    assert shared.daemon is not None
    os.kill(shared.daemon.pid, signal.SIGKILL)  # its -wal and -shm stay
    shared.daemon.wait(20)
    shared.daemon = None
    db = shared.home / "jobs.db"
    root = subprocess.Popen(
        [sys.executable, "-c", FIRST_OPEN, f"{db}-shm"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    reader = None
    try:
        assert root.stdout is not None and root.stdout.readline().strip() == "opened"
        reader = subprocess.Popen(
            [shared.python, "-c", READ_MEANWHILE, str(db)],
            env=shared.env(dave),
            cwd=dave.home,
            user=dave.uid,
            group=dave.gid,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert reader.stdout is not None
        said = reader.stdout.readline().strip()
        assert said == "264 attempt to write a readonly database", said  # SQLite's own read, at that moment
        waiting = reader.stdout.readline().strip()
        assert waiting == "waiting", (waiting, reader.stderr.read() if reader.stderr else "")
        rebuilt = sqlite3.connect(db, isolation_level=None)  # root's connection reads: the index is rebuilt
        assert rebuilt.execute("SELECT count(*) FROM jobs").fetchone()[0] >= 1
        rebuilt.close()
        out, err = reader.communicate(timeout=60)
        assert reader.returncode == 0, err
        assert job in json.loads(out), out
    finally:
        if root.stdin is not None:
            root.stdin.close()
        root.wait(20)
        if reader is not None and reader.poll() is None:
            reader.kill()
            reader.wait()
