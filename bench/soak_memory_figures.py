"""How the memory soak (bench/soak_memory.py) measures the daemon: a sampler thread reads its VmRSS (and
the anonymous, file and shared parts), open file descriptors, threads, children and CPU time from /proc
every few seconds, with the largest RSS and descriptor count among its shims; from those samples, taken
after a warm-up, come the figures of a run (RSS at the start and end, its growth and slope per 1,000 jobs
and per hour, fds, the largest shim's growth, daemon CPU per job) and the verdict: flat when RSS and the
largest shim grew under 5% and the fds did not grow.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs.store.statedir import StateDir


@dataclass
class Sample:
    t: float  # seconds since the stream started
    ended: int  # jobs seen ended by then
    submitted: int
    rss_kib: int
    hwm_kib: int
    anon_kib: int
    file_kib: int
    shmem_kib: int
    fds: int
    threads: int
    children: int  # the daemon's live children (shims, --notify commands) and zombies
    cpu_s: float  # the daemon's user + system CPU time
    pid: int
    shim_rss_kib: int = 0  # the largest RSS among the daemon's children: shims live on, job after job
    shim_fds: int = 0  # the most descriptors any of them holds


@dataclass
class MemoryRun:
    """What the stream did: every job's intended outcome, and how it went."""

    expected: dict[int, str] = field(default_factory=dict)  # job id -> the state it must end in
    kinds: Counter[str] = field(default_factory=Counter)  # submissions by kind
    outstanding: set[int] = field(default_factory=set)
    ended: int = 0
    arrays: int = 0
    cancels: int = 0
    samples: list[Sample] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)  # daemon pids seen: more than one means it was restarted
    errors: list[str] = field(default_factory=list)  # what the sampler could not read


def read_proc(pid: int) -> dict[str, float] | None:
    """The daemon's memory, fds, threads, children and CPU from /proc; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)

    def number(key: str) -> int:
        words = fields.get(key, "0").split()
        return int(words[0]) if words and words[0].isdigit() else 0

    after_name = stat[stat.rfind(")") + 2 :].split()  # fields 3...: state, ppid, ..., utime (14), stime (15)
    kids: list[str] = []
    with contextlib.suppress(OSError):  # needs CONFIG_PROC_CHILDREN; none where the kernel lacks it
        for task in os.listdir(f"/proc/{pid}/task"):
            kids += Path(f"/proc/{pid}/task/{task}/children").read_text().split()
    shim_rss = shim_fds = 0
    for kid in kids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            lines = Path(f"/proc/{kid}/status").read_text().splitlines()
            rss = next((x.split()[1] for x in lines if x.startswith("VmRSS:")), "0")  # none in a zombie
            shim_rss = max(shim_rss, int(rss))
            shim_fds = max(shim_fds, len(os.listdir(f"/proc/{kid}/fd")))
    return {
        "rss_kib": number("VmRSS"),
        "hwm_kib": number("VmHWM"),
        "anon_kib": number("RssAnon"),
        "file_kib": number("RssFile"),
        "shmem_kib": number("RssShmem"),
        "threads": number("Threads"),
        "fds": fds,
        "children": len(kids),
        "shim_rss_kib": shim_rss,
        "shim_fds": shim_fds,
        "cpu_s": (int(after_name[11]) + int(after_name[12])) / os.sysconf("SC_CLK_TCK"),
    }


def fd_targets(pid: int) -> dict[str, int]:
    """What the daemon's descriptors point at, counted by kind (a file's name, pipe, socket, ...)."""
    kinds: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                kinds[
                    target.split(":", 1)[0] + ":"
                    if target.startswith(("pipe:", "socket:", "anon_inode:"))
                    else os.path.basename(target)
                ] += 1
    return dict(sorted(kinds.items()))


def daemon_pid(state: StateDir) -> int | None:
    """The daemon's pid from its pid file. Not `running_pid`: probing the lock from here while no daemon
    holds it would, for that instant, make a daemon starting meanwhile think another one serves."""
    try:
        return int(state.pid.read_text().strip())
    except (OSError, ValueError):
        return None


def sampler(state: StateDir, run: MemoryRun, started: float, every: float, stop: threading.Event) -> None:
    """Sample the daemon every ``every`` seconds until ``stop`` is set."""
    while not stop.is_set():
        pid = daemon_pid(state)
        figures = read_proc(pid) if pid is not None and pid > 0 else None
        if pid is None or pid <= 0 or figures is None:
            run.errors.append(f"{time.monotonic() - started:.1f}s: no daemon running")
        else:
            run.pids.add(pid)
            run.samples.append(
                Sample(
                    round(time.monotonic() - started, 2),
                    run.ended,
                    len(run.expected),
                    int(figures["rss_kib"]),
                    int(figures["hwm_kib"]),
                    int(figures["anon_kib"]),
                    int(figures["file_kib"]),
                    int(figures["shmem_kib"]),
                    int(figures["fds"]),
                    int(figures["threads"]),
                    int(figures["children"]),
                    round(figures["cpu_s"], 2),
                    pid,
                    int(figures["shim_rss_kib"]),
                    int(figures["shim_fds"]),
                )
            )
        stop.wait(every)


def fit(points: list[tuple[float, float]]) -> float | None:
    """The slope of the least-squares line through ``points``; None with fewer than 2 distinct x."""
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / var


def memory_figures(
    run: MemoryRun,
    steady: int,
    seconds: float,
    warmup_jobs: int,
    warmup_seconds: float,
    idle_start: dict[str, float] | None,
    idle_end: dict[str, float] | None,
    fd_kinds: dict[str, int],
) -> dict[str, Any]:
    """The figures of a run: RSS after the warm-up and at the end, its slope, fds, and the verdict."""
    samples = run.samples[:steady]  # the steady stream; samples taken while draining are kept in the JSON only
    # The warm-up ends at warmup_jobs ended jobs or warmup_seconds, whichever comes first, and never later
    # than half-way through the stream, so that a short run still has a window to measure.
    limit = min(warmup_seconds, seconds / 2)
    after = [s for s in samples if s.ended >= warmup_jobs or s.t >= limit]
    figures: dict[str, Any] = {
        "jobs": {
            "submitted": len(run.expected),
            "ended": run.ended,
            "arrays": run.arrays,
            "cancel_requests": run.cancels,
            "by_kind": dict(run.kinds),
            "by_intended_state": dict(Counter(run.expected.values())),
            "per_second": round(run.ended / seconds, 1) if seconds else None,
        },
        "stream_seconds": round(seconds, 1),
        "samples": len(run.samples),
        "samples_steady": len(samples),
        "daemon_pids": sorted(run.pids),
        "series": [asdict(sample) for sample in run.samples],
    }
    if len(after) < 2:
        figures["verdict"] = "no verdict: fewer than 2 samples after the warm-up (run longer)"
        figures["flat"] = None
        return figures
    first, last = after[0], after[-1]
    per_job = fit([(s.ended, s.rss_kib) for s in after])
    per_second = fit([(s.t, s.rss_kib) for s in after])
    growth = 100.0 * (last.rss_kib - first.rss_kib) / first.rss_kib
    head, tail = after[: max(1, len(after) // 4)], after[-max(1, len(after) // 4) :]
    fd_start, fd_end = min(s.fds for s in head), min(s.fds for s in tail)  # min: a pipe open mid-launch is noise
    figures["warmup"] = {"until_s": first.t, "jobs": first.ended}
    figures["rss_kib"] = {
        "before_jobs": None if idle_start is None else int(idle_start["rss_kib"]),
        "start": first.rss_kib,
        "end": last.rss_kib,
        "max": max(s.rss_kib for s in samples),
        "hwm": max(s.hwm_kib for s in run.samples),
        "idle_after_drain": None if idle_end is None else int(idle_end["rss_kib"]),
        "anon_start": first.anon_kib,
        "anon_end": last.anon_kib,
        "file_start": first.file_kib,
        "file_end": last.file_kib,
        "shmem_start": first.shmem_kib,
        "shmem_end": last.shmem_kib,
    }
    figures["growth_pct"] = round(growth, 2)
    figures["slope"] = {
        "kib_per_1000_jobs": None if per_job is None else round(per_job * 1000, 1),
        "kib_per_hour": None if per_second is None else round(per_second * 3600, 1),
    }
    figures["fds"] = {
        "before_jobs": None if idle_start is None else int(idle_start["fds"]),
        "start": fd_start,
        "end": fd_end,
        "max": max(s.fds for s in samples),
        "idle_after_drain": None if idle_end is None else int(idle_end["fds"]),
        "idle_after_drain_kinds": fd_kinds,
    }
    figures["children_max"] = max(s.children for s in samples)
    # The largest shim, averaged over the first and last quarters (which shim is largest changes as they come
    # and go): a shim runs job after job, so it must not grow either.
    shim_start, shim_end = (sum(s.shim_rss_kib for s in q) / len(q) for q in (head, tail))
    shim_growth = 100.0 * (shim_end - shim_start) / shim_start if shim_start else 0.0
    figures["shims"] = {
        "rss_kib_start": round(shim_start),
        "rss_kib_end": round(shim_end),
        "growth_pct": round(shim_growth, 2),
        "fds_max": max(s.shim_fds for s in samples),
    }
    span = [(a, b) for a, b in itertools.pairwise(after) if b.ended > a.ended]
    halves = span[: len(span) // 2], span[len(span) // 2 :]
    figures["cpu_ms_per_job"] = [
        round(1000 * sum(b.cpu_s - a.cpu_s for a, b in half) / sum(b.ended - a.ended for a, b in half), 2)
        if half
        else None
        for half in halves
    ]
    grew_fds = fd_end > fd_start
    flat = growth < 5.0 and not grew_fds and shim_growth < 5.0
    figures["flat"] = flat
    figures["verdict"] = (
        f"{'flat' if flat else 'NOT FLAT'}: RSS {first.rss_kib} -> {last.rss_kib} KiB ({growth:+.1f}%) from "
        f"{first.t:.0f}s ({first.ended} jobs) to {last.t:.0f}s ({last.ended} jobs); slope "
        f"{figures['slope']['kib_per_1000_jobs']} KiB per 1,000 jobs, {figures['slope']['kib_per_hour']} KiB/hour; "
        f"fds {fd_start} -> {fd_end}{' (grew)' if grew_fds else ''}; largest shim {shim_start:.0f} -> "
        f"{shim_end:.0f} KiB ({shim_growth:+.1f}%)"
    )
    return figures
