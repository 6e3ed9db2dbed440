"""A shared queue's containment, tested as a real second user would try to get around it.

Runs as root (CI does): creates the user gqcmallory, starts a root daemon (`--shared`) on fake GPUs, and
submits as that user jobs that try to leave their cgroup and leave processes behind. Run it under
`flock /tmp/gpuq-users.lock`, as every test that creates users.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for
from tests.installed import installed_tree
from tests.test_containment import BOMB, MOUNT, WRITABLE, alive, needs_pids
from tests.test_shared import HAS_TOOLS, SharedQueue, User, _python_for_users

NAME = "gqcmallory"

pytestmark = pytest.mark.skipif(
    not (HAS_TOOLS and WRITABLE) and not os.environ.get("CI"),  # CI runs as root on cgroup2: must not skip there
    reason="needs root, useradd and a cgroup v2 hierarchy to create real users and cgroups",
)


@pytest.fixture(scope="module")
def mallory() -> Iterator[User]:
    made = subprocess.run(["id", NAME], capture_output=True).returncode != 0
    if made:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", NAME], check=True)
    entry = pwd.getpwnam(NAME)
    yield User(NAME, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    if made:
        subprocess.run(["userdel", "-r", NAME], capture_output=True)


@pytest.fixture
def queue() -> Iterator[SharedQueue]:
    base = Path(tempfile.mkdtemp(prefix="gpuq-contain-"))
    base.chmod(0o755)
    lib = base / "lib"
    lib.mkdir()
    import click
    import cloudpickle
    import prometheus_client
    import psutil

    needed = (click, psutil, cloudpickle, prometheus_client)
    for package in (installed_tree() / "gpuq_scheduler", *(Path(m.__file__).parent for m in needed)):
        shutil.copytree(package, lib / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    stamps = base / "stamps"
    stamps.mkdir()
    stamps.chmod(0o1777)
    subprocess.run(["chmod", "-R", "a+rX", str(lib)], check=True)
    shared = SharedQueue(base, base / "queue", base / "config.toml", stamps, lib, _python_for_users())
    yield shared
    shared.stop()
    for pid_file in stamps.glob("*.pid"):  # a failed test must not leave its sleepers behind
        subprocess.run(["kill", "-9", pid_file.read_text().strip()], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


def _start(queue: SharedQueue, shared: str = "", **extra: str) -> None:
    queue.config.write_text(f'home = "{queue.home}"\n[shared]\n{shared}')
    queue.config.chmod(0o644)
    env = {**queue.env(None), "GPUQ_FAKE_GPUS": "2x80GiB", "GPUQ_KILL_GRACE": "1", "PYTHONPATH": str(ROOT), **extra}
    log = (queue.base / "daemon.out").open("ab")
    queue.daemon = subprocess.Popen(
        [sys.executable, "-m", "gpuq_scheduler.launcher.daemon", "--shared"],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    wait_for(lambda: (queue.home / "daemon.pid").exists(), 20, "the shared daemon to start")


def test_a_users_job_cannot_leave_its_cgroup_and_what_it_leaves_behind_ends_with_it(
    queue: SharedQueue, mallory: User
) -> None:
    """Mallory's job tries to move itself out of its cgroup (into the hierarchy's root), then leaves a
    sleeper behind with a new session and an empty environment. The move is refused; the sleeper ends with
    the job, counted; the record says so."""
    _start(queue)
    stamps = queue.stamps
    script = (
        f"echo $$ > {MOUNT}/cgroup.procs 2>/dev/null && echo moved > {stamps}/$GPUQ_JOB_ID.escaped; "
        f"setsid env -i sh -c 'echo $$ > {stamps}/'$GPUQ_JOB_ID'.pid; exec sleep 300' & "
        f"while [ ! -s {stamps}/$GPUQ_JOB_ID.pid ]; do sleep 0.05; done"
    )
    job = queue.submit(mallory, "--gpus", "0", "sh", "-c", script)
    queue.wait(mallory, job)
    record = queue.records(mallory)[job]
    sleeper = int((stamps / f"{job}.pid").read_text())
    assert record["state"] == "succeeded", record
    assert not (stamps / f"{job}.escaped").exists()
    assert record["reason"] == "1 process outlived the job and was ended"
    wait_for(lambda: not alive(sleeper), 10, "mallory's sleeper to end")
    assert "containment: cgroup v2 at " in queue.gpuq(mallory, "gpus").stdout


def test_a_root_daemons_fallback_finds_a_users_setsid_child_by_its_marker(queue: SharedQueue, mallory: User) -> None:
    """Without cgroups, a shared queue's shim (root) reads every process's environment: mallory's child in
    a session of its own still carries the job's marker, and ends with the job."""
    _start(queue, GPUQ_CONTAINMENT="fallback")
    stamps = queue.stamps
    script = (
        f"setsid sh -c 'echo $$ > {stamps}/'$GPUQ_JOB_ID'.pid; exec sleep 300' & "
        f"while [ ! -s {stamps}/$GPUQ_JOB_ID.pid ]; do sleep 0.05; done"
    )
    job = queue.submit(mallory, "--gpus", "0", "sh", "-c", script)
    queue.wait(mallory, job)
    record = queue.records(mallory)[job]
    sleeper = int((stamps / f"{job}.pid").read_text())
    assert record["state"] == "succeeded" and record["reason"] == "1 process outlived the job and was ended", record
    wait_for(lambda: not alive(sleeper), 10, "mallory's sleeper to end")
    assert "containment: fallback: process group + session + marker" in queue.gpuq(mallory, "gpus").stdout


# A request written by hand, past the client's check, asking for more processes than the queue allows.
FORGED = (
    "import json, os, sys, time\nfrom gpuq_scheduler.jobs.errors import BadInput\n"
    "from gpuq_scheduler.jobs.model import JobSpec\nfrom gpuq_scheduler.jobs.store import outbox\n"
    "from gpuq_scheduler.jobs.store.atomic import write_atomic\n"
    "from gpuq_scheduler.jobs.store.statedir import StateDir\n"
    "s, token = StateDir(sys.argv[1]), os.urandom(16).hex()\n"
    "spec = JobSpec(('true',), os.getcwd(), gpus=0, options={'pids': 500}).to_json()\n"
    "body = {'schema': 1, 'kind': 'submit', 'submitted_at': time.time(), 'spec': spec}\n"
    "write_atomic(s.token_request(token), json.dumps(body).encode())\noutbox.poke(s)\n"
    "try:\n    print(outbox.await_id(s, token, 60))\nexcept BadInput as err:\n    print(err)\n"
)


@needs_pids
def test_a_shared_queue_holds_a_users_fork_bomb_to_its_default_process_limit(queue: SharedQueue, mallory: User) -> None:
    """#38, finding 5, as mallory: her job without --pids gets the queue's default_pids, one with --pids
    gets that, up to max_pids and never past it (refused at submit, and by the daemon when written by hand)."""
    _start(queue, shared="default_pids = 64\nmax_pids = 100\n")
    stamps = queue.stamps
    bomb = stamps / "bomb.py"
    own = f'open("{stamps}/" + os.environ["GPUQ_JOB_ID"] + ".forked", "w")'  # each job's count apart
    bomb.write_text(BOMB.replace('open("forked", "w")', own))
    for asked, limit in (((), 64), (("--pids", "100"), 100)):
        job = queue.submit(mallory, "--gpus", "0", *asked, queue.python, str(bomb))
        queue.wait(mallory, job)
        record = queue.records(mallory)[job]
        forked = int((stamps / f"{job}.forked").read_text())
        assert record["state"] == "failed" and forked < limit, (record, forked)
        assert record["reason"].startswith(f"reached its limit of {limit} processes; BlockingIOError"), record
    refused = queue.gpuq(mallory, "submit", "--gpus", "0", "--pids", "500", "true", check=False)
    assert refused.returncode == 2 and "--pids 500: this queue allows at most 100 processes per job" in refused.stderr
    told = queue.python_as(mallory, FORGED, str(queue.home))  # past the client: the daemon refuses it too
    assert "set the request aside: it user cap: --pids 500 is more than this queue allows (max_pids 100)" in told
