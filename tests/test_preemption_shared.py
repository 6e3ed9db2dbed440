"""Preemption on a shared queue (#28): the admin's config turns it on and makes lower priority, or a user's
use over their fair share, preemptible; a user with a higher priority, or one under their fair share, takes
the GPU of another user's job, which resumes after.

Real Unix users against a root `--shared` daemon, set up as tests/test_shared.py does (its fixtures are
reused, with users of our own: gqpurgent, gqpsweep). Runs as root (CI does), under the users' flock:
`flock /tmp/gpuq-users.lock python -m pytest tests/test_preemption_shared.py`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

import pytest

from tests.conftest import wait_for
from tests.test_shared import HAS_TOOLS, SharedQueue, User, unix_users
from tests.test_shared import queue as queue  # the fixture, over our users

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"),  # CI runs as root: there a missing tool is a failure
    reason="needs root and useradd/groupadd to create real users",
)

NAMES = ("gqpurgent", "gqpsweep")
CONFIG = """preemption = true
preemption_min_runtime = "1s"
preemption_by = ["priority"]
[shared.priority]
gqpurgent = 10
"""


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users(NAMES) as found:
        yield found


def test_a_users_priority_preempts_another_users_job_by_the_admins_policy(
    queue: SharedQueue, users: dict[str, User]
) -> None:
    urgent_user, sweep_user = users["gqpurgent"], users["gqpsweep"]
    queue.start(shared=CONFIG, gpus="1x80GiB")
    sweep = queue.submit(sweep_user, "--gpus", "1", "sleep", "300")  # not --preemptible: by policy
    wait_for(lambda: queue.records()[sweep]["state"] == "running", 30, "the sweep to run")
    urgent = queue.submit(urgent_user, "--gpus", "1", "sleep", "3")
    shown = wait_for(lambda: (r := queue.records()[sweep])["state"] == "suspended" and r, 60, "the sweep suspended")
    assert shown["reason"].startswith(f"suspended for job {urgent} (gqpurgent's priority 10 > 0)")
    wait_for(lambda: queue.records()[urgent]["state"] == "succeeded", 60, "the urgent job to run and end")
    wait_for(lambda: queue.records()[sweep]["state"] == "running", 60, "the sweep to resume")
    events = [json.loads(line) for line in (queue.home / "events.jsonl").read_text().splitlines()]
    preempted = [e for e in events if e.get("event") == "preempted"]
    assert [(e["job"], e["for"]) for e in preempted] == [(sweep, urgent)]
    # The sweep's owner sees it in `gpuq show`, though the journal is root's: the time suspended at least.
    assert re.search(r"^preempted +\S+ suspended$", queue.gpuq(sweep_user, "show", str(sweep)).stdout, re.M)
    queue.gpuq(sweep_user, "cancel", str(sweep))
    wait_for(lambda: queue.records()[sweep]["state"] == "cancelled", 30, "the sweep's cancel")


FAIR_SHARE = """preemption = true
preemption_min_runtime = "1s"
preemption_by = ["fair_share"]
"""


def test_a_user_over_their_fair_share_is_preempted_for_a_user_under_it(
    queue: SharedQueue, users: dict[str, User]
) -> None:
    """One GPU, both users of one priority, neither job --preemptible: the sweep's user has all the GPU use
    (over an equal share of it among the users with jobs here), the other none, so the other's job takes the
    GPU by fair share alone. Once it ended, the sweep resumes by itself."""
    under_user, over_user = users["gqpurgent"], users["gqpsweep"]
    queue.start(shared=FAIR_SHARE, gpus="1x80GiB")
    sweep = queue.submit(over_user, "--gpus", "1", "sleep", "300")
    wait_for(lambda: queue.records()[sweep]["state"] == "running", 30, "the sweep to run")
    other = queue.submit(under_user, "--gpus", "1", "sleep", "3")
    shown = wait_for(lambda: (r := queue.records()[sweep])["state"] == "suspended" and r, 60, "the sweep suspended")
    assert shown["reason"].startswith(f"suspended for job {other} (gqpsweep is over their fair share)")
    wait_for(lambda: queue.records()[other]["state"] == "succeeded", 60, "the other user's job to run and end")
    wait_for(lambda: queue.records()[sweep]["state"] == "running", 60, "the sweep to resume")
    events = [json.loads(line) for line in (queue.home / "events.jsonl").read_text().splitlines()]
    preempted = [e for e in events if e.get("event") == "preempted"]
    assert [(e["job"], e["for"], e["why"]) for e in preempted] == [(sweep, other, "gqpsweep is over their fair share")]
    queue.gpuq(over_user, "cancel", str(sweep))
    wait_for(lambda: queue.records()[sweep]["state"] == "cancelled", 30, "the sweep's cancel")
