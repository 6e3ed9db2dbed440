"""Reservations on a shared queue (#42): the admin's quota of GPU-hours reserved ahead, reserving for another
user and cancelling another's (admins only), and a reservation that runs only its owner's jobs.

Real Unix users against a root `--shared` daemon, as tests/test_shared.py sets them up (its fixtures, with
users of our own: gqralice, gqrbob). Runs as root (CI does), under the users' flock:
`flock /tmp/gpuq-users.lock python -m pytest tests/test_reserve_shared.py`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from tests.conftest import wait_for
from tests.test_shared import HAS_TOOLS, SharedQueue, User, unix_users
from tests.test_shared import queue as queue  # the fixture, over our users

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"),  # CI runs as root: there a missing tool is a failure
    reason="needs root and useradd/groupadd to create real users",
)

NAMES = ("gqralice", "gqrbob")


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users(NAMES) as found:
        yield found


def _refused(queue: SharedQueue, user: User | None, *args: str) -> str:
    result = queue.gpuq(user, "reserve", *args, check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stdout + result.stderr
    return result.stderr


def test_the_quota_bounds_a_users_reservations_and_only_admins_act_for_others(
    queue: SharedQueue, users: dict[str, User]
) -> None:
    alice, bob = users["gqralice"], users["gqrbob"]
    queue.start(shared="reservation_quota = 4", gpus="4x80GiB")
    window = ("--start", "+1h", "--duration", "3h")
    said = _refused(queue, bob, "--gpus", "2", *window)
    assert "gqrbob would hold 6.0 GPU-hours reserved ahead; this queue allows 4 (reservation_quota)" in said
    made = queue.gpuq(bob, "reserve", "--gpus", "1", *window, "--name", "bobs").stdout
    assert "reserved GPU 0 for gqrbob " in made
    assert "only an admin reserves GPUs for another user" in _refused(
        queue, bob, "--gpus", "1", *window, "--user", "gqralice"
    )
    assert "is gqrbob's; only gqrbob or an admin can cancel it" in _refused(queue, alice, "--cancel", "bobs")
    # The admin (root here) has no quota, and reserves for alice.
    made = queue.gpuq(None, "reserve", "--gpus", "3", *window, "--user", "gqralice", "--name", "alices").stdout
    assert "reserved GPUs 1-3 for gqralice " in made
    listed = {r["name"]: r for r in json.loads(queue.gpuq(alice, "reserve", "--list", "--json").stdout)}
    assert (listed["bobs"]["user"], listed["alices"]["user"]) == ("gqrbob", "gqralice")
    assert listed["alices"]["uid"] == alice.uid
    queue.gpuq(None, "reserve", "--cancel", "bobs")  # an admin cancels anyone's

    def ended() -> str:
        found = {r["name"]: r for r in json.loads(queue.gpuq(bob, "reserve", "--list", "--json").stdout)}
        return str(found["bobs"]["ended"])

    assert wait_for(ended, 30, "the cancel") == "cancelled by root"


def test_only_the_owners_jobs_run_in_a_reservation(queue: SharedQueue, users: dict[str, User]) -> None:
    alice, bob = users["gqralice"], users["gqrbob"]
    queue.start(gpus="1x80GiB")
    queue.gpuq(alice, "reserve", "--gpus", "1", "--start", "now", "--duration", "1h", "--name", "alices")
    intruder = queue.submit(bob, "--reservation", "alices", "true")
    outsider = queue.submit(bob, "true")
    mine = queue.submit(alice, "--reservation", "alices", "true")
    wait_for(lambda: queue.records()[mine]["state"] == "succeeded", 60, "alice's job to run in it")
    records = queue.records()
    assert records[intruder]["state"] == "pending"
    assert records[intruder]["reason"] == "reservation alices is gqralice's: only their jobs run in it"
    assert (
        records[outsider]["state"] == "pending"
        and "GPU 0 is reserved for gqralice until " in records[outsider]["reason"]
    )
    queue.gpuq(alice, "reserve", "--cancel", "alices")
    wait_for(lambda: queue.records()[outsider]["state"] == "succeeded", 60, "bob's job once it is cancelled")
    queue.gpuq(bob, "cancel", str(intruder))
