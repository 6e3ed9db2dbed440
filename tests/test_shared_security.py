"""A shared queue against a careless or hostile teammate (issue 25): each test acts as the attacker did, as a
real second Unix user, against a root daemon on fake GPUs, and checks that the harm is not done.

Runs as root, like tests/test_shared.py (whose queue it reuses), with users of its own: gqsdave and gqserin
share a primary group (as teammates in `users` do), gqserin is in the admins group, gqsmal is the attacker.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for
from tests.test_shared import HAS_TOOLS, SharedQueue, User, _readable_files_containing, queue

__all__ = ["queue"]  # the fixture, built on this module's `users`

SHARED_GROUP = "gqsusers"
ADMINS = "gqsadmins"  # gqserin is in it
NAMES = ("gqsdave", "gqserin", "gqsmal")

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"), reason="needs root and useradd/groupadd to create real users"
)


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    known = subprocess.run(["getent", "group"], capture_output=True, text=True).stdout
    groups = [g for g in (SHARED_GROUP, ADMINS) if f"\n{g}:" not in f"\n{known}"]

    for group in groups:
        subprocess.run(["groupadd", group], check=True)
    made = []
    for name in NAMES:
        if subprocess.run(["id", name], capture_output=True).returncode != 0:
            primary = ["-g", SHARED_GROUP] if name != "gqsmal" else []
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", *primary, name], check=True)
            made.append(name)
    subprocess.run(["usermod", "-aG", ADMINS, "gqserin"], check=True)
    found = {}
    for name in NAMES:
        entry = pwd.getpwnam(name)
        found[name.removeprefix("gqs")] = User(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    yield found
    for name in made:
        subprocess.run(["userdel", "-r", name], capture_output=True)
    for group in groups:
        subprocess.run(["groupdel", group], capture_output=True)


@pytest.fixture
def shared(queue: SharedQueue) -> SharedQueue:
    queue.admins = ADMINS
    return queue


def _events(queue: SharedQueue) -> list[dict[str, object]]:
    path = queue.home / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# The attacker's move against the temp files a submit makes: guess the names the submit of a process `pid`
# will write (the id from next_id, or the highest id anyone can see, plus one), and plant them first.
PLANT = r"""
import json, os, sys
home, pid, how, target, seen = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
try:
    guess = int(open(os.path.join(home, "next_id")).read())
except (OSError, ValueError):
    guess = seen + 1
planted = []
for job in range(guess, guess + 3):
    for name in (f".submit-{job:012d}.json.{pid}.tmp", f"submit-{job:012d}.json"):
        path = os.path.join(home, "spool", name)
        try:
            if how == "link":
                os.symlink(target, path)
            else:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                os.chmod(path, 0o666)
            planted.append(path)
        except OSError:
            pass
print(json.dumps(planted))
"""

READ_PLANTED = r"""
import json, sys
found = []
for path in json.loads(sys.argv[1]):
    try:
        found.append(open(path).read())
    except OSError:
        pass
print(json.dumps(found))
"""


def _submit_after_plant(
    queue: SharedQueue, victim: User | None, attacker: User, how: str, target: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``victim``'s `gpuq submit ARGS` (None: root's), whose temp names ``attacker`` plants once she sees its
    process (its pid is in `ps` for anyone); the submit goes on once she has."""
    credentials = {} if victim is None else {"user": victim.uid, "group": victim.gid}
    submit = shlex.join([queue.python, "-m", "gpuq_scheduler", "submit", *args])
    process = subprocess.Popen(
        ["/bin/sh", "-c", f"read go; exec {submit}"],
        env=queue.env(victim),
        cwd=victim.home if victim else ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **credentials,
    )
    seen = max(queue.records(attacker), default=0)
    planted = json.loads(queue.python_as(attacker, PLANT, str(queue.home), str(process.pid), how, target, str(seen)))
    out, err = process.communicate("go\n", timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), planted


def test_planted_temp_files_neither_read_a_teammates_submit_nor_make_root_overwrite_a_file(
    shared: SharedQueue, users: dict[str, User]
) -> None:
    shared.start()
    dave, mal = users["dave"], users["mal"]
    secret = "hf_" + os.urandom(6).hex()
    done, planted = _submit_after_plant(
        shared, dave, mal, "file", "", "--gpus", "0", "--env", f"HF_TOKEN={secret}", "true"
    )
    assert planted, "the attacker could plant nothing: the test proves nothing"
    stolen = json.loads(shared.python_as(mal, READ_PLANTED, json.dumps(planted)))
    assert not any(secret in text for text in stolen), "mallory read dave's request"
    assert _readable_files_containing(shared, mal, secret) == []
    assert done.returncode == 0, done.stderr  # and his submit was not made to fail
    job = int(done.stdout.split()[-1])
    shared.wait(dave, job)
    assert shared.records()[job]["state"] == "succeeded"

    precious = shared.base / "root-only"
    precious.write_text("precious\n")
    precious.chmod(0o600)
    done, planted = _submit_after_plant(shared, None, mal, "link", str(precious), "--gpus", "0", "true")
    assert planted
    assert precious.read_text() == "precious\n"  # root followed none of her links
    assert done.returncode == 0, done.stderr
    job = int(done.stdout.split()[-1])
    shared.wait(dave, job)
    assert shared.records()[job]["state"] == "succeeded" and shared.records()[job]["user"] == "root"


def test_nothing_a_user_writes_decides_another_users_job_id(shared: SharedQueue, users: dict[str, User]) -> None:
    """A fresh queue's first submit works; a counter mallory rewinds, or an id she claims in a request of
    her own, cannot make dave's `submit --wait` report her job (or take his id)."""
    shared.start()
    dave, mal = users["dave"], users["mal"]
    first = shared.submit(dave, "--gpus", "0", "true")  # a fresh queue: this failed 4 times in 5
    hers = shared.submit(mal, "--gpus", "0", "true")
    shared.wait(mal, hers)
    rewind = (
        "import sys\ntry:\n    open(sys.argv[1], 'w').write(sys.argv[2] + '\\n')\n    print('rewound')\n"
        "except OSError:\n    print('refused')\n"
    )
    assert shared.python_as(mal, rewind, str(shared.home / "next_id"), str(hers)).strip() == "refused"
    squat = (
        "import json, os, sys, time\nfrom gpuq_scheduler.jobs.model import JobSpec\n"
        "from gpuq_scheduler.jobs.store import outbox\nfrom gpuq_scheduler.jobs.store.atomic import write_atomic\n"
        "from gpuq_scheduler.jobs.store.statedir import StateDir\ns = StateDir(sys.argv[1])\n"
        "body = {'schema': 1, 'kind': 'submit', 'id': 200, 'submitted_at': time.time(),\n"
        "        'spec': JobSpec(('true',), os.getcwd(), gpus=0).to_json()}\n"
        "write_atomic(s.submit_request(200), json.dumps(body).encode())\noutbox.poke(s)\n"
    )
    shared.python_as(mal, squat, str(shared.home))
    waited = shared.gpuq(dave, "submit", "--wait", "--gpus", "0", "sh", "-c", "exit 5", check=False)
    assert waited.returncode == 5, waited.stderr  # his job's exit code, not hers
    mine = int(waited.stdout.split()[-1])
    records = shared.records()
    assert records[mine]["user"] == "gqsdave" and mine not in (hers, 200) and first != hers
    assert 200 not in records
    why = wait_for(lambda: [p.read_text() for p in (shared.home / "spool" / "rejected").glob("*.why")], 20)
    assert "names its own job id" in why[0]
    broken = (  # a request of her own that the daemon sets aside: its client is told why, not left waiting
        "import os, sys\nfrom gpuq_scheduler.jobs.errors import BadInput\n"
        "from gpuq_scheduler.jobs.store import outbox\n"
        "from gpuq_scheduler.jobs.store.atomic import write_atomic\n"
        "from gpuq_scheduler.jobs.store.statedir import StateDir\n"
        "s, token = StateDir(sys.argv[1]), os.urandom(16).hex()\n"
        'body = b\'{"schema": 1, "kind": "submit", "submitted_at": 1}\'\n'
        "write_atomic(s.token_request(token), body)\n"
        "try:\n    print(outbox.await_id(s, token, 30))\nexcept BadInput as err:\n    print(err)\n"
    )
    assert "lacks a job spec" in shared.python_as(mal, broken, str(shared.home))
    assert not (shared.home / "next_id").exists()


def test_private_files_and_logs_are_not_readable_by_the_owners_group(
    shared: SharedQueue, users: dict[str, User]
) -> None:
    """No admins group configured, dave and erin in one primary group: erin reads none of dave's job."""
    shared.admins = None
    shared.start()
    dave, erin = users["dave"], users["erin"]
    assert dave.gid == erin.gid
    secret = "wandb-" + os.urandom(6).hex()
    job = shared.submit(dave, "--gpus", "0", "--env", f"WANDB_API_KEY={secret}", "sh", "-c", f"echo {secret}")
    shared.wait(dave, job)
    assert secret in shared.gpuq(dave, "logs", str(job)).stdout  # his own, as before
    assert _readable_files_containing(shared, erin, secret) == []
    shown = shared.gpuq(erin, "show", "--json", str(job))
    assert secret not in shown.stdout and "(private)" in shown.stdout
    for path in (shared.home / "private" / f"{job}.json", shared.home / "logs" / f"{job}.log"):
        assert path.stat().st_mode & 0o077 == 0, oct(path.stat().st_mode)


def test_a_removed_admin_can_no_longer_cancel_others_jobs(shared: SharedQueue, users: dict[str, User]) -> None:
    """The root daemon cached group memberships for its lifetime: erin, removed from the admins group,
    could still cancel dave's jobs with a cancel request she wrote herself (the client asks the OS anew)."""
    shared.start()
    dave, erin = users["dave"], users["erin"]
    first = shared.submit(dave, "--gpus", "0", "sleep", "60")
    second = shared.submit(dave, "--gpus", "0", "sleep", "60")
    shared.gpuq(erin, "cancel", str(first))  # an admin still: the daemon looks her up now
    wait_for(lambda: shared.records()[first]["state"] == "cancelled", 30, "the admin's cancel")
    subprocess.run(["gpasswd", "-d", "gqserin", ADMINS], check=True, capture_output=True)
    try:
        cancel = (
            "import sys\nfrom gpuq_scheduler.jobs.store import outbox\nfrom gpuq_scheduler.jobs.store.statedir "
            "import StateDir\ns = StateDir(sys.argv[1])\noutbox.write_cancel(s, [int(sys.argv[2])])\noutbox.poke(s)\n"
        )
        shared.python_as(erin, cancel, str(shared.home), str(second))
        wait_for(
            lambda: any(e.get("event") == "cancel-refused" and e.get("job") == second for e in _events(shared)),
            20,
            "the daemon to refuse her cancel",
        )
        assert shared.records()[second]["state"] in ("pending", "running")
    finally:
        subprocess.run(["usermod", "-aG", ADMINS, "gqserin"], check=True)
        shared.gpuq(dave, "cancel", str(second), check=False)


def test_a_user_removed_from_a_group_runs_the_next_job_without_it(shared: SharedQueue, users: dict[str, User]) -> None:
    """The daemon's cached memberships also gave a removed group member's jobs that group (and its files)."""
    shared.start()
    dave = users["dave"]
    subprocess.run(["groupadd", "-f", "gqsproject"], check=True)
    try:
        subprocess.run(["usermod", "-aG", "gqsproject", "gqsdave"], check=True)
        project = str(grp.getgrnam("gqsproject").gr_gid)
        before = shared.submit(dave, "--gpus", "0", *shared.stamp())
        shared.wait(dave, before)
        assert project in shared.stamps_of(before)["groups"]
        subprocess.run(["gpasswd", "-d", "gqsdave", "gqsproject"], check=True, capture_output=True)
        after = shared.submit(dave, "--gpus", "0", *shared.stamp())
        shared.wait(dave, after)
        assert project not in shared.stamps_of(after)["groups"]
    finally:
        subprocess.run(["groupdel", "gqsproject"], capture_output=True)
