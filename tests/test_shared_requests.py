"""A request counts only for the user who wrote it (issue 38): a teammate who reads the public job table and
writes requests by hand, as a real second Unix user against a root daemon on fake GPUs. He finds no submit's
token; one he has all the same runs nothing of his as its victim; a private file that became his is refused;
his requests past the per-user cap are set aside, with him told, not kept as rows.
Real users as in tests/test_shared_security.py, whose users it shares (never run the two modules at once).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import wait_for
from tests.test_shared import HAS_TOOLS, SharedQueue, User, queue
from tests.test_shared_security import _events, shared, users

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
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import StateDir
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
    root_job = int(
        json.loads(shared.gpuq(None, "submit", "--json", "--gpus", "1", "sh", "-c", "echo root-ran; id -u").stdout)[
            "id"
        ]
    )
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
    spec = {
        "command": ["sh", "-c", "echo mallory-was-here"],
        "cwd": str(mal.home),
        "env": {},
        "python": None,
        "notify": None,
    }
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
    assert (
        not (shared.home / "logs" / f"{victim}.log").exists()
        or "mallory" not in (shared.home / "logs" / f"{victim}.log").read_text()
    )
    assert "(private)" in shared.gpuq(mal, "show", str(victim)).stdout  # his file is not shown as the job's


FLOOD = r"""
import json, os, sys, time
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import StateDir
s, count = StateDir(sys.argv[1]), int(sys.argv[2])
spec = JobSpec(("sleep", "300"), os.getcwd(), gpus=1).to_json()
for _ in range(count):
    body = {"schema": 1, "kind": "submit", "submitted_at": time.time(), "spec": spec}
    write_atomic(s.token_request(os.urandom(16).hex()), json.dumps(body).encode(), durable=False)
outbox.poke(s)
"""


def test_requests_over_the_user_cap_are_set_aside_with_their_owner_told_not_kept_as_rows(
    shared: SharedQueue, users: dict[str, User]
) -> None:
    """Issue 38's finding 3: mallory writes 40 requests by hand into a queue that lets a user queue 3 jobs.
    At 34565a6 each one past the cap became a finished "user cap" row. Now the 3 the cap allows are his jobs
    and the rest are set aside, each with a note to him; his client's own submit over the cap says why and
    fails; dave's job meanwhile gets its id and runs."""
    shared.start("max_queued_per_user = 3\n", gpus="1x80GiB")
    dave, mal = users["dave"], users["mal"]
    blocker = shared.submit(dave, "--gpus", "1", "sleep", "600")  # all of mallory's wait: the cap counts those
    wait_for(lambda: shared.records()[blocker]["state"] == "running", 30, "dave's first job to hold the GPU")
    shared.python_as(mal, FLOOD, str(shared.home), "40")
    spool = shared.home / "spool"
    wait_for(lambda: not any(p.name.startswith("submit-") for p in spool.iterdir()), 60, "the flood to be read")
    job = shared.submit(dave, "--gpus", "0", "true")
    shared.wait(dave, job)
    records = shared.records()
    assert records[job]["state"] == "succeeded"
    his = [r for r in records.values() if r["user"] == "gqsmal"]
    assert len(his) == 3 and all(r["state"] == "pending" for r in his), his
    refused = shared.gpuq(mal, "submit", "--gpus", "1", "sleep", "300", check=False)  # the client's own check
    assert refused.returncode == 2 and "this queue takes at most 3 per user" in refused.stderr, refused
    awaited = (  # a request past the client's check (written by hand, or racing another): its client is told
        "import json, os, sys, time\nfrom gpuq_scheduler.jobs.errors import BadInput\n"
        "from gpuq_scheduler.jobs.model import JobSpec\nfrom gpuq_scheduler.jobs.store import outbox\n"
        "from gpuq_scheduler.jobs.store.atomic import write_atomic\n"
        "from gpuq_scheduler.jobs.store.statedir import StateDir\n"
        "s, token = StateDir(sys.argv[1]), os.urandom(16).hex()\n"
        "body = {'schema': 1, 'kind': 'submit', 'submitted_at': time.time(),\n"
        "        'spec': JobSpec(('true',), os.getcwd(), gpus=1).to_json()}\n"
        "write_atomic(s.token_request(token), json.dumps(body).encode())\noutbox.poke(s)\n"
        "try:\n    print(outbox.await_id(s, token, 60))\nexcept BadInput as err:\n    print(err)\n"
    )
    told = shared.python_as(mal, awaited, str(shared.home))
    assert "set the request aside: it user cap: gqsmal already has 3 jobs queued" in told, told
    notes = shared.gpuq(mal, "status").stderr
    assert notes.count("user cap") == 20, notes  # the latest 20 set aside (notices.KEEP) of his 38
    assert len(list((spool / "rejected").glob("*.why"))) == 37 + 1  # the flood past the cap, and the awaited one
    assert "user cap" not in shared.gpuq(dave, "status").stderr  # his notes are his own
    assert len(shared.records()) == len(records)  # the refused client's request made no row either
    shared.gpuq(mal, "cancel", *(str(r["id"]) for r in his))
    shared.gpuq(dave, "cancel", str(blocker))


def test_another_users_submit_is_read_before_the_rest_of_a_flood(shared: SharedQueue, users: dict[str, User]) -> None:
    """Another user's submit waited for a whole flood to be read (2.2 s behind 3000 requests at 34565a6):
    the pass that read it read every request in the spool. Now a pass reads at most 50 of each user's, so
    dave's submit, spooled after mallory's 400 while the daemon was down, is recorded before most of the
    flood is even read (the journal's order: no clock involved)."""
    shared.start("max_queued_per_user = 3\n", gpus="1x80GiB")
    dave, mal = users["dave"], users["mal"]
    shared.gpuq(None, "pause")  # nothing starts: the cap's 3 stay queued (a paused queue stays so on restart)
    shared.stop()
    shared.python_as(mal, FLOOD, str(shared.home), "400")
    queued = shared.gpuq(dave, "submit", "--gpus", "0", "true")  # no daemon: queued without an id yet
    assert queued.returncode == 0 and "no id yet" in queued.stderr, queued
    shared.start("max_queued_per_user = 3\n", gpus="1x80GiB")
    spool = shared.home / "spool"
    wait_for(lambda: not any(p.name.startswith("submit-") for p in spool.iterdir()), 60, "the flood to be read")
    events = _events(shared)
    his = next(i for i, e in enumerate(events) if e.get("event") == "submitted" and e.get("user") == "gqsdave")
    refused = [i for i, e in enumerate(events) if e.get("event") == "rejected" and e.get("uid") == mal.uid]
    assert len(refused) == 397 and sum(i > his for i in refused) >= 300, (his, refused[:5], refused[-5:])
    jobs = [r for r in shared.records().values() if r["user"] == "gqsmal"]
    assert len(jobs) == 3
    shared.gpuq(mal, "cancel", *(str(r["id"]) for r in jobs))
    shared.gpuq(None, "unpause")
