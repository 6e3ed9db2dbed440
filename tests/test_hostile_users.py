"""A hostile teammate on a shared queue (issue 25): whatever mallory writes into the spool, by hand or
through the client, bob's jobs still run and are recorded right, and the queue never stalls.

Real Unix users against a root `--shared` daemon, set up as tests/test_shared.py does (its fixtures are
reused, with users of our own: gqfbob, gqfmallory). Runs as root (CI does), under the users' flock:
`flock /tmp/gpuq-users.lock python -m pytest tests/test_hostile_users.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, wait_for
from tests.test_shared import HAS_TOOLS, SharedQueue, User, unix_users
from tests.test_shared import queue as queue  # the fixture, over our users

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"),  # CI runs as root: there a missing tool is a failure
    reason="needs root and useradd/groupadd to create real users",
)

NAMES = ("gqfbob", "gqfmallory")

# What mallory writes with the client's own writer, bypassing its checks: `outbox` as any user has it, a
# shared queue's submit named by a token (the daemon gives the id). argv[1] is the queue, argv[2] a JSON body:
# {"spec": {...}, "members": N, "throttle": T, "t": time}.
HAND_WRITTEN = """
import json, os, sys, time
from pathlib import Path
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.statedir import StateDir
state = StateDir(Path(sys.argv[1]))
body = json.loads(sys.argv[2])
members = body.get("members")
array = None if members is None else (tuple(range(members)), body.get("throttle"))
token = os.urandom(16).hex()
outbox.write_request(state.token_request(token), None, body["spec"], body.get("t", time.time()), array)
outbox.poke(state)
print(token)
"""
CONTROL = """
import json, os, sys
from pathlib import Path
from gpuq_scheduler.jobs import jsontext
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import REQUEST_SCHEMA, StateDir
state = StateDir(Path(sys.argv[1]))
body = json.loads(sys.argv[2])
if body["kind"] == "cancel":
    outbox.write_cancel(state, body["ids"])
else:  # any values she likes, laid out as the client's writer lays out the typed values it takes
    control = {"schema": REQUEST_SCHEMA, "kind": "control", "action": body["action"], "ids": body["ids"]}
    control["values"] = body["values"]
    write_atomic(state.control_request(os.urandom(16).hex()), jsontext.encode(control))
outbox.poke(state)
"""


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users(NAMES) as found:
        yield found


def _spec(user: User, **fields: Any) -> dict[str, Any]:
    base = {"command": ["true"], "cwd": str(user.home), "env": {"PATH": "/usr/bin:/bin"}, "gpus": 0}
    return {**base, **fields}


def _hand_write(queue: SharedQueue, user: User, body: dict[str, Any]) -> str:
    """The request's token: its file is spool/submit-<token>.json until the daemon reads it."""
    return queue.python_as(user, HAND_WRITTEN, str(queue.home), json.dumps(body)).strip()


def _bob_runs_and_is_recorded_right(queue: SharedQueue, bob: User) -> None:
    jobs = [queue.submit(bob, "--gpus", "1", *queue.stamp()) for _ in range(2)]
    jobs.append(queue.submit(bob, "--gpus", "0", "sh", "-c", "exit 7"))
    for job in jobs:
        queue.gpuq(bob, "wait", str(job), check=False)
    records = queue.records(bob)
    assert [records[j]["state"] for j in jobs] == ["succeeded", "succeeded", "failed"], [records[j] for j in jobs]
    assert records[jobs[2]]["exit_code"] == 7
    assert all(queue.stamps_of(j)["uid"] == bob.uid for j in jobs[:2])


# Each once froze the queue for everyone (every pass failed, twice a second, for ever, across restarts),
# or was set aside by no one: reproduced from issue 25 as mallory would write them.
FREEZERS: dict[str, dict[str, Any]] = {
    "a throttle beyond SQLite's integers": {"spec": {}, "members": 2, "throttle": 10**20},
    "a name that is not UTF-8": {"spec": {"name": "\udcff\udcfe"}},
    "--mem auto like a job beyond SQLite's integers": {"spec": {"gpus": 1, "mem_auto": True, "like": 2**64}},
    "an array of 300,000 members": {"spec": {}, "members": 300_000},
    "a NUL byte in an environment value": {"spec": {"env": {"PATH": "/usr/bin:/bin", "TOKEN": "a\0b"}}},
    "a NUL byte in an argument": {"spec": {"command": ["echo", "a\0b"]}},
    "a time limit beyond the supervisor's timers": {"spec": {"time_limit": 3.6e18}},
    "a million retries": {"spec": {"retries": 10**6}},
    "a submit time beyond any clock": {"spec": {}, "t": 1e300},
}


def test_requests_that_once_froze_the_queue_are_set_aside_and_others_jobs_run(
    queue: SharedQueue, users: dict[str, User]
) -> None:
    queue.start()
    bob, mallory = users["gqfbob"], users["gqfmallory"]
    for body in FREEZERS.values():
        _hand_write(queue, mallory, {**body, "spec": _spec(mallory, **body["spec"])})
    # And an update mallory may send for her own job, with a value no priority can be.
    held = queue.submit(mallory, "--gpus", "0", "true")
    queue.python_as(
        mallory,
        CONTROL,
        str(queue.home),
        json.dumps({"kind": "control", "action": "update", "ids": [held], "values": {"priority": 1e308 * 10}}),
    )
    _bob_runs_and_is_recorded_right(queue, bob)

    def told() -> str | None:
        said = queue.gpuq(mallory, "status").stderr
        return said if said.count("was set aside") >= len(FREEZERS) + 1 else None

    said = wait_for(told, 30, "mallory to be told of each request set aside")
    assert "UTF-8" in said and "NUL" in said and "members" in said and "from 0 to 100" in said, said
    assert "was set aside" not in queue.gpuq(bob, "status").stderr  # mallory's notes are her own
    assert "pass has failed" not in queue.gpuq(bob, "status").stderr
    assert queue.gpuq(None, "doctor", check=False).stdout.count("pass has failed") == 0
    # Nothing of hers is stuck in the table or the spool: every submit above was set aside whole.
    active = [r for r in queue.records().values() if r["user"] == "gqfmallory" and r["state"] == "pending"]
    assert active == [], active
    assert not [p for p in (queue.home / "spool").iterdir() if p.name != "rejected"]


def test_names_that_steer_a_terminal_reach_nobodys_terminal_raw(queue: SharedQueue, users: dict[str, User]) -> None:
    queue.start()
    bob, mallory = users["gqfbob"], users["gqfmallory"]
    name = "\x1b]0;owned\x07\x1b[2J\r1 gqfbob succeeded\n"
    job = queue.submit(mallory, "--gpus", "0", "--name", name, "sh", "-c", "exit 1")
    queue.gpuq(mallory, "wait", str(job), check=False)
    for args in (("status", "--all"), ("show", str(job))):
        out = queue.gpuq(bob, *args).stdout
        assert "\x1b" not in out and "\r" not in out and "\\x1b]0;owned" in out, (args, out)


# -- the fuzz test: random and malicious requests at a live shared daemon -----------------------------------

SPECIAL = ["\0", "\udcff", "\ud800", "\x1b[2J", "\r\n", "{index}", "=", "\u202e"]
text = st.text(max_size=8) | st.tuples(st.text(max_size=3), st.sampled_from(SPECIAL), st.text(max_size=3)).map("".join)
number = st.integers() | st.floats() | st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 2**64, 10**20, 1e300])
value = st.none() | st.booleans() | number | text
hostile_specs = st.fixed_dictionaries(
    {},
    optional={
        "gpus": number,
        "mem_per_gpu": st.none() | number,
        "priority": number,
        "time_limit": st.none() | number,
        "name": text | value,
        "retries": number,
        "like": st.none() | number,
        "mem_auto": st.booleans() | value,
        "kind": text,
        "mem_from": text,
        "client": st.none() | number,
        "after": st.lists(number, max_size=3),
        "notify": st.none() | text,
        "mode": st.sampled_from(["single", "dataparallel", "torchrun"]) | value,
        "env": st.dictionaries(text, text | value, max_size=2),
        "command": st.lists(text | value, max_size=3),
        "python": st.none() | text,
        "oom_retry": st.booleans() | value,
    },
)
hostile = st.one_of(
    st.fixed_dictionaries(
        {"spec": hostile_specs},
        optional={"members": st.integers(1, 30), "throttle": st.none() | number, "t": number},
    ),
    st.fixed_dictionaries(
        {
            "kind": st.just("control"),
            "action": st.sampled_from(["hold", "release", "update", "drain", "pause"]),
            "ids": st.lists(st.integers(0, 2**63 - 1) | st.sampled_from([1, 2, 3]), max_size=3),
            "values": st.dictionaries(st.sampled_from(["priority", "time_limit", "gpus", "x"]), value, max_size=2),
        },
    ),
    st.fixed_dictionaries({"kind": st.just("cancel"), "ids": st.lists(st.integers(1, 2**63 - 1), max_size=3)}),
)
FUZZ = settings(
    max_examples=120,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


CLI_WORDS = [
    "--gpus",
    "--mem",
    "--name",
    "--priority",
    "--time",
    "--retries",
    "--array",
    "--env",
    "--like",
    "--after",
    "0",
    "1",
    "-1",
    "99999999999999999999",
    "\u0663",
    "1G",
    "auto",
    "1e400",
    "999999999999999h",
    "0-1%99999999999999999999",
    "",
    "\udcff\udcfe",
    "\x1b[2J",
    "K=\udcff",
    "0-300000",
    "1,3",
    "%",
    "1:00",
]
CLI_FUZZ = settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def test_random_and_malicious_requests_never_stop_other_users_jobs(queue: SharedQueue, users: dict[str, User]) -> None:
    """Mallory throws random requests at the live daemon, laid out as the client's writer lays them, and types
    random submits, while bob's jobs must still run and be recorded right; no pass fails, the spool empties."""
    queue.start()
    bob, mallory = users["gqfbob"], users["gqfmallory"]
    thrown: list[dict[str, Any]] = []
    started = time.monotonic()

    @FUZZ
    @given(request=hostile)
    def throw(request: dict[str, Any]) -> None:
        if "spec" in request:
            body = {**request, "spec": {**_spec(mallory), **request["spec"]}}
            try:
                json.dumps(body)  # the writer writes JSON: a value it cannot write is not a request
            except ValueError:
                return
            thrown.append(body)
        else:
            thrown.append(request)
        code = HAND_WRITTEN if "spec" in request else CONTROL
        queue.python_as(mallory, code, str(queue.home), json.dumps(thrown[-1]))

    throw()
    assert len(thrown) > 20 and time.monotonic() - started < 120

    @CLI_FUZZ
    @given(args=st.lists(st.sampled_from(CLI_WORDS), max_size=5))
    def type_it(args: list[str]) -> None:
        result = queue.gpuq(mallory, "submit", *args, "true", check=False)
        assert result.returncode in (0, 2), (args, result.stderr)
        assert result.returncode == 0 or len(result.stderr.splitlines()) == 1, (args, result.stderr)

    type_it()
    _bob_runs_and_is_recorded_right(queue, bob)
    wait_for(lambda: not [p for p in (queue.home / "spool").iterdir() if p.name != "rejected"], 30, "an empty spool")
    assert "pass has failed" not in queue.gpuq(bob, "status").stderr
    assert "pass has failed" not in queue.gpuq(None, "doctor", check=False).stdout
    log = (queue.base / "daemon.out").read_text()
    assert "tick failed" not in log, log[-3000:]


def test_a_shared_queue_bounds_time_limits_by_default_and_setup_writes_the_caps(
    queue: SharedQueue, users: dict[str, User], tmp_path: Path
) -> None:
    """A shared queue once had no default and no maximum --time: one job could hold a GPU for ever."""
    queue.start(shared='default_time = "2h"')  # max_time is 7d unless the config says otherwise
    mallory = users["gqfmallory"]
    refused = queue.gpuq(mallory, "submit", "--gpus", "0", "--time", "30d", "true", check=False)
    assert refused.returncode == 2 and "this queue allows at most 7d00h" in refused.stderr, refused.stderr
    token = _hand_write(queue, mallory, {"spec": _spec(mallory, time_limit=30 * 86400.0)})
    answer = queue.home / "answers" / token  # what the daemon tells its client (which would read it there)
    told = wait_for(lambda: answer.exists() and answer.read_text().strip(), 30, "the daemon's answer")
    assert told.startswith("rejected: user cap: --time 30d00h") and "max_time" in told, told  # set aside: no row
    assert queue.records(mallory) == {}
    plain = queue.submit(mallory, "--gpus", "0", "true")
    wait_for(lambda: queue.records(mallory)[plain]["time_limit"] == 7200.0, 30, "the default time limit")
    queue.gpuq(None, "pause")
    waiting = queue.submit(mallory, "--gpus", "0", "true")
    refused = queue.gpuq(mallory, "update", "--time", "30d", str(waiting), check=False)
    assert refused.returncode == 2 and "this queue allows at most 7d00h" in refused.stderr, refused.stderr
    queue.python_as(
        mallory,
        CONTROL,
        str(queue.home),
        json.dumps({"kind": "control", "action": "update", "ids": [waiting], "values": {"time_limit": 30 * 86400.0}}),
    )
    wait_for(lambda: "refused update" in (queue.base / "daemon.out").read_text(), 30, "the daemon to refuse it")
    assert queue.records(mallory)[waiting]["time_limit"] == 7200.0
    # What `gpuq daemon setup` writes sets the caps, not just comments on them.
    etc = tmp_path / "etc"
    env = {
        **queue.env(None),
        "GPUQ_SYSTEM_CONFIG": str(etc / "config.toml"),
        "GPUQ_UNIT_DIR": str(tmp_path / "u"),
        "PYTHONPATH": str(ROOT),
    }
    subprocess.run(
        [sys.executable, "-m", "gpuq_scheduler", "daemon", "setup", "--home", str(tmp_path / "q")],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    written = (etc / "config.toml").read_text()
    for line in (
        "max_gpus_per_user = 4",
        "max_queued_per_user = 1000",
        'default_time = "24h"',
        'max_time = "7d"',
        'idle_report = "2h"',
    ):
        assert f"\n{line}" in written, written
