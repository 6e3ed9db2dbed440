"""Suspending on a shared queue (#28): a teammate cannot suspend or resume another user's job, through the
client or by writing the request by hand; its owner can.

Real Unix users against a root `--shared` daemon, set up as tests/test_shared.py does (its fixtures are
reused, with users of our own: gqpalice, gqpmallory). Runs as root (CI does), under the users' flock:
`flock /tmp/gpuq-users.lock python -m pytest tests/test_suspend_shared.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import wait_for
from tests.test_shared import HAS_TOOLS, SharedQueue, User, unix_users
from tests.test_shared import queue as queue  # the fixture, over our users

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"),  # CI runs as root: there a missing tool is a failure
    reason="needs root and useradd/groupadd to create real users",
)

NAMES = ("gqpalice", "gqpmallory")

# What mallory writes with the client's own writer, bypassing its checks (argv[1]: the queue, argv[2]: the
# action, argv[3]: the job id).
BY_HAND = """
import sys
from pathlib import Path
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.statedir import StateDir
state = StateDir(Path(sys.argv[1]))
outbox.write_control(state, sys.argv[2], [int(sys.argv[3])])
outbox.poke(state)
"""


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users(NAMES) as found:
        yield found


def _events(queue: SharedQueue, job: int, kind: str) -> list[dict[str, object]]:
    lines = (queue.home / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("job") == job and e.get("event") == kind]


def _same_from_click(queue: SharedQueue, user: User, quick: subprocess.CompletedProcess[str], *args: str) -> bool:
    """Whether click's command (``launcher.cli.app``, no quick path) answers as the quick path did."""
    clicked = queue.gpuq(user, *args, check=False, module="gpuq_scheduler.launcher.cli.app")
    return (clicked.returncode, clicked.stdout, clicked.stderr) == (quick.returncode, quick.stdout, quick.stderr)


def test_another_user_cannot_suspend_or_resume_your_job(queue: SharedQueue, users: dict[str, User]) -> None:
    alice, mallory = users["gqpalice"], users["gqpmallory"]
    queue.start(gpus="1x80GiB")
    job = queue.submit(alice, "--gpus", "1", "sleep", "120")
    wait_for(lambda: queue.records(alice)[job]["state"] == "running", 30, "alice's job to run")
    refused = queue.gpuq(mallory, "suspend", str(job), check=False)
    assert refused.returncode == 2
    assert refused.stderr == f"gpuq: job {job} belongs to gqpalice; only gqpalice or an admin can suspend it\n"
    assert _same_from_click(queue, mallory, refused, "suspend", str(job))
    queue.python_as(mallory, BY_HAND, str(queue.home), "suspend", str(job))
    wait_for(lambda: _events(queue, job, "suspend-refused"), 30, "the daemon to refuse mallory's suspend")
    assert queue.records(alice)[job]["state"] == "running" and queue.records(alice)[job]["step"] is None
    queue.gpuq(alice, "suspend", str(job))
    wait_for(lambda: queue.records(alice)[job]["state"] == "suspended", 30, "alice's suspend")
    refused = queue.gpuq(mallory, "resume", str(job), check=False)
    assert refused.returncode == 2 and "only gqpalice or an admin can resume it" in refused.stderr
    assert _same_from_click(queue, mallory, refused, "resume", str(job))
    queue.python_as(mallory, BY_HAND, str(queue.home), "resume", str(job))
    wait_for(lambda: _events(queue, job, "resume-refused"), 30, "the daemon to refuse mallory's resume")
    assert queue.records(alice)[job]["state"] == "suspended"
    queue.gpuq(alice, "resume", str(job))
    wait_for(lambda: queue.records(alice)[job]["state"] == "running", 30, "alice's resume")
    queue.gpuq(alice, "cancel", str(job))
    wait_for(lambda: queue.records(alice)[job]["state"] == "cancelled", 30, "alice's cancel")
