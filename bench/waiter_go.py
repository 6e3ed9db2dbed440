"""What a job's start costs from a waiter born ahead against a bare spawn (``intocgroup.prepare`` and
``Born.go``, against ``os.posix_spawn``), each start alone, as root:

    sudo python bench/waiter_go.py CGROUP_PARENT      e.g. /sys/fs/cgroup (a lent host) or /sys/fs/cgroup/unified

Both are timed until the exec is done (``Born.go`` returns when the waiter's exec closed its report pipe;
posix_spawn's vfork returns after the child's exec). Prints the medians of 30 starts of ``/bin/sleep 0``.
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
    print(f"Born.go until the exec is done {statistics.median(gos) * 1e3:.2f} ms, "
          f"posix_spawn {statistics.median(spawns) * 1e3:.2f} ms (medians of {len(gos)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
