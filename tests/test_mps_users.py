"""Packing across users: one MPS control daemon per (GPU, user), on the fake MPS, in a shared queue with a
root daemon and two real Unix users (the pattern of tests/test_shared.py; run under
`flock /tmp/gpuq-users.lock`). Each user's packed jobs run behind a server of their own, started as them in
a folder only they reach, on one GPU at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FAKE_CUDA, ROOT, wait_for
from tests.test_shared import HAS_TOOLS, SharedQueue, User, unix_users
from tests.test_shared import queue as queue  # the fixture: a shared queue's files, as root

USERS = ("gqmann", "gqmben")
DONE = ("succeeded", "failed", "cancelled", "timeout", "lost")

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"), reason="needs root and useradd to create real users"
)


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users(USERS, admins=None) as found:
        yield found


def _start(queue: SharedQueue) -> None:
    queue.config.write_text(f'home = "{queue.home}"\n[shared]\n')
    env = {
        **queue.env(None),
        "GPUQ_FAKE_GPUS": "1x80GiB",
        "GPUQ_FAKE_MPS": "1",
        "GPUQ_KILL_GRACE": "1",
        "PYTHONPATH": str(ROOT),
    }
    log = (queue.base / "daemon.out").open("ab")
    queue.daemon = subprocess.Popen(
        [sys.executable, "-m", "gpuq_scheduler.launcher.daemon", "--shared"], env=env, cwd=ROOT, stdout=log, stderr=log
    )
    wait_for(lambda: (queue.home / "daemon.pid").exists(), 20, "the shared daemon to start")


def _job(queue: SharedQueue, gib: float, seconds: float) -> tuple[str, ...]:
    """A packed job that says which pipe its fence is behind, who owns that folder and runs its control
    daemon, then holds ``gib`` GiB against its fence (tests/fixtures/fake_cuda.py)."""
    script = (
        'pipe="$CUDA_MPS_PIPE_DIRECTORY"; echo "pipe=$pipe"; echo "folder=$(stat -c "%u %a" "$pipe/..")"; '
        'echo "control=$(stat -c %u /proc/$(cat "$pipe/control.pid"))"; '
        f"exec {queue.python} {queue.base / 'fake_cuda.py'} {gib} {seconds}"
    )
    return ("sh", "-c", script)


def _said(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in Path(log).read_text().splitlines() if "=" in line[:8])


def test_two_users_packed_jobs_share_a_gpu_each_behind_their_own_control_daemon(
    queue: SharedQueue, users: dict[str, User]
) -> None:
    ann, ben = users["gqmann"], users["gqmben"]
    shutil.copy(FAKE_CUDA, queue.base / "fake_cuda.py")
    (queue.base / "fake_cuda.py").chmod(0o644)
    _start(queue)
    first = queue.submit(ann, "--mem", "4G", *_job(queue, 3, 4))
    second = queue.submit(ben, "--mem", "4G", *_job(queue, 3, 4))
    liar = queue.submit(ben, "--mem", "4G", *_job(queue, 20, 1))
    ann_pipe = queue.home / "mps" / "GPU-fake-0000" / str(ann.uid) / "pipe"
    wait_for(lambda: (ann_pipe / "control.pid").exists(), 20, "ann's control daemon")
    # Ben, as the attacker would: ann's pipe is out of his reach (her folder is hers alone, mode 0700).
    probe = "import os, sys\ntry:\n    os.listdir(sys.argv[1])\n    print('reached')\n" + (
        "except PermissionError:\n    print('refused')\n"
    )
    assert queue.python_as(ben, probe, str(ann_pipe)).strip() == "refused"
    queue.wait(ann, first)
    queue.wait(ben, second, liar)
    records = queue.records()
    a, b, lie = records[first], records[second], records[liar]
    assert (a["state"], b["state"]) == ("succeeded", "succeeded"), (a, b)
    assert a["gpus"] == b["gpus"] == [0]
    assert a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"]  # at once, on one GPU
    assert lie["state"] == "failed" and lie["cause"] == "oom-past-share"
    assert lie["reason"] == "CUDA out of memory at its 4.0G share (--mem 4.0G) (exit code 1)"
    seen = {user.uid: _said(record["log"]) for user, record in ((ann, a), (ben, b))}
    assert seen[ann.uid]["pipe"] != seen[ben.uid]["pipe"]
    for user in (ann, ben):
        said = seen[user.uid]
        assert said["pipe"] == str(queue.home / "mps" / "GPU-fake-0000" / str(user.uid) / "pipe")
        assert said["folder"] == f"{user.uid} 700" and said["control"] == str(user.uid)
        assert "fence: 5368709120" in Path(records[first if user is ann else second]["log"]).read_text()
    wait_for(lambda: not list((queue.home / "mps").glob("GPU-*/*/pipe")), 20, "both control daemons to quit")
    for user in (ann, ben):
        left = subprocess.run(["pgrep", "-u", str(user.uid), "-f", "fake_mps.py"], capture_output=True, text=True)
        assert left.stdout == "", f"{user.name}'s control daemon outlived its jobs"
