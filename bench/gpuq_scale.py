"""D, scale (gpuq only): a scheduling pass over 10,000 pending jobs, `gpuq status` over a long history,
and the daemon's CPU use while idle and while 1,000 jobs wait.

The pass is timed two ways: the pure policy (``launcher.policy.placement.place``) on 10,000 requests and 8
GPUs, and the daemon's own pass (``Scheduler.place_and_launch``: eligibility, planning, recording why
each job waits) with 10,000 pending jobs in its table and 8 busy GPUs, as after an event (a job ended,
a request came), and as a periodic wake-up in which nothing changed.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

from bench.peers.base import clean_env, run, timed, wait_until
from bench.peers.gpuq import Gpuq

GiB = 1 << 30


def _median_ms(fn: Any, repeat: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), times


def placement_pass(pending: int = 10_000, gpus: int = 8, repeat: int = 9) -> dict[str, Any]:
    """``place()`` over ``pending`` requests on ``gpus`` GPUs, in three situations; the median of each."""
    from gpuq_scheduler.launcher.policy.placement import GpuView, Holding, Policy, Request, place

    views = [GpuView(i, 80 * GiB) for i in range(gpus)]
    uniform = [Request(i, 1) for i in range(1, pending + 1)]
    shapes = [(1, None), (1, 10 * GiB), (2, None), (2, 20 * GiB), (4, None), (1, 4 * GiB), (8, None)]
    mixed = [
        Request(
            i,
            shapes[i % len(shapes)][0],
            shapes[i % len(shapes)][1],
            [None, 600.0, 3600.0][i % 3],
            i // 1000 if i % 5 == 0 else None,
        )
        for i in range(1, pending + 1)
    ]
    busy = [Holding(100_000 + i, (i,), None, None) for i in range(gpus)]
    half = [Holding(100_000 + i, (i,), 30 * GiB, time.time() + 60 * i) for i in range(gpus // 2)]
    now = time.time()
    policy = Policy()
    cases = {
        "free_uniform": lambda: place(uniform, views, [], now, policy),
        "busy_uniform": lambda: place(uniform, views, busy, now, policy),
        "mixed_half_busy": lambda: place(mixed, views, half, now, policy, None, 0, {i: 4 for i in range(11)}),
    }
    result: dict[str, Any] = {"pending": pending, "gpus": gpus}
    for name, case in cases.items():
        result[f"place_{name}_ms"], _ = _median_ms(case, repeat)
    result["place_worst_ms"] = max(v for k, v in result.items() if k.startswith("place_") and k.endswith("_ms"))
    return result


def daemon_pass(work: Path, pending: int = 10_000, gpus: int = 8, repeat: int = 9) -> dict[str, Any]:
    """The daemon's pass (``Scheduler.place_and_launch``) with ``pending`` queued and every GPU busy."""
    from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Launch
    from gpuq_scheduler.jobs.outcome import JobState
    from gpuq_scheduler.jobs.store.statedir import StateDir
    from gpuq_scheduler.jobs.store.table import JobTable
    from gpuq_scheduler.launcher.daemon.lives import Running
    from gpuq_scheduler.launcher.daemon.scheduler import Scheduler
    from gpuq_scheduler.launcher.gpus.fake import FakeGpus

    state = StateDir(work / "pass-home")
    state.ensure()
    table = JobTable(state.db, create=True)
    now = time.time()
    spec = JobSpec(command=("python", "train.py"), cwd="/tmp", env={"PATH": "/usr/bin"}, gpus=1)
    records = [
        JobRecord(
            id=i,
            spec=spec.__class__(**{**spec.__dict__, "command": ("python", "train.py", str(i))}),
            uid=0,
            user="root",
            state=JobState.PENDING,
            submitted_at=now,
            log="",
        )
        for i in range(1, pending + 1)
    ]
    table.insert_pending(records)
    table.close()
    scheduler = Scheduler(state, FakeGpus(f"{gpus}x80GiB"))
    try:
        for i in range(gpus):  # every GPU runs a job of ours, so nothing can start and every job gets a reason
            busy = JobRecord(
                id=100_000 + i,
                spec=spec,
                uid=0,
                user="root",
                state=JobState.RUNNING,
                submitted_at=now,
                started_at=now,
                gpus=(i,),
                log="",
            )
            scheduler.lives.add(busy)
            scheduler.lives.start(Running(busy, Launch(shim_pid=0, shim_start=None, boot_id="", port=None)))
        snapshot = scheduler.snapshot()
        started = time.perf_counter()
        scheduler.place_and_launch(time.time(), snapshot)  # the first pass also writes 10,000 reasons
        first = (time.perf_counter() - started) * 1000

        def after_event() -> None:
            # What a job's ending or a request does before the next pass: the daemon may skip a pass in
            # which nothing it looks at changed, and this pass must not be skipped.
            scheduler.changes.mark()
            scheduler.place_and_launch(time.time(), scheduler.snapshot())

        steady, _ = _median_ms(after_event, repeat)
        quiet, _ = _median_ms(lambda: scheduler.place_and_launch(time.time(), scheduler.snapshot()), repeat)
        launched = pending - len(scheduler.pending)
    finally:
        for job_id in list(scheduler.running):
            scheduler.lives.end(job_id)
        scheduler.close()
    return {
        "daemon_pass_ms": steady,
        "daemon_first_pass_ms": first,
        "daemon_unchanged_pass_ms": quiet,
        "daemon_pass_launched": launched,
    }


def build_history(home: Path, count: int) -> float:
    """A state directory with ``count`` finished jobs, written straight into the table. Returns seconds."""
    from gpuq_scheduler.jobs.model import JobRecord, JobSpec
    from gpuq_scheduler.jobs.outcome import JobState, Outcome
    from gpuq_scheduler.jobs.store.statedir import StateDir
    from gpuq_scheduler.jobs.store.table import JobTable

    started = time.perf_counter()
    state = StateDir(home)
    state.ensure()
    table = JobTable(state.db, create=True)
    base = time.time() - count * 10
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    records = []
    for i in range(1, count + 1):
        spec = JobSpec(
            command=("python", "train.py", "--seed", str(i)),
            cwd="/work/runs",
            env=env,
            gpus=1 + (i % 8 == 0),
            mem_per_gpu=None if i % 3 else 8 * GiB,
            name=f"seed{i}",
        )
        records.append(
            JobRecord(
                id=i,
                spec=spec,
                uid=0,
                user="root",
                state=JobState.PENDING,
                submitted_at=base + i * 10,
                log=str(state.log(i)),
            )
        )
    table.insert_pending(records)
    endings = [
        (i, Outcome.succeeded() if i % 10 else Outcome.failed(1), base + i * 10 + 9) for i in range(1, count + 1)
    ]
    table.finish_many(endings)
    table.close()
    db = sqlite3.connect(state.db)
    with db:
        db.execute("UPDATE jobs SET started_at = submitted_at + 1, gpus = json_array(id % 8)")
    db.close()
    (home / "gpus.json").write_text(
        json.dumps(
            {
                "gpus": [
                    {"index": i, "uuid": f"GPU-fake-{i}", "name": "fake", "total": 80 * GiB, "lost": False}
                    for i in range(8)
                ]
            }
        )
    )
    return time.perf_counter() - started


def status_times(gpuq: str, home: Path, repeat: int = 5) -> dict[str, Any]:
    full = clean_env({"GPUQ_HOME": str(home), "GPUQ_FAKE_GPUS": "8x80GiB"})
    result: dict[str, Any] = {}
    for label, args in (("status", []), ("status_all", ["--all"]), ("status_json", ["--json"])):
        times = [timed([gpuq, "status", *args], full) for _ in range(repeat if label != "status_all" else 3)]
        result[f"{label}_ms"] = statistics.median(times) * 1000
    result["help_ms"] = statistics.median(timed([gpuq, "--help"], full) for _ in range(repeat)) * 1000
    return result


def cpu_percent(pid: int, seconds: float) -> float:
    import psutil

    proc = psutil.Process(pid)
    before = proc.cpu_times()
    time.sleep(seconds)
    after = proc.cpu_times()
    return max(0.0, (after.user + after.system - before.user - before.system) / seconds * 100)


def daemon_cpu(work: Path, seconds: float, waiting: int = 1000) -> dict[str, Any]:
    """The daemon's CPU use over ``seconds`` idle, then with ``waiting`` jobs behind a 4-GPU blocker."""
    result: dict[str, Any] = {"cpu_window_s": seconds, "cpu_waiting_jobs": waiting}
    with Gpuq(work / "cpu") as tool:
        time.sleep(1.0)
        pid = tool.daemon_pid()
        result["idle_cpu_pct"] = cpu_percent(pid, seconds)
        blocker = json.loads(tool.gpuq("submit", "--json", "--gpus", "4", "sleep", "600"))["id"]
        wait_until(lambda: tool.pending_count() == 0, 30, "the blocker to start")
        array = json.loads(tool.gpuq("submit", "--json", "--array", f"0-{waiting - 1}", "--gpus", "4", "true"))["id"]
        wait_until(lambda: tool.pending_count() >= waiting, 60, "the array to be ingested")
        time.sleep(1.5)  # past the first passes, which record every job's reason
        result["waiting_cpu_pct"] = cpu_percent(pid, seconds)
        with contextlib.suppress(Exception):
            tool.gpuq("cancel", str(array), str(blocker))
            run([tool.binary, "wait"], tool.env, check=False, timeout=60)
    return result


def workload_d(tool_work: Path, quick: bool) -> dict[str, Any]:
    from bench.peers.gpuq import binary

    gpuq = binary()
    assert gpuq is not None
    result: dict[str, Any] = {}
    result.update(placement_pass())
    result.update(daemon_pass(tool_work))
    history = 100_000
    home = tool_work / "history"
    result["history_jobs"] = history
    result["history_build_s"] = build_history(home, history)
    result.update(status_times(gpuq, home, repeat=3 if quick else 5))
    result.update(daemon_cpu(tool_work, 3.0 if quick else 10.0))
    return result
