"""What containment costs a job: start and end N `true`s as a shim does, with and without a cgroup each.

    sudo .venv/bin/python bench/containment_cost.py [N]

Per job: a bare posix_spawn and wait; the same inside a cgroup (make it, move in, spawn, move out, wait,
count and remove it); and the fallback's one pass over /proc at the job's end. Prints wall and CPU ms.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpuq_scheduler.launcher.daemon import containment, marked


def measure(what: str, runs: int, one: object) -> None:
    assert callable(one)
    wall, cpu = time.perf_counter(), time.process_time()
    for index in range(runs):
        one(index)
    wall, cpu = (time.perf_counter() - wall) / runs * 1e3, (time.process_time() - cpu) / runs * 1e3
    print(f"{what:<34} {wall:6.2f} ms wall {cpu:6.2f} ms CPU")


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as home:
        found = containment.open_for(home, os.environ)
        print(found.describe(), f"({sum(1 for p in os.listdir('/proc') if p.isdigit())} processes)")

        def bare(_: int) -> None:
            os.waitpid(os.posix_spawnp("true", ["true"], os.environ, setsid=True), 0)

        def contained(index: int) -> None:
            box = found.box(index)
            back = containment.enter(box)
            try:
                pid = os.posix_spawnp("true", ["true"], os.environ, setsid=True)
            finally:
                containment.leave(back)
            os.waitpid(pid, 0)
            containment.end(box, pid)

        measure("bare spawn and wait", runs, bare)
        if found.kind == containment.CGROUP:
            measure("in a cgroup of its own", runs, contained)
        since = time.clock_gettime(time.CLOCK_BOOTTIME)
        measure("fallback: one pass over /proc", max(1, runs // 10), lambda _: marked.find("x/1", 1 << 22, since))
        found.close(set())
    return 0


if __name__ == "__main__":
    sys.exit(main())
