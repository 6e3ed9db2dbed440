"""Every process a job starts ends with it, whatever it does to its session, group or environment
(launcher.supervisor.containment, docs/containment.md).

Real daemons, real jobs that `setsid`, double-fork and `nohup` children which write their pids to files;
the test then looks those pids up in /proc. On a cgroup v2 hierarchy gpuq can write to (CI: root, on the
unified hierarchy with no controllers) each job is a cgroup; the fallback (GPUQ_CONTAINMENT=fallback) is
tested on every machine. Without a writable cgroup2 the cgroup tests are skipped, and fail under CI=true.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq_scheduler.launcher.supervisor.containment import cgroup2_mount
from tests.conftest import Gpuq, fake_cuda_queue, make_env, wait_for

MOUNT = cgroup2_mount()
WRITABLE = MOUNT is not None and os.geteuid() == 0 and os.access(MOUNT, os.W_OK)
needs_cgroup2 = pytest.mark.skipif(
    not WRITABLE and not os.environ.get("CI"),  # CI runs as root on a cgroup2 hierarchy: there it must not skip
    reason="no cgroup v2 hierarchy this user can make cgroups in (run as root where cgroup2 is mounted)",
)

PIDS = WRITABLE and "pids" in Path(str(MOUNT), "cgroup.controllers").read_text().split()
needs_pids = pytest.mark.skipif(
    not PIDS,  # CI's cgroup2 has no controllers either
    reason="the cgroup v2 hierarchy here has no pids controller (cgroup v1 holds it); runs on the lent GPU host",
)
# A fork bomb bounded by its own counter: it forks sleepers until the kernel refuses it one (and lets the error
# end it, as a real program would), at most CAP of them, so that it cannot hurt a machine where no limit holds it.
BOMB = """import os, time
CAP = 512
forked = 0
try:
    while forked < CAP:
        if os.fork() == 0:
            time.sleep(300)
            os._exit(0)
        forked += 1
finally:
    with open("forked", "w") as out:
        out.write(str(forked))
"""

# Four ways out of a process group and session; each child writes its pid, then sleeps in that process.
LEAVERS = """
setsid sh -c 'echo $$ > setsid.pid; exec sleep 300' &
sh -c 'sh -c "echo \\$\\$ > double.pid; exec sleep 300" &'
nohup sh -c 'echo $$ > nohup.pid; exec sleep 300' > /dev/null 2>&1 &
env -i setsid sh -c 'echo $$ > bare.pid; exec sleep 300' &
while [ ! -s setsid.pid ] || [ ! -s double.pid ] || [ ! -s nohup.pid ] || [ ! -s bare.pid ]; do sleep 0.05; done
"""
NAMES = ("setsid", "double", "nohup", "bare")


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Gpuq]:
    home, work = tmp_path / "state dir", tmp_path / "work dir"
    work.mkdir()
    client = Gpuq(home, make_env(home, "2x80GiB"), work)
    yield client
    for pid in _pids(work, (*NAMES, "child")):  # a test that failed must not leave its sleepers behind
        _kill(pid)
    client.cleanup()


def _pids(work: Path, names: tuple[str, ...]) -> list[int]:
    return [int(text) for name in names if (text := _read(work / f"{name}.pid"))]


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its (new) parent to reap it."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] != "Z"


def all_ended(pids: list[int]) -> bool:
    return not any(alive(pid) for pid in pids)


def containment(queue: Gpuq) -> str:
    return str(queue.run("gpus").stdout.strip().splitlines()[-1])


def script(queue: Gpuq, name: str, body: str) -> str:
    path = queue.cwd / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return f"./{name}"


@needs_cgroup2
def test_children_that_setsid_double_fork_nohup_or_drop_the_environment_end_with_their_job(queue: Gpuq) -> None:
    job = queue.submit(script(queue, "leave.sh", LEAVERS))
    record = queue.wait_state(job, "succeeded", "failed")
    pids = _pids(queue.cwd, NAMES)
    assert len(pids) == 4 and record["state"] == "succeeded", record
    wait_for(lambda: all_ended(pids), 10, "the job's children to end")
    assert record["reason"] == "4 processes outlived the job and were ended"
    assert containment(queue).startswith(f"containment: cgroup v2 at {MOUNT}/gpuq-")
    group = containment(queue).split(" at ", 1)[1].split(";")[0]
    assert not Path(group, f"job-{job}").exists()  # its cgroup went with it


# A child moved into a cgroup the job made below its own (a job may: its cgroup is its user's in a personal queue).
NESTS = """cg="$1$(sed -n 's/^0:://p' /proc/self/cgroup)"
mkdir "$cg/inner"
setsid sh -c 'echo $$ > inner.pid; exec sleep 60' &
while [ ! -s inner.pid ]; do sleep 0.05; done
cat inner.pid > "$cg/inner/cgroup.procs"
"""


@needs_cgroup2
def test_a_child_moved_into_a_cgroup_below_the_jobs_ends_with_it(queue: Gpuq) -> None:
    job = queue.submit(script(queue, "nests.sh", NESTS), str(MOUNT))
    assert queue.wait_state(job, "succeeded", "failed")["state"] == "succeeded"
    inner = int((queue.cwd / "inner.pid").read_text())
    wait_for(lambda: not alive(inner), 10, "the child in the inner cgroup to end")


@needs_cgroup2
def test_a_job_that_leaves_nothing_behind_says_nothing_of_it(queue: Gpuq) -> None:
    job = queue.submit("sh", "-c", "sleep 0.1 & wait")
    assert queue.wait_state(job, "succeeded")["reason"] == ""


@needs_cgroup2
def test_a_cancel_ends_every_process_of_the_job(queue: Gpuq) -> None:
    job = queue.submit(script(queue, "leave.sh", LEAVERS + "exec sleep 300\n"))
    queue.wait_state(job, "running")
    wait_for(lambda: len(_pids(queue.cwd, NAMES)) == 4, 30, "the children's pids")
    queue.run("cancel", str(job))
    assert queue.wait_state(job, "cancelled", "failed")["state"] == "cancelled"
    wait_for(lambda: all_ended(_pids(queue.cwd, NAMES)), 10, "the job's children to end")


@needs_cgroup2
def test_a_time_limit_ends_every_process_of_the_job(queue: Gpuq) -> None:
    job = queue.submit("--time", "2s", script(queue, "leave.sh", LEAVERS + "exec sleep 300\n"))
    assert queue.wait_state(job, "timeout", "failed")["state"] == "timeout"
    pids = _pids(queue.cwd, NAMES)
    assert len(pids) == 4
    wait_for(lambda: all_ended(pids), 10, "the job's children to end")


@needs_cgroup2
def test_after_kill_9_of_the_daemon_a_restarted_daemon_still_ends_every_process(queue: Gpuq) -> None:
    """The restarted daemon finds the queue's cgroup where the killed one made it, and the cancel it sends
    (a SIGTERM to the shim it adopted) ends the job's children too."""
    job = queue.submit(script(queue, "leave.sh", LEAVERS + "exec sleep 300\n"))
    queue.wait_state(job, "running")
    wait_for(lambda: len(_pids(queue.cwd, NAMES)) == 4, 30, "the children's pids")
    before = containment(queue)
    queue.kill_daemon()
    queue.run("daemon", "start")
    assert containment(queue) == before
    queue.run("cancel", str(job))
    assert queue.wait_state(job, "cancelled", "failed")["state"] == "cancelled"
    wait_for(lambda: all_ended(_pids(queue.cwd, NAMES)), 10, "the job's children to end")


@needs_cgroup2
def test_a_job_whose_supervisor_was_killed_too_is_ended_whole_by_the_next_daemon(queue: Gpuq) -> None:
    """kill -9 of the daemon and of the job's shim: nothing supervises the job any more. The next daemon
    finds the shim gone, ends the job's cgroup as the shim recorded it, and says how many were there."""
    job = queue.submit(script(queue, "leave.sh", LEAVERS + "exec sleep 300\n"))
    queue.wait_state(job, "running")
    wait_for(lambda: len(_pids(queue.cwd, NAMES)) == 4, 30, "the children's pids")
    first = json.loads((queue.home / "run" / f"{job}.pid").read_text())["pid"]
    shim = int(_read(Path(f"/proc/{first}/stat")).rsplit(")", 1)[1].split()[1])
    queue.kill_daemon()
    os.kill(shim, signal.SIGKILL)
    queue.run("daemon", "start")
    record = queue.wait_state(job, "lost")
    assert "its gpuq supervisor was killed; the job was stopped" in record["reason"]
    assert "5 of its processes were still there and were ended" in record["reason"]  # with its first
    assert all_ended([*_pids(queue.cwd, NAMES), first])


@needs_cgroup2
def test_two_queues_on_one_machine_have_cgroups_of_their_own(queue: Gpuq, tmp_path: Path) -> None:
    other = Gpuq(tmp_path / "other", make_env(tmp_path / "other", "1x80GiB"), queue.cwd)
    try:
        for each in (queue, other):
            each.wait_state(each.submit("true"), "succeeded")
        assert containment(queue) != containment(other)
    finally:
        other.cleanup()


def test_the_fallback_finds_a_setsid_child_by_its_marker_and_a_background_one_by_its_group(tmp_path: Path) -> None:
    home, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    queue = Gpuq(home, make_env(home, "1x80GiB", GPUQ_CONTAINMENT="fallback"), work)
    try:
        body = (
            "setsid sh -c 'echo $$ > setsid.pid; exec sleep 300' &\n"
            "sh -c 'echo $$ > child.pid; exec sleep 300' &\n"
            "while [ ! -s setsid.pid ] || [ ! -s child.pid ]; do sleep 0.05; done\n"
        )
        job = queue.submit(script(queue, "leave.sh", body))
        record = queue.wait_state(job, "succeeded", "failed")
        pids = _pids(work, ("setsid", "child"))
        assert record["reason"] == "2 processes outlived the job and were ended", record
        wait_for(lambda: all_ended(pids), 10, "the job's children to end")
        assert containment(queue) == (
            "containment: fallback: process group + session + marker, because GPUQ_CONTAINMENT=fallback is set"
        )
        doctor = queue.run("doctor").stdout.splitlines()
        assert doctor[-1] == containment(queue)
    finally:
        for pid in _pids(work, ("setsid", "child")):
            _kill(pid)
        queue.cleanup()


def test_host_limits_are_refused_at_submit_where_the_controllers_are_not_delegated(queue: Gpuq) -> None:
    """This machine's cgroup2 has no cpu, memory or pids controller (CI's neither): --cpus, --ram and --pids
    are refused in one line, exit 2, and nothing is queued. `gpuq doctor` says jobs have no process limit
    here. The first submit of a fresh queue starts its daemon to learn which limits it can enforce (it once
    said to start the daemon and submit again)."""
    first = queue.run("submit", "--ram", "1G", "true", check=False)
    assert "no gpuq daemon has run here yet" not in first.stderr, first.stderr
    assert first.returncode == 0 or "--ram cannot be enforced here" in first.stderr, first.stderr
    queue.wait_state(queue.submit("true"), "succeeded")
    recorded = json.loads((queue.home / "gpus.json").read_text())["containment"]
    missing = [
        (o, v)
        for o, v, c in (("--ram", "1G", "memory"), ("--cpus", "2", "cpu"), ("--pids", "100", "pids"))
        if c not in recorded["controllers"]
    ]
    if not missing:
        pytest.skip("the controllers are delegated here: tests/test_containment_gpu.py checks they are enforced")
    if ("--pids", "100") in missing and recorded["kind"] == "cgroup":
        said = queue.run("doctor", check=False).stdout.splitlines()[-1]
        assert said.endswith("; no process limit: a fork bomb in a job reaches the host"), said
    for option, value in missing:
        for entry in ("gpuq_scheduler.launcher.cli.entry", "gpuq_scheduler.launcher.cli.app"):  # quick, click
            queue.entry = entry
            refused = queue.run("submit", option, value, "true", check=False)
            assert refused.returncode == 2 and refused.stdout == "", refused
            assert len(refused.stderr.strip().splitlines()) == 1
            assert f"{option} cannot be enforced here" in refused.stderr
    assert len(queue.status()) == 1 + (first.returncode == 0)  # the plain job only (and the first, if queued)
    assert not [p for p in (queue.home / "spool").iterdir() if p.is_file()]


def test_host_limit_values_are_checked_before_anything_else(queue: Gpuq) -> None:
    for option, value, says in (
        ("--cpus", "none", "--cpus 'none': give a number of CPUs"),
        ("--cpus", "0", "--cpus must be from 0.01"),
        ("--ram", "1K", "--ram must be at least 1M"),
        ("--ram", "lots", "--ram: cannot read size 'lots'"),
    ):
        refused = queue.run("submit", option, value, "true", check=False)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr


@needs_cgroup2
def test_show_gives_the_host_cpu_time_its_cgroup_accounted_for_all_its_processes(queue: Gpuq) -> None:
    """A job whose setsid child burns 0.3 s of CPU: the child's time is the job's (cpu.stat of its cgroup,
    there without the cpu controller). Peak host memory needs the memory controller (the GPU-host test)."""
    burn = "import time\nwhile time.process_time() < 0.3:\n    pass\n"
    (queue.cwd / "burn.py").write_text(burn)
    job = queue.submit(script(queue, "burn.sh", f"setsid {sys.executable} burn.py & wait\n"))
    assert queue.wait_state(job, "succeeded")["state"] == "succeeded"
    shown = queue.job(job)
    assert shown["cpu_seconds"] >= 0.3, shown
    text = queue.run("show", str(job)).stdout
    assert "host cpu time" in text and "peak host memory" in text


@needs_cgroup2
def test_a_detached_grandchild_on_a_gpu_is_counted_as_its_jobs_never_as_outside_use(tmp_path: Path) -> None:
    """A job double-forks a process that holds 2 GiB of its (fake) GPU and leaves the job's process tree:
    `gpuq gpus` still counts that memory as the job's, by its cgroup, and a cancel ends it."""
    queue = fake_cuda_queue(tmp_path, "1x80GiB")
    try:
        leave = "sh -c 'setsid python3 fake_cuda.py 2 300 > /dev/null 2>&1 &'\nexec sleep 300\n"
        job = queue.submit(script(queue, "leave.sh", leave))
        queue.wait_state(job, "running")
        usage = Path(queue.env["GPUQ_FAKE_USAGE"])
        holder = int(wait_for(lambda: next(usage.glob("*.json"), None), 30, "the grandchild to hold memory").stem)
        row = wait_for(
            lambda: (rows := json.loads(queue.run("gpus", "--json").stdout)) and rows[0]["jobs"] and rows[0],
            30,
            "the GPU row",
        )
        assert row["used_outside_gpuq"] == 0 and job in row["jobs"], row
        queue.run("cancel", str(job))
        queue.wait_state(job, "cancelled")
        wait_for(lambda: not alive(holder), 10, "the grandchild to end")
    finally:
        queue.cleanup()


@needs_cgroup2
def test_doctor_names_a_job_that_ended_with_processes_still_in_its_cgroup(queue: Gpuq) -> None:
    """What containment should never leave (say, a cgroup someone else filled by hand): doctor finds it,
    names the job, and says how to end what is there."""
    job = queue.submit("true")
    queue.wait_state(job, "succeeded")
    group = containment(queue).split(" at ", 1)[1].split(";")[0]
    stray = Path(group, f"job-{job}")
    stray.mkdir()
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        (stray / "cgroup.procs").write_text(str(sleeper.pid))
        warned = queue.run("doctor").stdout
        assert f"warning: job {job} is not running, but 1 process(es) are still in its cgroup {stray}" in warned
        assert f"`echo 1 > {stray}/cgroup.kill` ends them" in warned
        (stray / "cgroup.kill").write_text("1")
        sleeper.wait(10)
        wait_for(lambda: "not running" not in queue.run("doctor").stdout, 10, "doctor to find nothing")
    finally:
        sleeper.kill()
        sleeper.wait()
        wait_for(lambda: not (stray / "cgroup.procs").read_text().strip(), 10, "the stray cgroup to empty")
        stray.rmdir()


@needs_cgroup2
def test_a_ram_limit_the_daemon_can_no_longer_enforce_fails_the_job_saying_why(queue: Gpuq) -> None:
    """Queued while a daemon recorded the memory controller, started by one without it (here: the record is
    written by hand, as a daemon on a host with the controller would have left it): the job does not run
    without its limit, and says why."""
    from gpuq_scheduler.jobs.submission import inventory_json

    gpus = [{"index": i, "uuid": f"GPU-{i}", "name": "fake", "total": 80 << 30, "lost": False} for i in range(2)]
    host = {"containment": {"kind": "cgroup", "controllers": ["cpu", "memory"], "limits_why": ""}}
    queue.home.mkdir(parents=True, exist_ok=True)
    (queue.home / "gpus.json").write_bytes(inventory_json(gpus, host))
    job = queue.submit("--ram", "1G", "true")
    record = queue.wait_state(job, "failed", "succeeded")
    recorded = json.loads((queue.home / "gpus.json").read_text())["containment"]
    if "memory" in recorded["controllers"]:
        pytest.skip("the memory controller is delegated here: the job ran with its limit")
    assert record["state"] == "failed", record
    assert record["reason"].startswith("could not start: --ram cannot be enforced here any more ("), record
    assert record["reason"].endswith("; submit it again without it")


@needs_cgroup2
def test_show_gives_a_running_jobs_host_cpu_time_so_far(queue: Gpuq) -> None:
    (queue.cwd / "burn.py").write_text("import time\nwhile time.process_time() < 0.3:\n    pass\n")
    job = queue.submit(script(queue, "burn.sh", f"{sys.executable} burn.py && touch burned\nexec sleep 300\n"))
    wait_for(lambda: (queue.cwd / "burned").exists(), 30, "the job to burn its CPU")
    shown = queue.job(job)
    assert shown["state"] == "running" and shown["cpu_seconds"] >= 0.3, shown
    queue.run("cancel", str(job))
    queue.wait_state(job, "cancelled")


@needs_cgroup2
@needs_pids
def test_a_fork_bomb_in_a_job_stops_at_its_process_limit(queue: Gpuq) -> None:
    """#38, finding 5: a job's cgroup had no process limit, and a fork bomb in a job reached the whole machine.
    With --pids 64 the kernel refuses its 64th task (pids.max; its own interpreter is one), the bomb fails,
    and its reason says why (pids.events' max counter, read at its end); every sleeper ends with it."""
    (queue.cwd / "bomb.py").write_text(BOMB)
    plain = queue.submit("--gpus", "0", sys.executable, "bomb.py")  # a personal queue has no default: the cap holds
    assert queue.wait_state(plain, "succeeded", "failed")["reason"] == "512 processes outlived the job and were ended"
    assert (queue.cwd / "forked").read_text() == "512"
    assert "no process limit" not in containment(queue)  # recorded by the daemon: --pids is taken now
    job = queue.submit("--gpus", "0", "--pids", "64", sys.executable, "bomb.py")
    record = queue.wait_state(job, "failed", "succeeded")
    forked = int((queue.cwd / "forked").read_text())
    assert record["state"] == "failed" and forked < 64, (record, forked)
    assert record["reason"].startswith("reached its limit of 64 processes; BlockingIOError: [Errno 11]"), record
    assert record["reason"].endswith(f"(exit code 1); {forked} processes outlived the job and were ended"), record
    group = containment(queue).split(" at ", 1)[1].split(";")[0]
    wait_for(lambda: not Path(group, f"job-{job}").exists(), 10, "the bomb's cgroup to go with its sleepers")
