"""What the cgroup controllers a job's cgroup has cost its start, its run and its end, with none of its limits set.

    sudo python bench/controller_cost.py [N]

gpuq hands the cpu and memory controllers down to every job's cgroup where the host has them (for --cpus and
--ram, and for the peak host memory it records), whether or not the job asked for a limit. This measures, for
each set of controllers this host can give (none; memory; cpu and memory), N jobs started apart as a shim
starts one (cloned into a fresh cgroup), each a shell that forks and execs ``date`` and ends, as workload A's
job does: the ``mkdir`` of the cgroup, the job from its clone to its reaping, ``containment.end`` (is it
empty, its usage) and the ``rmdir``. Medians, wall ms. On the 2-core VM (cgroup2 with hugetlb only) only the
first set can be measured; a lent GPU host has all three.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpuq_scheduler.launcher.supervisor import containment, intocgroup

SETS = ((), ("memory",), ("cpu", "memory"))
JOB = ["/bin/sh", "-c", "date +%s.%N > /dev/null; exit 0"]


def measure(parent: str, runs: int) -> dict[str, float]:
    steps: dict[str, list[float]] = {}
    for index in range(runs):
        time.sleep(0.05)  # jobs start apart
        box = containment.Box(f"cost/{index}", f"{parent}/job-{index}")
        assert box.cgroup is not None
        at = time.perf_counter()
        os.mkdir(box.cgroup)
        made = time.perf_counter()
        pid = intocgroup.spawn(box.cgroup, JOB, "/", dict(os.environ), {}, os.open(os.devnull, os.O_WRONLY))
        os.waitpid(pid, 0)
        ran = time.perf_counter()
        containment.end(box, pid, remove=False)
        ended = time.perf_counter()
        containment.discard(box)
        gone = time.perf_counter()
        for name, value in (
            ("mkdir", made - at),
            ("job: clone to reaped", ran - made),
            ("end", ended - ran),
            ("rmdir", gone - ended),
        ):
            steps.setdefault(name, []).append(value * 1e3)
    return {name: statistics.median(values) for name, values in steps.items()}


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    mount = containment.cgroup2_mount()
    if mount is None or os.geteuid() != 0:
        raise SystemExit("needs root and a cgroup v2 hierarchy")
    offered = Path(mount, "cgroup.controllers").read_text().split()
    print(
        f"{os.cpu_count()} cores, kernel {os.uname().release}, {mount} offers: {' '.join(offered) or 'nothing'}; "
        f"{runs} jobs each, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    for wanted in SETS:
        name = "+".join(wanted) or "no controller"
        if any(c not in offered for c in wanted):
            print(f"{name:>16}: not offered here")
            continue
        parent = f"{mount}/gpuq-controller-cost-{os.getpid()}"
        os.mkdir(parent)
        try:
            if wanted:
                Path(mount, "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
                Path(parent, "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
            found = measure(parent, runs)
        finally:
            os.rmdir(parent)
        print(f"{name:>16}: " + ", ".join(f"{step} {ms:.3f} ms" for step, ms in found.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
