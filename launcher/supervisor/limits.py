"""A job's host limits on its cgroup (docs/containment.md): which controllers the queue's cgroup hands down,
the files each limit is written to, and what the kernel counted against them by the job's end.

``--cpus`` is ``cpu.max``, ``--ram`` is ``memory.max`` (no swap past it; the whole job ends at it), ``--pids``
(or a shared queue's ``default_pids``) is ``pids.max``: the most tasks the job may hold at once, threads
included, so that a fork bomb in a job stops at it and never reaches the rest of the machine.
"""

from __future__ import annotations

import contextlib
import os

from gpuq_scheduler.launcher.supervisor import cgroupfs

LIMITS = ("cpu", "memory", "pids")  # the controllers --cpus, --ram and --pids need
FLAGS = {"cpu": "--cpus", "memory": "--ram", "pids": "--pids"}
_PERIOD = 100_000  # cpu.max's period, in microseconds


def hand_down(base: str, group: str, inside: bool) -> tuple[tuple[str, ...], str]:
    """Enable the controllers of LIMITS for the jobs' cgroups where the base has them: those got, and why
    not the others ("" if all)."""
    offered = [c for c in LIMITS if c in cgroupfs.words(f"{base}/cgroup.controllers")]
    if not offered:
        return (), f"{base} has no cpu, memory or pids controller to give"
    if inside:
        with contextlib.suppress(OSError):
            leaf = f"{group}/daemon"  # no internal processes: the daemon (and its shims) leave the base
            os.makedirs(leaf, exist_ok=True)
            cgroupfs.write(f"{leaf}/cgroup.procs", str(os.getpid()))
    why = ""
    for at in (base, group):
        missing = [c for c in offered if c not in cgroupfs.words(f"{at}/cgroup.subtree_control")]
        if missing:
            try:
                cgroupfs.write(f"{at}/cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
            except OSError as err:
                why = f"{at} cannot hand them down: {err.strerror}"
                break
    got = tuple(c for c in offered if c in cgroupfs.words(f"{group}/cgroup.subtree_control"))
    if not why and len(got) < len(LIMITS):
        why = f"{base} offers only {', '.join(offered)}"
    return got, why


def apply(cgroup: str, cpus: float | None, ram: int | None, pids: int | None) -> None:
    """Write a job's limits on its cgroup (made already). OSError if one cannot be written."""
    if cpus is not None:
        cgroupfs.write(f"{cgroup}/cpu.max", f"{max(1000, round(cpus * _PERIOD))} {_PERIOD}")
    if ram is not None:
        cgroupfs.write(f"{cgroup}/memory.max", str(ram))
        with contextlib.suppress(OSError):  # no swap, or no swap accounting: memory.max is the whole limit
            cgroupfs.write(f"{cgroup}/memory.swap.max", "0")
        # At its limit the job ends as one (a worker killed alone would leave its pool hanging).
        cgroupfs.write(f"{cgroup}/memory.oom.group", "1")
    if pids is not None:
        cgroupfs.write(f"{cgroup}/pids.max", str(pids))


def reached(cgroup: str, ram: int | None, pids: int | None) -> dict[str, object]:
    """What the kernel held the job to and how often it had to, read at its end, for its reason:
    ``ram_limit`` and ``oom_kills`` (the OOM killer at memory.max), ``pids_limit`` and ``pids_refused``
    (forks and clones refused at pids.max, pids.events' ``max``), each only where known."""
    facts: dict[str, object] = {}
    if ram is not None:
        facts["ram_limit"] = ram
    if pids is not None:
        facts["pids_limit"] = pids
        refused = cgroupfs.keyed(f"{cgroup}/pids.events").get("max")
        if refused:
            facts["pids_refused"] = refused
    return facts


def usage(cgroup: str) -> dict[str, object]:
    """What a cgroup's processes used: CPU seconds (cpu.stat is there without the cpu controller), peak
    memory and kills by the OOM killer at its limit (with the memory controller)."""
    facts: dict[str, object] = {}
    stat = cgroupfs.keyed(f"{cgroup}/cpu.stat")
    if "usage_usec" in stat:
        facts["cpu_seconds"] = stat["usage_usec"] / 1e6
    events = cgroupfs.keyed(f"{cgroup}/memory.events")
    if events.get("oom_kill"):
        facts["oom_kills"] = events["oom_kill"]
    with contextlib.suppress(IndexError, ValueError):
        facts["peak_ram"] = int(cgroupfs.words(f"{cgroup}/memory.peak")[0])
    return facts
