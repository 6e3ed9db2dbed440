# One module past 400 lines on purpose: every test shares one costly fixture, a root daemon for real users.
"""A shared queue with real Unix users: one root daemon, three users submitting from their own accounts.

Runs as root (CI does): the tests create the users and an admin group, start `launcher.daemon.lifetime --shared`
on fake GPUs, and run `gpuq` as each user. Users cannot read root's home, where the test's interpreter
and the checkout may live, so their `gpuq` runs from a world-readable copy of the code with a system
Python of the same version. Everything each test checks comes from what the jobs themselves recorded
(`id -u`, `id -G`, `pwd`, start and end times) and what the users could or could not do.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLICK, ROOT, wait_for
from tests.installed import installed_tree

USERS = ("gqalice", "gqbob", "gqcarol")
ADMINS = "gqadmins"  # gqcarol is in it
HAS_TOOLS = os.geteuid() == 0 and all(shutil.which(tool) for tool in ("useradd", "userdel", "groupadd"))

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"),  # CI runs as root: there a missing tool is a failure
    reason="needs root and useradd/groupadd to create real users",
)


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path


def _python_for_users() -> str:
    """An interpreter any user may run, of our Python version (psutil's compiled module must match)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (os.path.realpath(sys.executable), f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        path = Path(candidate)
        if path.exists() and all(p.stat().st_mode & 0o001 for p in [path, *path.parents]):
            return str(path)
    pytest.fail(f"no {version} that other users may run (looked in /usr/bin, /usr/local/bin)")


@contextlib.contextmanager
def unix_users(
    names: Sequence[str], admins: str | None = ADMINS, in_admins: Sequence[str] = ()
) -> Iterator[dict[str, User]]:
    """Real users ``names`` (made if missing, removed after if made here) and, unless ``admins`` is None, the
    admins group, which ``in_admins`` join. Every module that acts as real users takes them from here."""
    new_group = admins is not None and subprocess.run(["getent", "group", admins], capture_output=True).returncode
    if admins is not None:
        subprocess.run(["groupadd", "-f", admins], check=True)
    made = []
    for name in names:
        if subprocess.run(["id", name], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True)
            made.append(name)
    for name in in_admins:
        subprocess.run(["usermod", "-aG", str(admins), name], check=True)
    found = {}
    for name in names:
        entry = pwd.getpwnam(name)
        found[name] = User(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    try:
        yield found
    finally:
        for name in made:
            subprocess.run(["userdel", "-r", name], capture_output=True)
        if new_group:
            subprocess.run(["groupdel", str(admins)], capture_output=True)


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users(USERS, in_admins=("gqcarol",)) as found:
        yield found


@dataclass
class SharedQueue:
    base: Path
    home: Path
    config: Path
    stamps: Path
    lib: Path
    python: str
    daemon: subprocess.Popen[bytes] | None = None
    admins: str | None = ADMINS  # the config's [shared] admins (None: no admin group)

    def env(self, user: User | None) -> dict[str, str]:
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "GPUQ_HOME": str(self.home),
            "GPUQ_SYSTEM_CONFIG": str(self.config),
            "GPUQ_CONFIG": str(self.base / "no-user-config.toml"),
            "PYTHONPATH": str(self.lib),
            "LANG": "C.UTF-8",
        }
        if user is not None:
            env.update(HOME=str(user.home), USER=user.name, LOGNAME=user.name)
        return env

    def gpuq(
        self, user: User | None, *args: str, check: bool = True, module: str = "gpuq_scheduler"
    ) -> subprocess.CompletedProcess[str]:
        """`gpuq ARGS` as ``user`` (None: as root); ``module``: gpuq_scheduler.launcher.cli.app for click's alone."""
        credentials: dict[str, Any] = {}
        cwd = str(ROOT)
        if user is not None:
            groups = os.getgrouplist(user.name, user.gid)
            credentials = {"user": user.uid, "group": user.gid, "extra_groups": groups}
            cwd = str(user.home)
        result = subprocess.run(
            [self.python, "-m", module, *args],
            env=self.env(user),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            **credentials,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"gpuq {' '.join(args)} as {user}: exit {result.returncode}\n{result.stderr}")
        return result

    def python_as(self, user: User, code: str, *args: str, env: dict[str, str] | None = None) -> str:
        """Run Python ``code`` as ``user`` (for what a user could do by hand, bypassing the client)."""
        result = subprocess.run(
            [self.python, "-c", code, *args],
            env=self.env(user) if env is None else env,
            cwd=user.home,
            user=user.uid,
            group=user.gid,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def submit(self, user: User, *args: str) -> int:
        return int(json.loads(self.gpuq(user, "submit", "--json", *args).stdout)["id"])

    def stamp(self, seconds: float = 0.0) -> tuple[str, ...]:
        """A job that records who ran it, where, with which groups and GPUs, and when."""
        script = (
            f"out={self.stamps}/$GPUQ_JOB_ID; start=$(date +%s.%N); sleep {seconds}; "
            'printf "%s\\n" "$(id -u)" "$(id -G)" "$(pwd)" "$CUDA_VISIBLE_DEVICES" "$start" "$(date +%s.%N)" > "$out"'
        )
        return ("sh", "-c", script)

    def stamps_of(self, job_id: int) -> dict[str, Any]:
        lines = (self.stamps / str(job_id)).read_text().splitlines()
        return {
            "uid": int(lines[0]),
            "groups": lines[1].split(),
            "cwd": lines[2],
            "gpus": lines[3],
            "start": float(lines[4]),
            "end": float(lines[5]),
        }

    def start(self, shared: str = "", gpus: str = "2x80GiB") -> None:
        admins = f'admins = "{self.admins}"\n' if self.admins else ""
        self.config.write_text(f'home = "{self.home}"\n[shared]\n{admins}{shared}\n')
        env = {**self.env(None), "GPUQ_FAKE_GPUS": gpus, "GPUQ_KILL_GRACE": "1", "PYTHONPATH": str(ROOT)}
        log = (self.base / "daemon.out").open("ab")
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "gpuq_scheduler.launcher.daemon", "--shared"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
        wait_for(lambda: (self.home / "daemon.ready").exists(), 20, "the shared daemon to start")

    def records(self, user: User | None = None) -> dict[int, dict[str, Any]]:
        rows = json.loads(self.gpuq(user, "status", "--all", "--json").stdout)
        return {row["id"]: row for row in rows}

    def wait(self, user: User, *ids: int) -> None:
        self.gpuq(user, "wait", *map(str, ids), check=False)

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.send_signal(signal.SIGTERM)
            self.daemon.wait(20)
        subprocess.run(["pkill", "-KILL", "-f", f"gpuq-test-marker-{self.base.name}"], capture_output=True)


@pytest.fixture
def queue(users: dict[str, User]) -> Iterator[SharedQueue]:
    base = Path(tempfile.mkdtemp(prefix="gpuq-shared-"))
    base.chmod(0o755)
    lib = base / "lib"
    lib.mkdir()
    import click
    import cloudpickle
    import prometheus_client
    import psutil

    gpuq = installed_tree() / "gpuq_scheduler"  # laid out as it installs: jobs/ and launcher/ inside
    for package in (gpuq, *(Path(m.__file__).parent for m in (click, psutil, cloudpickle, prometheus_client))):
        shutil.copytree(package, lib / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    stamps = base / "stamps"
    stamps.mkdir()
    stamps.chmod(0o1777)
    subprocess.run(["chmod", "-R", "a+rX", str(lib)], check=True)
    shared = SharedQueue(base, base / "queue", base / "config.toml", stamps, lib, _python_for_users())
    shared.config.write_text("")
    shared.config.chmod(0o644)
    yield shared
    shared.stop()
    shutil.rmtree(base, ignore_errors=True)


def test_each_job_runs_as_its_submitter_with_their_groups_and_cwd(queue: SharedQueue, users: dict[str, User]) -> None:
    queue.start()
    jobs = {name: queue.submit(user, "--gpus", "1", *queue.stamp()) for name, user in users.items()}
    for name, job_id in jobs.items():
        queue.wait(users[name], job_id)
    records = queue.records()
    for name, job_id in jobs.items():
        user, seen = users[name], queue.stamps_of(job_id)
        assert records[job_id]["state"] == "succeeded", records[job_id]
        assert records[job_id]["user"] == name
        assert seen["uid"] == user.uid != 0
        assert sorted(map(int, seen["groups"])) == sorted(set(os.getgrouplist(name, user.gid)))
        assert seen["cwd"] == str(user.home)
    assert str(pwd.getpwnam("gqcarol").pw_gid) in queue.stamps_of(jobs["gqcarol"])["groups"]
    # Everyone sees the GPUs and the queue; the admin's consistency check finds nothing wrong.
    assert "80" in queue.gpuq(users["gqbob"], "gpus").stdout
    assert "gqalice" in queue.gpuq(users["gqbob"], "status", "--all").stdout
    queue.gpuq(None, "doctor")


def test_a_job_cannot_enter_a_directory_its_user_cannot(queue: SharedQueue, users: dict[str, User]) -> None:
    """The cwd is entered after the uid change: bob's request naming alice's private directory fails, even
    though the daemon (root) could enter it. The request is written by hand, as the client would refuse it."""
    queue.start()
    alice, bob = users["gqalice"], users["gqbob"]
    secret_dir = alice.home / "private"
    secret_dir.mkdir(exist_ok=True)
    os.chown(secret_dir, alice.uid, alice.gid)
    secret_dir.chmod(0o700)
    code = (
        "import sys, time\nfrom gpuq_scheduler.jobs.store import outbox\n"
        "from gpuq_scheduler.jobs.model import JobSpec\n"
        "from gpuq_scheduler.jobs.store.statedir import StateDir\n"
        f"from pathlib import Path\nstate = StateDir(Path({str(queue.home)!r}))\n"
        f"job = outbox.post_submit(state, JobSpec(('sh', '-c', 'pwd > {queue.stamps}/$GPUQ_JOB_ID'),"
        f" {str(secret_dir)!r}, gpus=0).to_json(), submitted_at=time.time())\nprint(job)\n"
    )
    job_id = int(queue.python_as(bob, code))
    record = wait_for(lambda: (r := queue.records().get(job_id)) and r["state"] not in ("pending", "running") and r)
    assert record["state"] == "failed" and record["exit_code"] == 126, record
    assert not (queue.stamps / str(job_id)).exists()
    log = Path(record["log"]).read_text()
    assert "cd" in log and str(secret_dir) in log, log


def test_nobody_else_can_cancel_or_read_a_job_but_an_admin_can(queue: SharedQueue, users: dict[str, User]) -> None:
    queue.start()
    alice, bob, carol = users["gqalice"], users["gqbob"], users["gqcarol"]
    secret = "hunter2-" + os.urandom(4).hex()
    job_id = queue.submit(alice, "--gpus", "1", "--env", f"TOKEN={secret}", "sh", "-c", f"echo {secret}; sleep 600")
    wait_for(lambda: queue.records(alice)[job_id]["state"] == "running", 30, "alice's job to start")
    wait_for(lambda: secret in Path(queue.records(alice)[job_id]["log"]).read_text(), 30, "its log")

    refused = queue.gpuq(bob, "cancel", str(job_id), check=False)
    assert refused.returncode == 2 and "belongs to gqalice" in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1
    logs = queue.gpuq(bob, "logs", str(job_id), check=False)
    assert logs.returncode == 2 and secret not in logs.stdout and logs.stderr.count("\n") == 1, logs
    shown = queue.gpuq(bob, "show", "--json", str(job_id))
    assert secret not in shown.stdout and "(private)" in shown.stdout
    # Nothing bob can open under the queue holds alice's command or environment (the table included).
    leaked = _readable_files_containing(queue, bob, secret)
    assert leaked == [], leaked
    # A cancel bob writes into the spool himself (bypassing the client's check) is refused by the daemon.
    code = (
        "from pathlib import Path\nfrom gpuq_scheduler.jobs.store import outbox\n"
        "from gpuq_scheduler.jobs.store.statedir import StateDir\n"
        f"s = StateDir(Path({str(queue.home)!r}))\n"
        f"outbox.write_cancel(s, [{job_id}])\noutbox.poke(s)\n"
    )
    queue.python_as(bob, code)
    events = queue.home / "events.jsonl"
    wait_for(lambda: "cancel-refused" in events.read_text(), 20, "the daemon to refuse bob's cancel")
    assert queue.records()[job_id]["state"] == "running"

    # Alice sees her own command and environment; carol (an admin) sees them and may cancel.
    mine = json.loads(queue.gpuq(alice, "show", "--json", str(job_id)).stdout)
    assert mine["command"][0] == "sh" and secret in mine["command"][-1] and mine["cwd"] == str(alice.home)
    assert secret in queue.gpuq(carol, "logs", str(job_id)).stdout
    queue.gpuq(carol, "cancel", str(job_id))
    record = wait_for(lambda: (r := queue.records()[job_id])["state"] == "cancelled" and r, 30, "the cancel")
    assert "gqcarol" in record["reason"]


def test_fair_share_interleaves_two_users_arrays_and_caps_hold(queue: SharedQueue, users: dict[str, User]) -> None:
    """Three users, two arrays and a single job on 2 GPUs, at most 1 GPU per user: alice's array was queued
    first, yet bob's and carol's jobs run alongside it rather than after it, and nobody ever holds 2."""
    queue.start(shared="max_gpus_per_user = 1")
    alice, bob, carol = users["gqalice"], users["gqbob"], users["gqcarol"]
    queue.gpuq(None, "pause")
    first = queue.submit(alice, "--array", "0-5", "--gpus", "1", *queue.stamp(0.4))
    second = queue.submit(bob, "--array", "0-5", "--gpus", "1", *queue.stamp(0.4))
    third = queue.submit(carol, "--gpus", "1", *queue.stamp(0.4))
    queue.gpuq(None, "unpause")
    for user, job_id in ((alice, first), (bob, second), (carol, third)):
        queue.wait(user, job_id)
    records = queue.records()
    members = {r["id"]: r for r in records.values() if r.get("array_id") in (first, second) or r["id"] == third}
    assert len(members) == 13 and all(r["state"] == "succeeded" for r in members.values()), members
    runs = sorted((queue.stamps_of(i)["start"], queue.stamps_of(i)["end"], r["user"]) for i, r in members.items())
    for user in USERS:  # the cap: a user's runs never overlap
        mine = [(start, end) for start, end, who in runs if who == user]
        assert all(end <= later for (_, end), (later, _) in itertools.pairwise(mine)), (user, mine)
    order = [who for _, _, who in runs]
    assert set(order[:2]) != {"gqalice"}, order  # both GPUs busy from the start, never alice alone
    alice_last = max(start for start, _, who in runs if who == "gqalice")
    assert max(start for start, _, who in runs if who == "gqbob") > alice_last - 1.0, order  # interleaved
    assert order.count("gqalice") == 6 and order.count("gqbob") == 6
    streak = longest = 1
    for before, after in itertools.pairwise(order):
        streak = streak + 1 if before == after else 1
        longest = max(longest, streak)
    assert longest <= 3, order


def test_fair_share_puts_the_lighter_user_first_and_says_why(queue: SharedQueue, users: dict[str, User]) -> None:
    queue.start(gpus="1x80GiB")
    alice, bob = users["gqalice"], users["gqbob"]
    busy = queue.submit(alice, "--gpus", "1", *queue.stamp(6.0))
    wait_for(lambda: queue.records()[busy]["state"] == "running", 30, "alice's first job")
    queue.gpuq(None, "pause")
    a = queue.submit(alice, "--gpus", "1", *queue.stamp())
    b = queue.submit(bob, "--gpus", "1", *queue.stamp())
    queue.gpuq(None, "unpause")
    try:
        reason = wait_for(lambda: "fair-share" in (r := queue.records()[a]["reason"]) and r, 10, "a fair-share reason")
    except AssertionError:
        raise AssertionError(str((queue.records()[a], queue.records()[b]))) from None
    assert "gqalice used" in reason, reason
    queue.wait(alice, a)
    queue.wait(bob, b)
    assert queue.stamps_of(b)["start"] < queue.stamps_of(a)["start"]  # bob was submitted later, ran first


def test_queued_job_cap_and_oversized_jobs_are_refused_with_reasons(queue: SharedQueue, users: dict[str, User]) -> None:
    queue.start(shared="max_gpus_per_user = 1\nmax_queued_per_user = 2", gpus="2x80GiB")
    bob = users["gqbob"]
    queue.gpuq(None, "pause")
    ids = [queue.submit(bob, "--gpus", "1", *queue.stamp()) for _ in range(2)]
    for extra in (("--gpus", "1"), ("--gpus", "2")):
        refused = queue.gpuq(bob, "submit", *extra, *queue.stamp(), check=False)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "at most 2 per user" in queue.gpuq(bob, "submit", *queue.stamp(), check=False).stderr
    assert len(queue.records(bob)) == 2  # the refusals changed nothing
    # Bypassing the client does not get around the caps: the daemon sets such requests aside (no row, no id)
    # and their client says why (issue 38: they were rows, 2000 of them in a flood).
    code = (
        "import time\nfrom pathlib import Path\nfrom gpuq_scheduler.jobs.store import outbox\n"
        "from gpuq_scheduler.jobs.errors import BadInput\nfrom gpuq_scheduler.jobs.model import JobSpec\n"
        "from gpuq_scheduler.jobs.store.statedir import StateDir\n"
        f"s = StateDir(Path({str(queue.home)!r}))\nfor gpus in (1, 2):\n    try:\n"
        "        print(outbox.post_submit(s, JobSpec(('true',), '/', gpus=gpus).to_json(), submitted_at=time.time()))\n"
        "    except BadInput as err:\n        print(err)\n"
    )
    third, big = queue.python_as(bob, code).splitlines()
    assert "set the request aside: it user cap: gqbob already has 2 jobs queued (max_queued_per_user" in third
    assert "at most 1 GPUs at once (max_gpus_per_user)" in big
    records = queue.records(bob)
    assert sorted(records) == sorted(ids) and [records[i]["state"] for i in ids] == ["pending", "pending"]
    queue.gpuq(None, "unpause")


def test_a_rewound_id_counter_loses_no_job(queue: SharedQueue, users: dict[str, User]) -> None:
    """next_id was writable by every user of a shared queue; now the daemon gives ids, and a counter written
    into the queue (as anyone could before) decides nothing: no job vanishes or takes another's id."""
    queue.start()
    alice, bob = users["gqalice"], users["gqbob"]
    first = queue.submit(alice, "--gpus", "0", *queue.stamp())
    queue.wait(alice, first)
    (queue.home / "next_id").write_text(f"{first}\n")
    again = queue.submit(bob, "--gpus", "0", *queue.stamp())
    assert again > first
    queue.wait(bob, again)
    records = queue.records()
    assert records[first]["user"] == "gqalice" and records[again]["user"] == "gqbob"
    assert records[again]["state"] == "succeeded"
    assert not list((queue.home / "spool" / "rejected").iterdir())


def _readable_files_containing(queue: SharedQueue, user: User, needle: str) -> list[str]:
    """Every file under the queue that ``user`` can read and that holds ``needle``."""
    code = (
        "import os, sys\nroot, needle = sys.argv[1], sys.argv[2].encode()\nfor d, _, files in os.walk(root):\n"
        "    for f in files:\n        p = os.path.join(d, f)\n        try:\n            data = open(p, 'rb').read()\n"
        "        except OSError:\n            continue\n        if needle in data:\n            print(p)\n"
    )
    return queue.python_as(user, code, str(queue.home), needle, env={"PATH": "/usr/bin:/bin"}).split()


def test_a_request_claiming_root_or_another_user_runs_as_its_file_owner(
    queue: SharedQueue, users: dict[str, User]
) -> None:
    """Identity is the spool file's owner: fields a user writes into a request cannot make it root's or alice's."""
    queue.start()
    bob = users["gqbob"]
    command = list(queue.stamp())
    code = (
        "import json, os, time\nfrom pathlib import Path\nfrom gpuq_scheduler.jobs.store import outbox\n"
        "from gpuq_scheduler.jobs.model import JobSpec\n"
        "from gpuq_scheduler.jobs.store.atomic import write_atomic\n"
        "from gpuq_scheduler.jobs.store.statedir import StateDir\n"
        f"s = StateDir(Path({str(queue.home)!r}))\ntoken = os.urandom(16).hex()\n"
        f"spec = JobSpec(tuple({command!r}), os.getcwd(), dict(os.environ), gpus=0).to_json()\n"
        "body = {'schema': 1, 'kind': 'submit', 'id': 1, 'submitted_at': time.time(), 'spec': spec,\n"
        "        'uid': 0, 'user': 'root', 'owner': 'gqalice'}\n"
        "write_atomic(s.token_request(token), json.dumps(body).encode())\n"
        "print(outbox.await_id(s, token, 60))\n"
    )
    job_id = int(queue.python_as(bob, code))
    record = wait_for(lambda: (r := queue.records().get(job_id)) and r["state"] == "succeeded" and r, 30)
    assert record["user"] == "gqbob" and record["uid"] == bob.uid
    assert queue.stamps_of(job_id)["uid"] == bob.uid


def test_admin_setup_in_two_commands_and_users_need_nothing(queue: SharedQueue, users: dict[str, User]) -> None:
    """`gpuq daemon setup` then `gpuq daemon start --shared` (systemd's place here): users' gpuq finds the
    queue through the system config alone."""
    etc, units, home = queue.base / "etc", queue.base / "units", queue.base / "q2"
    etc.mkdir()
    units.mkdir()
    env = {
        **queue.env(None),
        "GPUQ_SYSTEM_CONFIG": str(etc / "config.toml"),
        "GPUQ_UNIT_DIR": str(units),
        "PYTHONPATH": str(ROOT),
        "GPUQ_FAKE_GPUS": "2x80GiB",
    }
    del env["GPUQ_HOME"]
    root = [sys.executable, "-m", "gpuq_scheduler.launcher.cli.app"]
    done = subprocess.run(
        [*root, "daemon", "setup", "--admins", ADMINS, "--home", str(home)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f'home = "{home}"' in (etc / "config.toml").read_text()
    unit = (units / "gpuq.service").read_text()
    assert "--shared" in unit and "KillMode=process" in unit
    assert oct((home / "spool").stat().st_mode & 0o7777) == "0o1733"
    bad = subprocess.run(
        [*root, "daemon", "setup", "--admins", "no-such-group-here"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "no group" in bad.stderr
    started = subprocess.run(
        [*root, "daemon", "start", "--shared"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert started.returncode == 0 and str(home) in started.stdout, started.stderr
    try:
        alice = users["gqalice"]
        user_env = {**queue.env(alice), "GPUQ_SYSTEM_CONFIG": str(etc / "config.toml")}
        del user_env["GPUQ_HOME"]
        result = subprocess.run(
            [queue.python, "-m", CLICK[-1], "submit", "--wait", "--gpus", "1", "sh", "-c", "id -u"],
            env=user_env,
            cwd=alice.home,
            user=alice.uid,
            group=alice.gid,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        log = next((home / "logs").glob("*.log"))
        assert log.read_text().strip() == str(alice.uid) and log.stat().st_uid == alice.uid
    finally:
        subprocess.run([*root, "daemon", "stop"], env=env, cwd=ROOT, capture_output=True, timeout=60)


def test_waiting_for_a_job_the_daemon_has_not_read_yet_waits(queue: SharedQueue, users: dict[str, User]) -> None:
    """A shared queue's daemon gives ids: until it reads a request, its client has no id. `submit --wait` then
    waits for the daemon's answer and then for the job, rather than report it done or fail."""
    queue.start()
    alice = users["gqalice"]
    assert queue.daemon is not None
    os.kill(queue.daemon.pid, signal.SIGSTOP)  # it reads nothing until continued
    try:
        waiting = subprocess.Popen(
            [queue.python, "-m", "gpuq_scheduler", "submit", "--wait", "--gpus", "0", "sh", "-c", "exit 3"],
            env=queue.env(alice),
            cwd=alice.home,
            user=alice.uid,
            group=alice.gid,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(2)  # not answered: it waits
    finally:
        os.kill(queue.daemon.pid, signal.SIGCONT)
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 3, err
    job_id = int(out.split()[-1])
    assert queue.records()[job_id]["user"] == "gqalice" and queue.records()[job_id]["exit_code"] == 3


def test_a_users_functions_run_as_them_and_their_pickles_stay_their_own(
    queue: SharedQueue, users: dict[str, User]
) -> None:
    """Executor in the shared queue: the queue's state directory is root's, so the pickles go to the user's
    own state home (0700); the function runs as the user; another user cannot look inside."""
    queue.start()
    alice, bob = users["gqalice"], users["gqbob"]
    code = (
        "import json, os\nfrom gpuq_scheduler import Executor\n"
        "job = Executor(gpus=1).submit(lambda: (os.getuid(), os.getcwd()))\n"
        "print(json.dumps({'id': job.id, 'result': job.result(timeout=60)}))\n"
    )
    found = json.loads(queue.python_as(alice, code).splitlines()[-1])
    assert found["result"] == [alice.uid, str(alice.home)]
    folder = alice.home / ".local" / "state" / "gpuq" / "functions"
    assert folder.stat().st_uid == alice.uid and oct(folder.stat().st_mode & 0o777) == "0o700"
    assert not (queue.home / "functions").exists()
    peek = f"import os\ntry:\n    print(os.listdir({str(folder)!r}))\nexcept PermissionError:\n    print('refused')\n"
    assert queue.python_as(bob, peek).strip() == "refused"


def test_the_dashboard_shows_every_users_jobs_and_nobodys_commands(queue: SharedQueue, users: dict[str, User]) -> None:
    """`gpuq serve` on the shared queue (run by bob, who may bind a port as anyone can): alice's job is there
    with its owner, GPUs and state; her command, environment and working directory are nowhere."""
    queue.start()
    alice, bob = users["gqalice"], users["gqbob"]
    secret = "alice-private-9d2c"
    job = queue.submit(alice, "--gpus", "1", "--env", f"TOKEN={secret}", "sh", "-c", f": {secret}; sleep 30")
    wait_for(lambda: queue.records()[job]["state"] == "running", 20, "alice's job to run")
    server = subprocess.Popen(
        [queue.python, "-m", "gpuq_scheduler", "serve", "--port", "0"],
        cwd=bob.home,
        env={**queue.env(bob), "GPUQ_FAKE_GPUS": "2x80GiB"},
        user=bob.uid,
        group=bob.gid,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[1]
        bodies = {}
        for path in ("", "api/gpus", "api/jobs", "metrics"):
            with urllib.request.urlopen(url + path, timeout=30) as answer:
                bodies[path] = answer.read().decode()
        running = json.loads(bodies["api/jobs"])["running"]
        assert [(j["id"], j["user"]) for j in running] == [(job, "gqalice")]
        assert 'user="gqalice"' in bodies["metrics"] and "gqalice" in bodies[""]
        for path, body in bodies.items():
            assert secret not in body and str(alice.home) not in body, path
    finally:
        server.terminate()
        server.wait(10)


def test_interactive_work_runs_as_its_user_and_an_allocation_is_released_by_its_owner_only(
    queue: SharedQueue, users: dict[str, User]
) -> None:
    queue.start()
    alice, bob = users["gqalice"], users["gqbob"]
    ran = queue.gpuq(alice, "run", "--gpus", "1", "sh", "-c", 'echo "$(id -u) $CUDA_VISIBLE_DEVICES $GPUQ_JOB_ID"')
    uid, gpus, job_id = ran.stdout.split()
    assert (int(uid), gpus) == (alice.uid, "0")
    queue.wait(alice, int(job_id))
    assert queue.records()[int(job_id)]["user"] == "gqalice"
    held = json.loads(queue.gpuq(alice, "alloc", "--no-shell", "--json").stdout)
    refused = queue.gpuq(bob, "release-alloc", str(held["id"]), check=False)
    assert refused.returncode == 2, refused.stderr
    queue.gpuq(alice, "release-alloc", str(held["id"]))
    queue.wait(alice, held["id"])
    assert queue.records()[held["id"]]["state"] == "cancelled"
