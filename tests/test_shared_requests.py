"""A request counts only for the user who wrote it (issue 38): a teammate who reads the public job table and
writes requests by hand, as a real second Unix user against a root daemon on fake GPUs. He finds no submit's
token; one he has all the same runs nothing of his as its victim; a private file that became his is refused.
Real users as in tests/test_shared_security.py, whose users it shares (never run the two modules at once).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import wait_for
from tests.test_shared import HAS_TOOLS, SharedQueue, User, queue
from tests.test_shared_security import shared, users

__all__ = ["queue", "shared", "users"]  # the fixtures

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"), reason="needs root and useradd/groupadd to create real users"
)


# What mallory does with a teammate's pending job (issue 38): read the table everyone may read, find the
# tokens its submits were named by, and write a request of his own under each.
READ_TOKENS = r"""
import json, re, sqlite3, sys
home = sys.argv[1]
found = {}
try:
    db = sqlite3.connect(f"file:{home}/jobs.db?mode=ro", uri=True)
    found.update({token: job for token, job in db.execute("SELECT token, id FROM intake")})
except sqlite3.Error:
    pass  # no such column: the table keeps no token
for name in ("jobs.db", "jobs.db-wal"):  # and every byte he can read, in case a token is anywhere else
    try:
        data = open(f"{home}/{name}", "rb").read()
    except OSError:
        continue
    for token in re.findall(rb"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])", data):
        found.setdefault(token.decode(), 0)
print(json.dumps(found))
"""

REPLAY = r"""
import json, os, sys, time
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.statedir import StateDir, write_atomic
s = StateDir(sys.argv[1])
for token in sys.argv[2:]:
    spec = JobSpec(("sh", "-c", "echo mallory-was-here; id -u"), os.getcwd(), gpus=1)
    body = {"schema": 1, "kind": "submit", "submitted_at": time.time(), "spec": spec.to_json()}
    write_atomic(s.token_request(token), json.dumps(body).encode())
outbox.poke(s)
"""


def _answered(queue: SharedQueue) -> dict[int, str]:
    """Each job id and the token its submit was named by, as root sees them in ``answers/`` (nobody else can
    list it): what a leak of a token would give mallory, where the table gives him none."""
    found = {}
    for path in (queue.home / "answers").iterdir():
        text = path.read_text().strip()
        if text.isdigit():
            found[int(text)] = path.name
    return found


def test_a_replayed_submit_token_runs_nothing_of_the_attacker_as_its_victim(
    shared: SharedQueue, users: dict[str, User]
) -> None:
    """Issue 38's finding 1, acted out: dave keeps the one GPU busy and queues a job, root queues one too;
    mallory reads their submits' tokens from jobs.db as himself and writes `spool/submit-<token>.json` of his
    own under each; the daemon restarts. At 34565a6 dave's job ran mallory's command as dave, and root's as
    root. Now the table names no token, a token he has all the same (leaked) is set aside with him told, and
    each job runs its own owner's command."""
    shared.start(gpus="1x80GiB")
    dave, mal = users["dave"], users["mal"]
    blocker = shared.submit(dave, "--gpus", "1", "sleep", "600")
    wait_for(lambda: shared.records()[blocker]["state"] == "running", 30, "dave's first job to hold the GPU")
    victim = shared.submit(dave, "--gpus", "1", "sh", "-c", "echo dave-ran; id -u")
    root_job = int(json.loads(shared.gpuq(None, "submit", "--json", "--gpus", "1", "sh", "-c", "echo root-ran; id -u")
                              .stdout)["id"])  # fmt: skip
    found: dict[str, int] = json.loads(shared.python_as(mal, READ_TOKENS, str(shared.home)))
    real = _answered(shared)
    targets = [t for t, job in found.items() if job in (victim, root_job)] or [real[victim], real[root_job]]
    shared.python_as(mal, REPLAY, str(shared.home), *targets)
    spool = shared.home / "spool"
    wait_for(lambda: not any((spool / f"submit-{t}.json").exists() for t in targets), 30, "his requests to be read")
    shared.stop()
    shared.start(gpus="1x80GiB")  # the pending jobs are rebuilt from what is stored for them
    shared.gpuq(dave, "cancel", str(blocker))
    shared.wait(dave, victim)
    shared.gpuq(None, "wait", str(root_job), check=False)
    records = shared.records()
    dave_log = (shared.home / "logs" / f"{victim}.log").read_text()
    root_log = (shared.home / "logs" / f"{root_job}.log").read_text()
    assert "mallory" not in dave_log and "mallory" not in root_log, (dave_log, root_log)
    assert dave_log.split() == ["dave-ran", str(dave.uid)] and root_log.split() == ["root-ran", "0"]
    assert records[victim]["state"] == records[root_job]["state"] == "succeeded"
    assert (shared.home / "private" / f"{victim}.json").stat().st_uid == dave.uid
    assert "echo dave-ran" in shared.gpuq(dave, "show", str(victim)).stdout  # his own file, readable by him
    told = shared.gpuq(mal, "status").stderr
    assert told.count("another user's job was submitted under") == len(targets), told
    assert not set(found) & set(real.values()), "the table everyone reads names a submit's token"
    assert shared.gpuq(None, "doctor", check=False).returncode == 0


def test_a_private_file_its_job_owner_does_not_own_is_refused_and_named_by_doctor(
    shared: SharedQueue, users: dict[str, User]
) -> None:
    """A state directory 34565a6's daemon let mallory rewrite: dave's pending job's private file became his
    (the daemon chowned it to the replay's writer). The daemon, restarted, refuses it: the job fails saying
    so instead of running mallory's command as dave, and `gpuq doctor` names the file."""
    shared.start(gpus="1x80GiB")
    dave, mal = users["dave"], users["mal"]
    blocker = shared.submit(dave, "--gpus", "1", "sleep", "600")
    wait_for(lambda: shared.records()[blocker]["state"] == "running", 30, "dave's first job to hold the GPU")
    victim = shared.submit(dave, "--gpus", "1", "sh", "-c", "echo dave-ran")
    shared.stop()
    private = shared.home / "private" / f"{victim}.json"
    spec = {"command": ["sh", "-c", "echo mallory-was-here"], "cwd": str(mal.home), "env": {}, "python": None,
            "notify": None}  # fmt: skip
    private.write_text(json.dumps(spec))
    os.chown(private, mal.uid, mal.gid)  # as 34565a6's daemon left it after mallory's replay
    doctor = shared.gpuq(None, "doctor", check=False)
    assert doctor.returncode != 0 and f"the private part of job {victim}" in doctor.stdout, doctor.stdout
    assert f"belongs to uid {mal.uid}, not to the job's owner (uid {dave.uid})" in doctor.stdout
    shared.start(gpus="1x80GiB")
    shared.gpuq(dave, "cancel", str(blocker))
    shared.wait(dave, victim)
    record = shared.records()[victim]
    assert record["state"] == "failed" and "not its owner's" in record["reason"], record
    assert not (shared.home / "logs" / f"{victim}.log").exists() or "mallory" not in (
        shared.home / "logs" / f"{victim}.log"
    ).read_text()
    assert "(private)" in shared.gpuq(mal, "show", str(victim)).stdout  # his file is not shown as the job's

