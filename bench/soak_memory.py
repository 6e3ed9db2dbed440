"""The memory soak (``bench/soak.py --memory``): it measures whether a long-lived daemon's memory stays
flat. One daemon, never killed, on 4 fake 80 GiB GPUs is kept busy with a steady stream of short shell
jobs (single jobs, --mem jobs sharing GPUs, 2-GPU jobs, CPU jobs, small arrays, failing jobs, time-outs,
cancels of jobs and arrays) while bench/soak_memory_figures.py samples its RSS and file descriptors and
those of its largest shim; afterwards every job must have ended as intended and run at most once, and
`gpuq doctor` must find nothing. The figures and every sample are written as JSON (--out).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import platform
import random
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.soak_memory_figures import MemoryRun, fd_targets, memory_figures, read_proc, sampler
from gpuq_scheduler.jobs import api
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.views import doctor
from tests.conftest import Gpuq, make_env, read_reports, wait_for
from tests.invariants import MARGIN

if TYPE_CHECKING:
    from gpuq_scheduler.jobs.store.table import JobTable

ROOT = Path(__file__).resolve().parent.parent

MEMORY_JOB = """#!/bin/sh
# The memory soak's job: job.sh REPORT SECONDS CODE [FAIL_INDEX INDEX]. Sleeps, then appends one JSON line
# (the fields tests/invariants.py reads) to REPORT and exits CODE, or 4 when INDEX is FAIL_INDEX. A job
# killed while it sleeps (cancelled, timed out) writes nothing.
s=$(date +%s.%N)
sleep "$2"
code=$3
if [ $# -ge 5 ] && [ "$4" = "$5" ]; then code=4; fi
e=$(date +%s.%N)
printf '{"job": %s, "attempt": %s, "cvd": "%s", "mem": "%s", "start": %s, "end": %s}\\n' \\
    "$GPUQ_JOB_ID" "${GPUQ_ATTEMPT:-1}" "$CUDA_VISIBLE_DEVICES" "$GPUQ_MEM_PER_GPU" "$s" "$e" >> "$1"
exit "$code"
"""

FAKE_GPUS = "4x80GiB"
LONG = "60"  # seconds a job meant to be cancelled or timed out would sleep: far past its cancel or limit
# What the stream is made of (kind, weight); `memory_submit` says what each kind submits and how it must end.
KINDS: list[tuple[str, int]] = [
    ("single", 30),  # 1 whole GPU, succeeds
    ("shared", 25),  # 1 GPU with --mem 10G/20G/30G: several share a GPU; succeeds
    ("shared2", 5),  # 2 GPUs with --mem 25G; succeeds
    ("cpu", 5),  # --gpus 0; succeeds
    ("fail", 10),  # exits 3: failed
    ("array", 12),  # 3 to 8 members, some throttled, a third with one member that exits 4 (failed)
    ("cancel", 7),  # a long job cancelled 0 to 1.5 s after its submit, pending or running by then
    ("cancel-array", 2),  # an array of 3 long members cancelled by its array id
    ("timeout", 4),  # --time 1 on a long job: timeout
]


def memory_submit(
    kind: str,
    rng: random.Random,
    home: Path,
    work: Path,
    job: Path,
    report: Path,
    run: MemoryRun,
    cancels: list[tuple[float, int, list[int]]],
) -> None:
    """Submit one item of the stream and record how each of its jobs must end."""
    script = ["/bin/sh", str(job), str(report)]
    seconds = f"{rng.uniform(0.05, 0.4):.2f}"
    ids: dict[int, str] = {}
    if kind in ("single", "shared", "shared2", "cpu", "fail"):
        shapes: dict[str, dict[str, Any]] = {
            "single": {"gpus": 1},
            "shared": {"gpus": 1, "mem": rng.choice(["10G", "20G", "30G"])},
            "shared2": {"gpus": 2, "mem": "25G"},
            "cpu": {"gpus": 0},
            "fail": rng.choice([{"gpus": 1}, {"gpus": 1, "mem": "20G"}]),
        }
        shape = shapes[kind]
        code = "3" if kind == "fail" else "0"
        job_id = api.submit([*script, seconds, code], home=home, cwd=work, **shape)
        ids[job_id] = "failed" if kind == "fail" else "succeeded"
    elif kind == "array":
        size = rng.randint(3, 8)
        failing = rng.randrange(size) if rng.random() < 1 / 3 else -1
        shape = rng.choice([{"gpus": 1}, {"gpus": 1, "mem": "10G"}])
        _, members = api.array(
            [*script, seconds, "0", str(failing), "{index}"],
            range(size),
            home=home,
            cwd=work,
            throttle=rng.choice([None, None, 2]),
            **shape,
        )
        ids.update({m: "failed" if i == failing else "succeeded" for i, m in enumerate(members)})
        run.arrays += 1
    elif kind == "cancel":
        shape = rng.choice([{"gpus": 1}, {"gpus": 1, "mem": "20G"}, {"gpus": 2, "mem": "40G"}])
        job_id = api.submit([*script, LONG, "0"], home=home, cwd=work, **shape)
        ids[job_id] = "cancelled"
        heapq.heappush(cancels, (time.monotonic() + rng.uniform(0.0, 1.5), job_id, [job_id]))
    elif kind == "cancel-array":
        array_id, members = api.array([*script, LONG, "0"], range(3), home=home, cwd=work, gpus=1, mem="10G")
        ids.update(dict.fromkeys(members, "cancelled"))
        heapq.heappush(cancels, (time.monotonic() + rng.uniform(0.0, 1.5), array_id, [array_id]))
        run.arrays += 1
    elif kind == "timeout":
        ids[api.submit([*script, LONG, "0"], home=home, cwd=work, gpus=1, mem="10G", time_limit=1.0)] = "timeout"
    else:
        raise ValueError(f"unknown kind {kind!r}")
    run.kinds[kind] += 1
    run.expected.update(ids)
    run.outstanding.update(ids)


def fire_cancels(cancels: list[tuple[float, int, list[int]]], home: Path, run: MemoryRun, now: float | None) -> None:
    """Send the cancels that are due (all of them when ``now`` is None)."""
    while cancels and (now is None or cancels[0][0] <= now):
        _, _, ids = heapq.heappop(cancels)
        api.cancel(ids, home=home)
        run.cancels += 1


def poll_ended(table: JobTable, run: MemoryRun) -> None:
    """Drop the jobs that have ended from ``outstanding`` (a job not ingested yet is not in the table)."""
    done = set()
    for job_id in run.outstanding:
        record = table.get(job_id)
        if record is not None and record.state.finished:
            done.add(job_id)
    run.outstanding -= done
    run.ended += len(done)


def memory_soak(
    home: Path, minutes: float, seed: int, inflight: int, every: float, warmup_jobs: int, warmup_seconds: float
) -> tuple[dict[str, Any], list[str]]:
    """Run the stream against one daemon; return the figures (for the JSON) and the failures."""
    from gpuq_scheduler.jobs.store.table import JobTable
    from gpuq_scheduler.launcher.daemon.lifetime import running_pid

    rng = random.Random(seed)
    work = home.parent / "work"
    work.mkdir(exist_ok=True)
    job = work / "job.sh"
    job.write_text(MEMORY_JOB)
    report = work / "reports.jsonl"
    client = Gpuq(home, make_env(home, fake=FAKE_GPUS), work)
    os.environ.update(client.env)  # the jobs and any daemon api.submit would start see the same fake GPUs
    state = StateDir(home)
    run = MemoryRun()
    cancels: list[tuple[float, int, list[int]]] = []
    stop = threading.Event()
    failures: list[str] = []
    load_start = os.getloadavg()
    try:
        client.run("daemon", "start")
        first_pid = running_pid(state)
        assert first_pid is not None and first_pid > 0, "the daemon did not start"
        wait_for(state.db.exists, 30, "the daemon to create its job table")  # before it, JobTable reads an empty one
        time.sleep(1.0)
        idle_start = read_proc(first_pid)
        table = JobTable(state.db)
        started = time.monotonic()
        deadline = started + minutes * 60
        thread = threading.Thread(target=sampler, args=(state, run, started, every, stop), daemon=True)
        thread.start()
        names, weights = [k for k, _ in KINDS], [w for _, w in KINDS]
        next_poll = 0.0
        last_note = started
        try:
            while time.monotonic() < deadline:
                now = time.monotonic()
                fire_cancels(cancels, home, run, now)
                if now >= next_poll:
                    poll_ended(table, run)
                    next_poll = now + 0.2
                while len(run.outstanding) < inflight and time.monotonic() < deadline:
                    memory_submit(rng.choices(names, weights)[0], rng, home, work, job, report, run, cancels)
                if now - last_note >= 30:
                    last = run.samples[-1] if run.samples else None
                    rss = f", daemon RSS {last.rss_kib} KiB, {last.fds} fds" if last else ""
                    ended, submitted = run.ended, len(run.expected)
                    print(f"  {now - started:5.0f}s: {ended} jobs ended, {submitted} submitted{rss}", flush=True)
                    last_note = now
                time.sleep(0.05)
        except Exception as err:  # a long run keeps what it measured: report, drain and write the JSON anyway
            failures.append(f"the stream stopped at {time.monotonic() - started:.0f}s: {type(err).__name__}: {err}")
            print(f"FAIL {failures[-1]}", flush=True)
        steady_seconds = time.monotonic() - started
        steady_samples = len(run.samples)
        print(f"stream stopped after {steady_seconds:.0f}s: {len(run.expected)} jobs submitted; draining", flush=True)
        fire_cancels(cancels, home, run, None)
        drain_deadline = time.monotonic() + max(300.0, 4 * float(LONG))
        while run.outstanding and time.monotonic() < drain_deadline:
            poll_ended(table, run)
            time.sleep(0.2)
        table.close()
        time.sleep(max(3.0, 2 * every))  # idle: its last commits, reaps and file cleanups are done
        stop.set()
        thread.join()
        pid = running_pid(state)
        idle_end = read_proc(pid) if pid is not None and pid > 0 else None
        targets = fd_targets(pid) if pid is not None and pid > 0 else {}
        if run.outstanding:
            failures.append(f"{len(run.outstanding)} jobs still active after the drain: {sorted(run.outstanding)[:20]}")
        if len(run.pids | {first_pid}) > 1 or pid != first_pid:
            failures.append(f"the daemon was restarted during the soak: pids {sorted(run.pids | {first_pid})}")
        failures += [f"sampler: {error}" for error in run.errors[:20]]
        failures += check_memory_outcomes(home, report, run)
        failures += [f"doctor: {p.severity}: {p.message}" for p in doctor.check(state)]
        log_errors = [
            line
            for line in state.daemon_log.read_text(errors="replace").splitlines()
            if " ERROR " in line or " WARNING " in line or "Traceback" in line
        ]
        figures = memory_figures(
            run, steady_samples, steady_seconds, warmup_jobs, warmup_seconds, idle_start, idle_end, targets
        )
        figures["daemon_log_problems"] = log_errors[:50]
        figures["load_average"] = {"start": load_start, "end": os.getloadavg()}
        return figures, failures
    finally:
        stop.set()
        client.cleanup()


def check_memory_outcomes(home: Path, report: Path, run: MemoryRun) -> list[str]:
    """Every job submitted is in the queue once, ended as intended; the ones that completed ran once."""
    failures: list[str] = []
    records = api.status(home=home)
    seen = Counter(r.id for r in records)
    failures += [f"job {job_id} listed {n} times" for job_id, n in sorted(seen.items()) if n > 1]
    missing = sorted(set(run.expected) - set(seen))
    extra = sorted(set(seen) - set(run.expected))
    if missing:
        failures.append(f"{len(missing)} jobs submitted but not in the queue: {missing[:20]}")
    if extra:
        failures.append(f"{len(extra)} jobs in the queue that were never submitted: {extra[:20]}")
    wrong = [
        f"job {r.id} ended {r.state.value}, meant to end {run.expected[r.id]} ({r.reason or 'no reason'})"
        for r in records
        if r.id in run.expected and r.state.value != run.expected[r.id]
    ]
    failures += wrong[:50] + ([f"... and {len(wrong) - 50} more ended wrongly"] if len(wrong) > 50 else [])
    try:
        reports = read_reports(report)
    except ValueError as err:
        return [*failures, f"the jobs' report file has a torn line: {err}"]
    runs = Counter(int(line["job"]) for line in reports)
    for job_id, want in sorted(run.expected.items()):
        completes = want in ("succeeded", "failed")  # cancelled and timed-out jobs die mid-sleep, writing nothing
        if runs[job_id] != (1 if completes else 0):
            failures.append(f"job {job_id} (meant to end {want}) wrote {runs[job_id]} reports")
    retried = [line["job"] for line in reports if str(line.get("attempt")) != "1"]
    if retried:
        failures.append(f"jobs ran a second attempt: {retried[:20]}")
    return failures + overcommitted(reports, 80 << 30)


def overcommitted(reports: list[dict[str, Any]], total: int) -> list[str]:
    """tests.invariants.check_no_overcommit's rule (at every job's start, the jobs on each of its GPUs fit,
    and a whole-GPU job is alone), as a sweep: that one compares every pair, too slow for a long soak."""
    per_gpu: dict[int, list[dict[str, Any]]] = {}
    for line in reports:
        for gpu in (int(g) for g in str(line["cvd"]).split(",") if g != ""):
            per_gpu.setdefault(gpu, []).append(line)
    problems: list[str] = []
    for gpu, lines in sorted(per_gpu.items()):
        lines.sort(key=lambda line: float(line["start"]))
        active: list[dict[str, Any]] = []
        i = 0
        while i < len(lines):
            instant = float(lines[i]["start"])
            j = i
            while j < len(lines) and float(lines[j]["start"]) == instant:
                j += 1
            active = [o for o in active + lines[i:j] if float(o["end"]) > instant]
            i = j
            jobs = sorted(o["job"] for o in active)
            if any(not o["mem"] for o in active):
                if len(active) > 1:
                    problems.append(f"GPU {gpu} shared by a whole-GPU job at {instant}: jobs {jobs}")
            elif sum(int(o["mem"]) for o in active) > total - MARGIN:
                problems.append(f"GPU {gpu} over-committed at {instant}: jobs {jobs}")
    return problems[:20]


def write_memory_json(out: Path | None, body: dict[str, Any]) -> Path:
    """``--out`` is the JSON file to write, or a directory to write soak-memory-<date>.json in."""
    name = f"soak-memory-{time.strftime('%Y-%m-%d')}.json"
    if out is None:
        path = ROOT / "bench" / "results" / name
    elif out.suffix == ".json" and not out.is_dir():
        path = out
    else:
        path = out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1) + "\n")
    return path


def git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if result.returncode == 0:
            return result.stdout.strip()
    return None


def memory_main(args: argparse.Namespace, home: Path) -> int:
    every, inflight = args.sample_every, args.inflight
    print(f"memory soak: {args.minutes:g} minutes, {inflight} jobs in flight, a sample every {every:g}s")
    started = time.time()
    figures, failures = memory_soak(
        home, args.minutes, args.seed, args.inflight, args.sample_every, args.warmup_jobs, args.warmup_seconds
    )
    body: dict[str, Any] = {
        "soak": "memory",
        "date": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "commit": git_commit(),
        "settings": {
            "minutes": args.minutes,
            "inflight": args.inflight,
            "sample_every": args.sample_every,
            "warmup_jobs": args.warmup_jobs,
            "warmup_seconds": args.warmup_seconds,
            "seed": args.seed,
            "fake_gpus": FAKE_GPUS,
            "kinds": dict(KINDS),
        },
        **{k: v for k, v in figures.items() if k != "series"},
        "failures": failures,
        "series": figures.get("series", []),  # every sample, the drain's included, last: the long part
    }
    path = write_memory_json(args.out, body)
    jobs, rss, fds, slope = body["jobs"], body.get("rss_kib", {}), body.get("fds", {}), body.get("slope", {})
    print(f"jobs: {jobs['ended']} ended of {jobs['submitted']} submitted ({jobs['per_second']}/s); {jobs['by_kind']}")
    print(f"samples: {body['samples']} ({body['samples_steady']} during the stream)")
    if rss:
        print(
            f"RSS KiB: before jobs {rss['before_jobs']}, start {rss['start']} (after the warm-up, "
            f"{body['warmup']['until_s']:.0f}s / {body['warmup']['jobs']} jobs), end {rss['end']}, max {rss['max']}, "
            f"idle after the drain {rss['idle_after_drain']}"
        )
        print(f"slope: {slope['kib_per_1000_jobs']} KiB per 1,000 jobs, {slope['kib_per_hour']} KiB per hour")
        print(
            f"fds: before jobs {fds['before_jobs']}, start {fds['start']}, end {fds['end']}, max {fds['max']}, "
            f"idle after the drain {fds['idle_after_drain']} {fds['idle_after_drain_kinds']}"
        )
        print(f"daemon CPU ms per job, first and second half after the warm-up: {body['cpu_ms_per_job']}")
    print(f"verdict: {body['verdict']}")
    print(f"outcomes: {'all as intended' if not failures else f'{len(failures)} problems'}; wrote {path}")
    for failure in failures[:50]:
        print("FAIL", failure)
    return 0 if body["flat"] and not failures else 1
