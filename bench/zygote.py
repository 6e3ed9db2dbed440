"""What a waiter costs made by the shim's zygote against cloned from the shim (``launcher.supervisor.zygote``,
``intocgroup``), in one run, as root on a cgroup v2 hierarchy:

    sudo python bench/zygote.py CGROUP_PARENT [N]      e.g. /sys/fs/cgroup (a lent host) or /sys/fs/cgroup/unified

This process stands for the shim (the clone copies it: it holds what a shim imports). For each way, N waiters
(default 30) in turn: the CPU its birth took (this process's, the zygote's and the waiter's, until the waiter
is up), then, born ahead a moment before its go, the time from the go to the job's first clock read
(``date +%s%N``), and the same from posix_spawn for reference. Medians.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpuq_scheduler.launcher.supervisor import intocgroup, shim, zygote  # noqa: F401 (shim: its imports, as a shim's)

DATE = ["/usr/bin/date", "+%s%N"]
ENV = {"PATH": "/usr/bin:/bin"}


def _cpu(pid: int | str = "self") -> float:
    """Seconds on a CPU (the kernel's schedstat, in ns: /proc's ticks are 10 ms)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except OSError:
        return 0.0


def one(cgroup: str) -> tuple[float, float]:
    """A waiter's birth (ms of CPU, until it is up) and its go to the job's first clock read (ms)."""
    out_read, out_write = os.pipe()
    maker = zygote.pid() if zygote._socket is not None else 0
    before = _cpu() + (_cpu(maker) if maker else 0.0)
    born = intocgroup.prepare(cgroup, DATE, "/", ENV, {}, out_write)
    os.close(out_write)
    while not born.ready():
        time.sleep(0.0005)
    # This process's, the zygote's and the waiter's own (its copy of its maker, and any interpreter it started).
    birth = (_cpu() + (_cpu(maker) if maker else 0.0) + _cpu(born.pid) - before) * 1000
    time.sleep(0.1)
    started = time.time_ns()
    pid = born.go()
    stamp = int(os.read(out_read, 100))
    os.close(out_read)
    os.waitpid(pid, 0)
    return birth, (stamp - started) / 1e6


def spawned() -> float:
    out_read, out_write = os.pipe()
    time.sleep(0.1)
    started = time.time_ns()
    pid = os.posix_spawn(DATE[0], DATE, ENV, file_actions=[(os.POSIX_SPAWN_DUP2, out_write, 1)])
    os.close(out_write)
    stamp = int(os.read(out_read, 100))
    os.close(out_read)
    os.waitpid(pid, 0)
    return (stamp - started) / 1e6


def main() -> int:
    cgroup = Path(sys.argv[1]) / f"gpuq-zygote-bench-{os.getpid()}"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    cgroup.mkdir()
    results: dict[str, list[tuple[float, float]]] = {"zygote": [], "cloned from the shim": []}
    spawns = []
    try:
        for _ in range(count):
            results["zygote"].append(one(str(cgroup)))
            zygote._failed, saved = True, zygote._socket  # as if it had died: the shim clones
            zygote._socket = None
            results["cloned from the shim"].append(one(str(cgroup)))
            zygote._failed, zygote._socket = False, saved
            spawns.append(spawned())
    finally:
        cgroup.rmdir()
    for name, runs in results.items():
        births, gos = zip(*runs, strict=True)
        print(
            f"{name:22s} birth {statistics.median(births):6.2f} ms CPU   go to the job's first clock read "
            f"{statistics.median(gos):.2f} ms"
        )
    print(f"{'posix_spawn':22s} {'':21s}   spawn to the job's first clock read {statistics.median(spawns):.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
