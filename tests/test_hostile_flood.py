"""A hostile teammate floods the shared daemon's wake FIFO (issue 38): anyone may write it, and a loop
writing to it once cost the daemon a third of a core. Now a flood of pokes is coalesced into a few passes a
second, and another user's submit still starts its job meanwhile.

Real Unix users against a root `--shared` daemon, set up as tests/test_shared.py does (its fixtures are
reused, with users of our own: gqfalice, gqfmallory). Runs as root (CI does), under the users' flock:
`flock /tmp/gpuq-users.lock python -m pytest tests/test_hostile_flood.py`.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.test_shared import HAS_TOOLS, SharedQueue, User, unix_users
from tests.test_shared import queue as queue  # the fixture, over our users

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"),  # CI runs as root: there a missing tool is a failure
    reason="needs root and useradd/groupadd to create real users",
)

NAMES = ("gqfalice", "gqfmallory")
FLOOD_SECONDS = 6.0
# CPU seconds the daemon may spend per second of flood. Coalesced, it runs at most ten passes a second
# (``lifetime.WAKE_INTERVAL``), a few hundredths of a core; a pass per poke cost a third of one or more.
CPU_PER_SECOND = 0.1

# Mallory's loop: as many one-byte pokes as the FIFO takes, until killed. Says "go" once the FIFO is open.
FLOOD = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)
print("go", flush=True)
while True:
    try:
        os.write(fd, b"!")
    except BlockingIOError:  # full: the daemon has not read it yet
        pass
"""


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users(NAMES, admins=None) as found:  # no admin group: it is another module's to make and remove
        yield found


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def test_a_flood_of_wake_bytes_costs_the_daemon_little(queue: SharedQueue, users: dict[str, User]) -> None:
    queue.admins = None
    queue.start()
    alice, mallory = users["gqfalice"], users["gqfmallory"]
    assert queue.daemon is not None
    daemon = psutil.Process(queue.daemon.pid)
    flood = subprocess.Popen(
        [queue.python, "-c", FLOOD, str(queue.home / "wake.fifo")],
        env=queue.env(mallory),
        cwd=mallory.home,
        user=mallory.uid,
        group=mallory.gid,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert flood.stdout is not None and flood.stdout.readline() == "go\n"
        started, before = time.monotonic(), _cpu(daemon)
        # Alice's submit during the flood still starts (and ends) her job.
        job = queue.submit(alice, "--gpus", "0", "true")
        queue.wait(alice, job)
        assert queue.records(alice)[job]["state"] == "succeeded"
        time.sleep(max(0.0, started + FLOOD_SECONDS - time.monotonic()))  # the flood's length, at least
        assert flood.poll() is None, flood.returncode
        spent, lasted = _cpu(daemon) - before, time.monotonic() - started
    finally:
        flood.kill()
        flood.wait()
    # What the daemon spent over the flood (alice's job included) per second of it: a bound on how often
    # pokes make it run a pass, not on how fast anything is.
    assert spent / lasted < CPU_PER_SECOND, f"{spent:.2f} CPU seconds over a {lasted:.1f} s flood"
