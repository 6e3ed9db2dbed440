"""What a job's start costs from a waiter born ahead against a bare spawn (``intocgroup.prepare`` and
``Born.go``, against ``os.posix_spawn``), each start alone, as root:

    sudo python bench/waiter_go.py CGROUP_PARENT      e.g. /sys/fs/cgroup (a lent host) or /sys/fs/cgroup/unified

Both are timed until the exec is done (``Born.go`` returns when the waiter's exec closed its report pipe;
posix_spawn's vfork returns after the child's exec). Prints the medians of 30 starts of ``/bin/sleep 0``.

Then, to the job's first clock read (``date +%s%N``, from the go), the waiter against a small shell waiting
as the waiter does (``sh -c 'read _ <&3; exec "$@"'``: what an exec costs from a process far smaller than
an interpreter) and posix_spawn.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpuq_scheduler.launcher.supervisor import intocgroup


def main() -> int:
    parent = Path(sys.argv[1]) / f"gpuq-waiter-go-{os.getpid()}"
    parent.mkdir()
    env = {"PATH": "/usr/bin:/bin"}
    gos, spawns = [], []
    try:
        for index in range(30):
            cgroup = parent / str(index)
            cgroup.mkdir()
            born = intocgroup.prepare(str(cgroup), ["/bin/sleep", "0"], "/", env, {}, 1)
            time.sleep(0.15)  # the waiter is up and waiting, as a staged job's is at its turn
            started = time.perf_counter()
            pid = born.go()
            gos.append(time.perf_counter() - started)
            os.waitpid(pid, 0)
            cgroup.rmdir()
            time.sleep(0.03)
            started = time.perf_counter()
            pid = os.posix_spawn("/bin/sleep", ["sleep", "0"], env)
            spawns.append(time.perf_counter() - started)
            os.waitpid(pid, 0)
    finally:
        parent.rmdir()
    print(
        f"Born.go until the exec is done {statistics.median(gos) * 1e3:.2f} ms, "
        f"posix_spawn {statistics.median(spawns) * 1e3:.2f} ms (medians of {len(gos)})"
    )
    first = {"the waiter": _waiter, "a shell waiting": _shell, "posix_spawn": _spawned}
    reads: dict[str, list[float]] = {name: [] for name in first}
    parent.mkdir()
    try:
        for index in range(30):
            for name, way in first.items():
                reads[name].append(way(parent / f"{name[0]}{index}", env))
    finally:
        for cgroup in parent.iterdir():
            if cgroup.is_dir():
                cgroup.rmdir()
        parent.rmdir()
    print(
        "from the go to the job's first clock read: "
        + ", ".join(f"{name} {statistics.median(times):.2f} ms" for name, times in reads.items())
    )
    return 0


DATE = ["/usr/bin/date", "+%s%N"]


def _waiter(cgroup: Path, env: dict[str, str]) -> float:
    cgroup.mkdir()
    out_read, out_write = os.pipe()
    born = intocgroup.prepare(str(cgroup), DATE, "/", env, {}, out_write)
    os.close(out_write)
    time.sleep(0.15)
    return _stamped(out_read, born.go, born.pid)


def _shell(cgroup: Path, env: dict[str, str]) -> float:
    out_read, out_write = os.pipe()
    go_read, go_write = os.pipe()
    script = 'read _ <&3; exec 3<&- "$@"'
    pid = os.posix_spawn(
        "/bin/sh",
        ["sh", "-c", script, "sh", *DATE],
        env,
        file_actions=[(os.POSIX_SPAWN_DUP2, out_write, 1), (os.POSIX_SPAWN_DUP2, go_read, 3)],
    )
    for fd in (out_write, go_read):
        os.close(fd)
    time.sleep(0.15)
    try:
        return _stamped(out_read, lambda: os.write(go_write, b"\n"), pid)
    finally:
        os.close(go_write)


def _spawned(cgroup: Path, env: dict[str, str]) -> float:
    out_read, out_write = os.pipe()
    time.sleep(0.15)
    pid: list[int] = []

    def spawn() -> None:
        pid.append(os.posix_spawn(DATE[0], DATE, env, file_actions=[(os.POSIX_SPAWN_DUP2, out_write, 1)]))
        os.close(out_write)

    return _stamped(out_read, spawn, None, pid)


def _stamped(out: int, go: object, pid: int | None, later: list[int] | None = None) -> float:
    """ms from ``go()`` to the clock the job read, as it printed it to ``out``; the job reaped."""
    assert callable(go)
    started = time.time_ns()
    go()
    stamp = int(os.read(out, 100))
    os.close(out)
    os.waitpid(pid if pid is not None else (later or [0])[0], 0)
    return (stamp - started) / 1e6


if __name__ == "__main__":
    sys.exit(main())
