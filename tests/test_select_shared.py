"""Choosing jobs by user in a shared queue (issue #39): `gpuq cancel/hold --user NAME` acts on another's jobs
for an admin only, refused in one line for anyone else, as ids are; without --user, a selection takes one's
own jobs only. Real users of this module's own (gqx*), and an admin group of its own, so that a run of
tests/test_shared.py beside it neither sees nor removes them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import wait_for
from tests.test_shared import HAS_TOOLS, SharedQueue, User, unix_users
from tests.test_shared import queue as queue  # the fixture, over our users

NAMES = ("gqxalice", "gqxbob", "gqxcarol")
ADMINS = "gqxadmins"  # gqxcarol is in it

pytestmark = pytest.mark.skipif(not HAS_TOOLS, reason="needs root and useradd/groupadd to create real users")


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users(NAMES, admins=ADMINS, in_admins=("gqxcarol",)) as found:
        yield found


def _states(queue: SharedQueue) -> dict[int, str]:
    return {job_id: job["state"] for job_id, job in queue.records().items()}


def test_only_an_admin_chooses_another_users_jobs_by_user(queue: SharedQueue, users: dict[str, User]) -> None:
    queue.admins = ADMINS
    queue.start(gpus="4x80GiB")
    alice, bob, carol = users["gqxalice"], users["gqxbob"], users["gqxcarol"]
    alices = [queue.submit(alice, "--gpus", "1", "--name", f"seed-{i}", "sleep", "300") for i in range(2)]
    bobs = queue.submit(bob, "--gpus", "1", "--name", "seed-b", "sleep", "300")
    everyone = [*alices, bobs]
    wait_for(lambda: all(_states(queue).get(j) == "running" for j in everyone), 60, "every job to run")

    refused = queue.gpuq(bob, "cancel", "--user", "gqxalice", check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        "gpuq: --user gqxalice: only gqxalice or an admin can cancel gqxalice's jobs"
    ]
    held = queue.gpuq(bob, "hold", "--user", "gqxalice", "--name", "seed-*", check=False)
    assert held.returncode == 2 and "only gqxalice or an admin can hold" in held.stderr
    assert all(state == "running" for state in _states(queue).values())

    own = queue.gpuq(bob, "cancel", "--name", "seed-*")  # the same glob matches alice's: bob's alone go
    assert own.stdout == f"cancelling 1 job(s) chosen by --name 'seed-*': {bobs}\n"
    wait_for(lambda: _states(queue)[bobs] == "cancelled", 60, "bob's job to be cancelled")
    assert [_states(queue)[j] for j in alices] == ["running", "running"]

    seen = queue.gpuq(bob, "status", "--user", "gqxalice").stdout  # everyone may look
    assert [int(line.split()[0]) for line in seen.splitlines()[1:]] == alices

    admin = queue.gpuq(carol, "cancel", "--user", "gqxalice", "--name", "seed-1")
    assert admin.stdout == f"cancelling 1 job(s) chosen by --name 'seed-1' --user gqxalice: {alices[1]}\n"
    wait_for(lambda: _states(queue)[alices[1]] == "cancelled", 60, "the admin's cancel")
    assert queue.gpuq(carol, "cancel", "--all").stdout == "you have no active job; nothing to cancel\n"
    assert _states(queue)[alices[0]] == "running"  # the admin's --all is the admin's own jobs
    queue.gpuq(alice, "cancel", "--all")
    wait_for(lambda: _states(queue)[alices[0]] == "cancelled", 60, "alice's last job to be cancelled")
