"""A job's first process is cloned straight into its cgroup, and the shim that starts it never moves
(launcher.supervisor.intocgroup): moving a process between cgroups waits for the kernel, on every job.

Each test runs the spawn in a fresh Python process, as the shim is (one thread: the way is refused in a
process with more), in a real cgroup v2 cgroup.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq_scheduler.launcher.supervisor import spawncg
from gpuq_scheduler.launcher.supervisor.containment import cgroup2_mount
from tests.conftest import wait_for

MOUNT = cgroup2_mount()
WRITABLE = MOUNT is not None and os.geteuid() == 0 and os.access(MOUNT, os.W_OK)
pytestmark = pytest.mark.skipif(
    not WRITABLE and not os.environ.get("CI"),  # CI runs as root on a cgroup2 hierarchy: there it must not skip
    reason="no cgroup v2 hierarchy this user can make cgroups in (run as root where cgroup2 is mounted)",
)


@pytest.fixture
def cgroup() -> Iterator[Path]:
    assert MOUNT is not None
    path = Path(MOUNT) / f"gpuq-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    if path.exists():
        (path / "cgroup.kill").write_text("1")
        for _ in range(100):
            try:
                for below, _, _ in os.walk(path, topdown=False):  # a job's cgroup made in it, then itself
                    os.rmdir(below)
                break
            except OSError:
                os.sched_yield()


# Each way a job's first process is started in its cgroup: a clone of the starter at once, or born ahead and
# told to go later, or (a job of the starter's own user, where the C library can) glibc's posix_spawn into it, at
# once or built ahead and run later.
SPAWNCG = spawncg.usable()
_GLIBC = pytest.mark.skipif(
    not SPAWNCG, reason="this C library cannot spawn into a cgroup (glibc 2.39 and later can; run on such a host)"
)
WAYS = ("cloned", "prepare", pytest.param("spawn", marks=_GLIBC), pytest.param("ready", marks=_GLIBC))


def _spawn(
    cgroup: Path,
    command: list[str],
    tmp_path: Path,
    before: str = "",
    way: str = "cloned",
    meanwhile: str = "",
    credentials: str = "{}",
    cwd: str = "",
) -> dict[str, object]:
    """Start ``command`` in ``cgroup`` from a fresh Python process, ``way``: what that process saw, as JSON.
    Born ahead, the process waits a moment (and ``meanwhile`` runs) before it is told to go."""
    where = cwd or str(tmp_path)
    start = f"intocgroup.{way}({str(cgroup)!r}, {command!r}, {where!r}, dict(os.environ), {credentials}, out)"
    if way == "prepare":
        start = f"born = {start}; time.sleep(0.3); {meanwhile or 'pass'}; pid = born.go()"
    elif way == "ready":
        start = f"built = intocgroup.ready({str(cgroup)!r}, {command!r}, {where!r}, dict(os.environ), out)"
        start += f"; time.sleep(0.3); {meanwhile or 'pass'}; pid = built.run()"
    else:
        start = f"pid = {start}"
    script = textwrap.dedent(f"""
        import json, os, signal, sys, time
        from gpuq_scheduler.launcher.supervisor import containment, intocgroup
        {before}
        out = os.open({str(tmp_path / "out")!r}, os.O_WRONLY | os.O_CREAT, 0o600)
        mine = containment.own_cgroup()
        try:
            {start}
        except intocgroup.Unsupported as err:
            print(json.dumps({{"unsupported": str(err)}}))
            sys.exit()
        except OSError as err:
            print(json.dumps({{"errno": err.errno, "mine": mine, "after": containment.own_cgroup()}}))
            sys.exit()
        status = open(f"/proc/{{pid}}/status").read()
        procs = open({str(cgroup / "cgroup.procs")!r}).read().split()
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        print(json.dumps({{"pid": pid, "code": code, "mine": mine, "after": containment.own_cgroup(),
                          "procs": procs, "status": status, "me": os.getpid()}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("way", WAYS)
def test_a_job_is_born_in_its_cgroup_and_its_starter_never_moves(cgroup: Path, tmp_path: Path, way: str) -> None:
    # The job says where it is as its very first act, in a session of its own, from its own directory.
    # It inherits no descriptor of its starter's, not even one left inheritable (Popen's close_fds, kept).
    command = [
        "sh",
        "-c",
        "grep ^0:: /proc/self/cgroup; ps -o sid= -p $$; pwd; read -r line; echo read=$?; ls /proc/$$/fd",
    ]
    leak = "leak = os.open('/dev/null', os.O_RDONLY); os.set_inheritable(leak, True)"
    result = _spawn(cgroup, command, tmp_path, leak, way)
    assert result["code"] == 0
    assert result["mine"] == result["after"] and result["mine"] != f"/{cgroup.name}"
    assert str(result["pid"]) in result["procs"] and str(result["me"]) not in result["procs"]  # never its starter
    lines = (tmp_path / "out").read_text().splitlines()
    assert lines[0] == f"0::/{cgroup.name}"
    assert int(lines[1]) == result["pid"]  # setsid: its session is its own
    assert lines[2:] == [str(tmp_path), "read=1", "0", "1", "2"]  # its directory; stdin at end of file (/dev/null)


@pytest.mark.parametrize("way", WAYS)
def test_the_job_gets_default_signals_not_the_starters(cgroup: Path, tmp_path: Path, way: str) -> None:
    # The starter ignores SIGPIPE (Python does), has a handler for SIGTERM (the shim does) and blocks SIGUSR1:
    # none of it may reach the job, which must die of a broken pipe and of a SIGTERM like any program.
    before = "signal.signal(signal.SIGTERM, print); signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})"
    result = _spawn(cgroup, ["sleep", "0.5"], tmp_path, before, way)
    fields = dict(line.split(":\t", 1) for line in str(result["status"]).splitlines() if ":\t" in line)
    blocked, ignored = int(fields["SigBlk"], 16), int(fields["SigIgn"], 16)
    assert ignored & (1 << (13 - 1)) == 0 and ignored & (1 << (25 - 1)) == 0  # SIGPIPE, SIGXFSZ
    assert blocked == 1 << (10 - 1)  # the starter's mask is inherited, as with fork and exec: SIGUSR1 only
    assert int(fields["SigCgt"], 16) == 0  # exec reset every handler


@pytest.mark.parametrize("way", WAYS)
def test_a_program_that_is_not_there_is_an_oserror_and_leaves_nothing(cgroup: Path, tmp_path: Path, way: str) -> None:
    result = _spawn(cgroup, ["no-such-program-gpuq"], tmp_path, way=way)
    assert result["errno"] == 2 and result["mine"] == result["after"]
    assert (cgroup / "cgroup.procs").read_text() == ""  # the child that could not exec is gone, reaped


@pytest.mark.parametrize("way", WAYS)
def test_a_program_found_but_not_executable_is_permission_denied(cgroup: Path, tmp_path: Path, way: str) -> None:
    # As execvp says it: on PATH, but without the execute bit (a shim that said "not found" misled the user).
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "tool").chmod(0o644)
    before = f"os.environ['PATH'] = {str(tmp_path / 'bin')!r} + ':' + os.environ['PATH']"
    result = _spawn(cgroup, ["tool"], tmp_path, before, way)
    assert result["errno"] == 13 and (cgroup / "cgroup.procs").read_text() == ""


@pytest.mark.parametrize("way", WAYS)
def test_a_process_with_threads_is_refused_and_the_shim_moves_instead(cgroup: Path, tmp_path: Path, way: str) -> None:
    before = "import threading, time; threading.Thread(target=time.sleep, args=(5,), daemon=True).start()"
    result = _spawn(cgroup, ["true"], tmp_path, before, way)
    if way in ("spawn", "ready"):  # the C library's vfork is made for a process with threads
        assert result["code"] == 0 and str(result["pid"]) in result["procs"]
    else:
        assert result == {"unsupported": "this process runs more than one thread"}


def test_born_ahead_it_waits_as_the_shims_user_and_takes_the_jobs_credentials_at_its_turn(
    cgroup: Path, tmp_path: Path
) -> None:
    # Waiting, it is the shim's (root's): no user can signal it; the job runs as the user it was given (from
    # "/": a shared queue's jobs enter their own directory as their user, launcher.supervisor.processes.as_user).
    status = tmp_path / "waiting"
    meanwhile = f"open({str(status)!r}, 'w').write(open(f'/proc/{{born.pid}}/status').read())"
    nobody = "{'user': 65534, 'group': 65534, 'extra_groups': []}"
    result = _spawn(cgroup, ["sh", "-c", "id -u; id -g"], tmp_path, "", "prepare", meanwhile, nobody, cwd="/")
    assert result["code"] == 0
    uid = next(line for line in status.read_text().splitlines() if line.startswith("Uid:"))
    assert uid.split()[1:] == [str(os.getuid())] * 4
    assert (tmp_path / "out").read_text().split() == ["65534", "65534"]


@pytest.mark.parametrize("way", ["prepare", pytest.param("ready", marks=_GLIBC)])
def test_made_ahead_a_program_gone_by_its_turn_is_an_oserror_then(cgroup: Path, tmp_path: Path, way: str) -> None:
    (tmp_path / "tool").write_text("#!/bin/sh\necho ran\n")
    (tmp_path / "tool").chmod(0o755)
    gone = f"os.unlink({str(tmp_path / 'tool')!r})"
    result = _spawn(cgroup, [str(tmp_path / "tool")], tmp_path, way=way, meanwhile=gone)
    assert result["errno"] == 2 and (cgroup / "cgroup.procs").read_text() == ""


def test_born_ahead_and_let_go_it_ends_and_runs_nothing(cgroup: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os, time
        from gpuq_scheduler.launcher.supervisor import intocgroup
        out = os.open({str(tmp_path / "out")!r}, os.O_WRONLY | os.O_CREAT, 0o600)
        born = intocgroup.prepare({str(cgroup)!r}, ["touch", "ran"], {str(tmp_path)!r}, dict(os.environ), {{}}, out)
        time.sleep(0.3)
        assert open({str(cgroup / "cgroup.procs")!r}).read().split() == [str(born.pid)]
        born.abandon()
        print(born.pid)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip().isdigit()
    assert (cgroup / "cgroup.procs").read_text() == "" and not (tmp_path / "ran").exists()


ZYGOTE = """
import json, os, signal, sys, time
from gpuq_scheduler.launcher.supervisor import intocgroup, zygote
out = os.open({out!r}, os.O_WRONLY | os.O_CREAT, 0o600)
seen = {{}}
def born():
    waiting = intocgroup.prepare({cgroup!r}, ["sh", "-c", "echo ran >> ran"], {cwd!r}, dict(os.environ), {{}}, out)
    time.sleep(0.2)
    return waiting
def seen_of(waiting):
    return {{"pid": waiting.pid, "parent": int(open(f"/proc/{{waiting.pid}}/stat").read().split()[3]),
            "cgroup": open(f"/proc/{{waiting.pid}}/cgroup").read(),
            "zygote's": b"zygote" in open(f"/proc/{{waiting.pid}}/cmdline", "rb").read().split(bytes(1))}}
first = born()  # cloned by this process, which starts its zygote meanwhile
second = born()
maker = zygote.pid()
seen.update(first=seen_of(first), second=seen_of(second), zygote=maker, zygote_session=os.getsid(maker),
            zygote_cgroup=open(f"/proc/{{maker}}/cgroup").read())
for waiting in (first, second):
    os.waitpid(waiting.go(), 0)
os.kill(maker, signal.SIGKILL)
time.sleep(0.1)
third = born()  # the zygote is gone: cloned from this process again
seen["third"] = seen_of(third)
os.waitpid(third.go(), 0)
print(json.dumps({{**seen, "me": os.getpid(), "my_session": os.getsid(0)}}))
"""


def test_a_shims_zygote_bears_its_waiters_as_the_shims_children_and_when_it_dies_the_shim_clones_them(
    cgroup: Path, tmp_path: Path
) -> None:
    script = ZYGOTE.format(out=str(tmp_path / "out"), cgroup=str(cgroup), cwd=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(done.stdout)
    assert [seen[w]["zygote's"] for w in ("first", "second", "third")] == [False, True, False]
    for waiter in ("first", "second", "third"):  # each in the job's cgroup, the shim's child
        assert seen[waiter]["parent"] == seen["me"] and seen[waiter]["cgroup"].endswith(f"::/{cgroup.name}\n")
    assert seen["zygote"] not in (0, seen["me"]) and f"::/{cgroup.name}\n" not in seen["zygote_cgroup"]
    assert seen["zygote_session"] == seen["zygote"] != seen["my_session"]  # a ^C to the shim is not for it
    assert (tmp_path / "ran").read_text() == "ran\nran\nran\n"
    assert (cgroup / "cgroup.procs").read_text() == ""


def test_a_zygote_ends_with_its_shim(cgroup: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os, time
        from gpuq_scheduler.launcher.supervisor import intocgroup, zygote
        intocgroup.prepare({str(cgroup)!r}, ["true"], "/", dict(os.environ), {{}}, 1).abandon()
        born = intocgroup.prepare({str(cgroup)!r}, ["true"], "/", dict(os.environ), {{}}, 1)  # the zygote's
        time.sleep(0.2)
        print(zygote.pid(), born.pid, flush=True)
        os._exit(0)  # as a shim killed: nothing tidied
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    zygote, waiter = (int(word) for word in done.stdout.split())
    wait_for(lambda: ended(zygote) and ended(waiter), 10, "the zygote and its waiter to end")


def ended(pid: int) -> bool:
    """Gone, or a zombie its new parent has yet to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_zygote_that_hangs_is_ended_and_its_waiters_are_cloned_by_the_shim(cgroup: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import errno, os, signal, time
        from gpuq_scheduler.launcher.supervisor import intocgroup, zygote
        zygote._PATIENCE = 0.5
        def born():
            return intocgroup.prepare({str(cgroup)!r}, ["true"], "/", dict(os.environ), {{}}, 1)
        born().abandon()  # the zygote starts
        born().abandon()  # made by it
        maker = zygote.pid()
        os.kill(maker, signal.SIGSTOP)
        try:
            born()
        except OSError as err:
            print(err.errno == errno.EIO, end=" ")
        second = born()
        time.sleep(0.2)
        parent = int(open(f"/proc/{{second.pid}}/stat").read().split()[3])
        print(not os.path.exists(f"/proc/{{maker}}"), parent == os.getpid())
        os.waitpid(second.go(), 0)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["True", "True", "True"]
