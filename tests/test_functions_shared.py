"""Python functions as jobs of a shared queue whose daemon is not running (jobs/functions/executor.py): the
submit is queued without an id (NoIdYet), so the pickles the job will run must stay where the job will
look for them. A real user and a root daemon on fake GPUs, as in tests/test_shared_lifetime.py; this
module's user is its own (run it under `flock /tmp/gpuq-users.lock`, as every test that makes users).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.test_shared import HAS_TOOLS, SharedQueue, User, queue

__all__ = ["queue"]  # the fixture, made with this module's users

NAME = "gqzfay"

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"), reason="needs root and useradd/groupadd to create real users"
)


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    made = subprocess.run(["id", NAME], capture_output=True).returncode != 0
    if made:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", NAME], check=True)
    entry = pwd.getpwnam(NAME)
    yield {"fay": User(NAME, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))}
    if made:
        subprocess.run(["userdel", "-r", NAME], capture_output=True)


# What fay runs: a function and an array of it, submitted while nobody runs the queue's daemon.
SUBMIT = """
import json
from gpuq_scheduler import Executor
from gpuq_scheduler.jobs.errors import NoIdYet

def triple(x):
    return 3 * x

executor = Executor(gpus=0)
queued = []
for send in (lambda: executor.submit(triple, 14), lambda: executor.map_array(triple, [1, 2])):
    try:
        send()
        queued.append(None)
    except NoIdYet as err:
        queued.append(err.request)
print(json.dumps({"requests": queued, "folder": str(executor.folder)}))
"""

RESULTS = """
import json, sys
from gpuq_scheduler import Job
print(json.dumps(sorted(Job(int(i)).result(timeout=60) for i in sys.argv[1:])))
"""


def test_a_function_queued_while_the_shared_daemon_is_down_keeps_its_pickles_and_runs_later(
    queue: SharedQueue, users: dict[str, User]
) -> None:
    """A submit the daemon has not given an id is queued all the same: were its pickles removed as for a
    refused submit, the job would run later and find nothing to call."""
    queue.admins = None  # this module makes no admin group
    queue.start()
    queue.stop()
    fay = users["fay"]
    state_home = queue.base / "fay's state"  # fresh for each run: only this test's pickles are in it
    state_home.mkdir()
    os.chown(state_home, fay.uid, fay.gid)
    sent = json.loads(queue.python_as(fay, SUBMIT, env={**queue.env(fay), "XDG_STATE_HOME": str(state_home)}))
    assert sent["folder"] == str(state_home / "gpuq" / "functions")  # the queue's state directory is root's
    assert None not in sent["requests"], sent  # both queued without an id: the daemon is down
    folders = sorted(Path(sent["folder"]).iterdir())
    assert sorted(sorted(p.name for p in f.iterdir()) for f in folders) == [
        ["0.call.pkl"],
        ["0.call.pkl", "1.call.pkl"],
    ], folders
    assert all(p.stat().st_uid == fay.uid for f in folders for p in f.iterdir())
    queue.start()  # the daemon reads the queued requests and runs them
    jobs = wait_for(lambda: len(r := queue.records(fay)) == 3 and r, 30, "fay's three jobs")  # one, and two members

    def ended() -> dict[int, dict[str, object]] | None:
        records = queue.records(fay)
        return records if all(r["state"] in ("succeeded", "failed") for r in records.values()) else None

    done = wait_for(ended, 60, "fay's jobs to end")
    assert [r["state"] for r in done.values()] == ["succeeded"] * 3, done
    assert json.loads(queue.python_as(fay, RESULTS, *map(str, jobs))) == [3, 6, 42]
