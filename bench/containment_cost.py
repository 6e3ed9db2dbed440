"""What containment costs a job: start and end N `true`s as a shim does, with and without a cgroup each.

    sudo .venv/bin/python bench/containment_cost.py [N]

Per job: a bare posix_spawn and wait; the same inside a cgroup, the shim's way (make it, clone the job into
it, wait, count and remove it), and the old way (make it, move in, spawn, move out, wait, count and remove
it), side by side; and the fallback's one pass over /proc at the job's end. Prints wall and CPU ms.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpuq_scheduler.launcher.supervisor import containment, intocgroup, marked


def measure(what: str, runs: int, one: object) -> None:
    """Mean wall and CPU time of ``one``, each call alone: a pause before each, because the kernel's cost of
    moving a process between cgroups (an RCU grace period) is paid once by a burst of moves, and jobs start
    one at a time, apart."""
    assert callable(one)
    wall = cpu = 0.0
    for index in range(runs):
        time.sleep(0.05)
        started, used = time.perf_counter(), time.process_time()
        one(index)
        wall, cpu = wall + time.perf_counter() - started, cpu + time.process_time() - used
    print(f"{what:<34} {wall / runs * 1e3:6.2f} ms wall {cpu / runs * 1e3:6.2f} ms CPU")


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as home:
        found = containment.open_for(home, os.environ)
        print(found.describe(), f"({sum(1 for p in os.listdir('/proc') if p.isdigit())} processes)")

        def bare(_: int) -> None:
            os.waitpid(os.posix_spawnp("true", ["true"], os.environ, setsid=True), 0)

        def cloned(index: int) -> None:
            box = found.box(index)
            containment.make(box)
            assert box.cgroup is not None
            pid = intocgroup.spawn(box.cgroup, ["true"], "/", os.environ, {}, 1)
            os.waitpid(pid, 0)
            containment.end(box, pid)

        def moved(index: int) -> None:
            box = found.box(index)
            containment.make(box)
            back = containment.enter(box)
            try:
                pid = os.posix_spawnp("true", ["true"], os.environ, setsid=True)
            finally:
                containment.leave(back)
            os.waitpid(pid, 0)
            containment.end(box, pid)

        measure("bare spawn and wait", runs, bare)
        if found.kind == containment.CGROUP:
            for _ in range(2):  # alternating, so that neither way has the machine to itself
                measure("cloned into its cgroup", runs, cloned)
                measure("moved in and out of its cgroup", runs, moved)
        since = time.clock_gettime(time.CLOCK_BOOTTIME)
        measure("fallback: one pass over /proc", max(1, runs // 10), lambda _: marked.find("x/1", 1 << 22, since))
        found.close(set())
    return 0


if __name__ == "__main__":
    sys.exit(main())
