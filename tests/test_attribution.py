"""Which job a process belongs to (``launcher.daemon.attribution``), on real processes: by its cgroup, else
by the marker it inherited, never by the variables a job can change; and never another queue's job."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq_scheduler.launcher.daemon.attribution import MARKER, job_of, queue_key
from tests.conftest import wait_for

KEY = queue_key("/nonexistent/queue for attribution tests")


@contextlib.contextmanager
def process(env: dict[str, str], *argv: str) -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(argv or ("sleep", "30"), env=env)
    try:
        # Popen returns at the exec's close-on-exec, a moment before the kernel has set up the new program's
        # environment: /proc/<pid>/environ can still read empty then (CI, loaded, 2026-11-27).
        if env:
            wait_for(lambda: _environ_has(child.pid, next(iter(env))), 10, "its environment")
        yield child
    finally:
        child.kill()
        child.wait()


def _environ_has(pid: int, text: str) -> bool:
    with contextlib.suppress(OSError):
        return text.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    return False


def test_a_process_carrying_its_jobs_marker_is_that_jobs() -> None:
    with process({"PATH": os.defpath, MARKER: f"{KEY}/7", "CUDA_VISIBLE_DEVICES": "1"}) as child:
        assert job_of(child.pid, KEY) == 7


def test_the_marker_of_another_queue_is_not_ours() -> None:
    other = queue_key("/somewhere/else")
    with process({"PATH": os.defpath, MARKER: f"{other}/7"}) as child:
        assert job_of(child.pid, KEY) is None


def test_gpuqs_own_variables_do_not_make_a_process_a_jobs() -> None:
    """GPUQ_JOB_ID and CUDA_VISIBLE_DEVICES are the job's to change: they attribute nothing."""
    with process({"PATH": os.defpath, "GPUQ_JOB_ID": "7", "GPUQ_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0"}) as child:
        assert job_of(child.pid, KEY) is None


def test_a_marker_is_believed_only_of_a_process_its_jobs_owner_runs() -> None:
    """In a shared queue anyone can write the marker: a process claiming bob's job must be bob's."""
    with process({"PATH": os.defpath, MARKER: f"{KEY}/7"}) as child:
        assert job_of(child.pid, KEY, uid_of=lambda job: os.getuid()) == 7
        assert job_of(child.pid, KEY, uid_of=lambda job: os.getuid() + 4242) is None
        assert job_of(child.pid, KEY, uid_of=lambda job: None) is None  # a job the queue does not know


def test_a_marker_anywhere_in_the_environment_is_found_and_a_bad_one_is_not() -> None:
    with process({"A": "x", MARKER: f"{KEY}/12", "Z": "y"}, sys.executable, "-c", "import time; time.sleep(30)") as c:
        assert job_of(c.pid, KEY) == 12
    with process({MARKER: f"{KEY}/x12"}, sys.executable, "-c", "import time; time.sleep(30)") as c:
        assert job_of(c.pid, KEY) is None


def test_a_process_that_is_gone_belongs_to_no_job() -> None:
    child = subprocess.Popen(["true"], env={MARKER: f"{KEY}/3", "PATH": os.defpath})
    child.wait()
    assert job_of(child.pid, KEY) is None


def _cgroup_root() -> str | None:
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return fields[1]
    return None


@pytest.fixture
def job_cgroup() -> Iterator[tuple[str, str]]:
    """A job's cgroup as the contain branch names it, ``<base>/gpuq-<key>/job-31``, made in the cgroup v2
    hierarchy (root only; CI has one with no controllers, enough to hold processes)."""
    mount = _cgroup_root()
    if mount is None or os.geteuid() != 0:
        pytest.skip("needs root and a cgroup v2 hierarchy")
    key = queue_key(f"/attribution-test-{secrets.token_hex(4)}")
    queue = os.path.join(mount, f"gpuq-{key}")
    job = os.path.join(queue, "job-31")
    try:
        os.makedirs(job)
    except OSError as err:
        pytest.skip(f"cannot make a cgroup here: {err}")
    try:
        yield key, job
    finally:
        with contextlib.suppress(OSError):
            Path(job, "cgroup.kill").write_text("1")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.rmdir(job)
                break
            except OSError:
                time.sleep(0.05)
        with contextlib.suppress(OSError):
            os.rmdir(queue)


def test_a_process_in_a_jobs_cgroup_is_that_jobs_whatever_its_environment_says(job_cgroup: tuple[str, str]) -> None:
    key, job = job_cgroup
    # It claims job 8 by marker and has cleared gpuq's variables: its cgroup, which it cannot leave, wins.
    with process({"PATH": os.defpath, MARKER: f"{key}/8"}) as child:
        Path(job, "cgroup.procs").write_text(str(child.pid))
        wait_for(lambda: "job-31" in Path(f"/proc/{child.pid}/cgroup").read_text(), 5, "the move")
        assert job_of(child.pid, key) == 31
        assert job_of(child.pid, queue_key("/another queue")) is None  # another queue's cgroup names are not ours


def test_a_child_that_clears_its_environment_stays_in_its_jobs_cgroup(job_cgroup: tuple[str, str]) -> None:
    """``setsid env -i`` leaves the marker and the session behind; the cgroup comes along."""
    key, job = job_cgroup
    # The parent moves itself into the job's cgroup before it forks, as a shim does: what it starts is born there.
    script = (
        f"import os, subprocess, time; open({job + '/cgroup.procs'!r}, 'w').write(str(os.getpid())); "
        "subprocess.Popen(['setsid', 'env', '-i', 'sleep', '30']); time.sleep(30)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], env={"PATH": os.defpath, MARKER: f"{key}/31"})
    try:

        def grandchild() -> int | None:
            for pid in map(int, Path(job, "cgroup.procs").read_text().split()):
                if pid != parent.pid and _cmdline(pid).startswith("sleep"):
                    return pid
            return None

        lonely = wait_for(grandchild, 10, "the grandchild in the job's cgroup")
        assert not _environ_has(lonely, MARKER)  # it has no marker left...
        assert job_of(lonely, key) == 31  # ...and is the job's all the same
    finally:
        parent.kill()
        parent.wait()


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""
