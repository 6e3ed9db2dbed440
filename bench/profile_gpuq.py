"""Where gpuq's time goes: the dispatch gap of workload A, taken apart, and the cost of one CLI call.

    python bench/profile_gpuq.py [--jobs 40] [--tmpfs] [--py-spy FILE] [--idle N]

Runs workload A (N jobs of 0.2 s, queued while paused, then resumed) against a gpuq daemon started
through this script, which wraps the scheduler's steps with timers before it serves (gpuq itself is
not changed). Each gap between two jobs on one GPU is split at the instants gpuq records:

    previous job's end stamp -> its shim's ended_at (exit seen) -> the daemon's tick begins ->
    _launch of the next job begins -> the job sent to an idle shim -> the next job's start stamp

``--tmpfs`` puts the state directory on /dev/shm, where fsync costs nothing: the difference to a run
on disk is what durability costs. ``--py-spy FILE`` samples the daemon with py-spy (pip install
py-spy) and prints the functions it spent its time in. What one CLI call costs: ``bench/cli_cost.py``.
``--idle N`` instead submits N jobs one at a time to the idle queue, as workload B does, and prints where the
daemon's pass that started each one went, step by step (medians), up to the job sent to its shim.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import workloads  # noqa: E402
from bench.peers.gpuq import Gpuq  # noqa: E402

STEPS = (
    "tick",
    "reap",
    "ingest",
    "write_journal",
    "reconcile",
    "follow_up_arrays",
    "snapshot",
    "place_and_launch",
    "sample",
    "_launch",
    "plan",
    "_record_reasons",
    "launch_fenced",
)


def serve_traced(home: Path) -> int:
    """Run the daemon in this process with timers around the scheduler's steps and the table's writes."""
    from gpuq_scheduler.jobs.store.table import JobTable
    from gpuq_scheduler.launcher.daemon import lifetime as daemon
    from gpuq_scheduler.launcher.daemon import scheduler, shims

    trace = (home / "trace.jsonl").open("a", buffering=1)

    def wrap(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def timed_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.time()
            try:
                return original(self, *args, **kwargs)
            finally:
                entry: dict[str, Any] = {"f": label, "t0": started, "t1": time.time()}
                if name == "_launch":
                    entry["job"] = args[0].id
                trace.write(json.dumps(entry) + "\n")

        setattr(owner, name, timed_call)

    for step in STEPS:
        if hasattr(scheduler.Scheduler, step):
            wrap(scheduler.Scheduler, step, step)
    for write in ("mark_running", "finish", "finish_many", "insert_pending", "set_reasons", "owners", "batch"):
        wrap(JobTable, write, f"table.{write}")
    from gpuq_scheduler.jobs.store import table_base

    def wrap_function(where: str, name: str) -> None:  # module functions, looked up at each call
        try:
            module = importlib.import_module(f"gpuq_scheduler.{where}")
        except ImportError:
            return  # not in this revision (to time an older one, copy this script into its checkout)
        original = getattr(module, name, None)
        if original is None:
            return

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                trace.write(
                    json.dumps({"f": f"{module.__name__.rsplit('.', 1)[1]}.{name}", "t0": started, "t1": time.time()})
                    + "\n"
                )

        setattr(module, name, timed_call)

    daemon_ = "launcher.daemon"
    for where, name in (
        ("jobs.store.spool", "scan"),
        ("jobs.store.spool", "read_request"),
        (f"{daemon_}.isolation", "sweep_leftovers"),
        (f"{daemon_}.intake", "ingest"),
        (f"{daemon_}.intake", "expand"),
        (f"{daemon_}.intake", "_queued_by_user"),
        (f"{daemon_}.suspending", "advance"),
        (f"{daemon_}.preempting", "launch_ready"),
        (f"{daemon_}.preempting", "decide"),
        (f"{daemon_}.scheduler", "gone_waiting"),
        (f"{daemon_}.watching", "sample"),
        (f"{daemon_}.watching", "release_idle"),
        (f"{daemon_}.watching", "report_idle_batch"),
        (f"{daemon_}.watching", "stop_on_lost_gpus"),
        (f"{daemon_}.guarding", "check"),
        (f"{daemon_}.endings", "follow_up_arrays"),
        # The same steps where #41 part 4 put them (the names above time older revisions).
        (f"{daemon_}.suspension.suspending", "advance"),
        (f"{daemon_}.clients", "gone_waiting"),
        (f"{daemon_}.watching.sight", "sample"),
        (f"{daemon_}.watching.sight", "release_idle"),
        (f"{daemon_}.watching.sight", "report_idle_batch"),
        (f"{daemon_}.watching.sight", "stop_on_lost_gpus"),
        (f"{daemon_}.watching.watchdog", "check"),
    ):
        wrap_function(where, name)
    exit_ = table_base.Transaction.__exit__

    def commit(self: Any, *args: Any) -> None:  # a transaction's end, timed where it commits (not a joined one)
        started = time.time()
        try:
            exit_(self, *args)
        finally:
            if self._owner:
                trace.write(json.dumps({"f": "table commit", "t0": started, "t1": time.time()}) + "\n")

    table_base.Transaction.__exit__ = commit  # type: ignore[method-assign]
    shim_init, shim_start = shims.Shim.__init__, shims.Shim.start

    def init(self: Any) -> None:
        started = time.time()
        shim_init(self)
        trace.write(json.dumps({"f": "fork", "t0": started, "t1": time.time()}) + "\n")

    def start(self: Any, launch: Any) -> None:
        started = time.time()
        shim_start(self, launch)
        ended = time.time()
        trace.write(json.dumps({"f": "go", "job": launch.job_id, "t0": ended}) + "\n")
        trace.write(json.dumps({"f": "Shim.start", "t0": started, "t1": ended}) + "\n")

    wrap(shims.Shim, "_write", "Shim._write")
    shims.Shim.__init__ = init  # type: ignore[method-assign]
    shims.Shim.start = start  # type: ignore[method-assign]
    return daemon.main(["--home", str(home)])


def start_traced_daemon(tool: Gpuq) -> subprocess.Popen[bytes]:
    tool.home.mkdir(parents=True, exist_ok=True)
    log = (tool.work / "daemon.out").open("ab")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(tool.home)],
        env=tool.env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not (tool.home / "daemon.pid").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the traced daemon did not start; see {tool.work / 'daemon.out'}")
        time.sleep(0.02)
    return proc


def breakdown(work: Path, home: Path, jobs: int) -> dict[str, Any]:
    trace = [json.loads(line) for line in (home / "trace.jsonl").read_text().splitlines()]
    events = [json.loads(line) for line in (home / "events.jsonl").read_text().splitlines()]
    ended = {e["job"]: e["t"] for e in events if e.get("event") == "succeeded"}
    started_ids = sorted(e["job"] for e in events if e.get("event") == "started")
    launch = {e["job"]: e["t0"] for e in trace if e["f"] == "_launch"}
    go = {e["job"]: e["t0"] for e in trace if e["f"] == "go"}
    ticks = sorted((e["t0"], e["t1"]) for e in trace if e["f"] == "tick")
    stamps = {}
    for index in range(jobs):
        start, end, gpu = (work / "a-out" / str(index)).read_text().split()
        stamps[started_ids[index]] = (float(start), float(end), int(gpu))

    def tick_of(t: float) -> float:
        return max((t0 for t0, t1 in ticks if t0 <= t), default=t)

    parts: dict[str, list[float]] = collections.defaultdict(list)
    names = (
        "1 job's end stamp -> its shim saw the exit (ended_at)",
        "2 ended_at -> the daemon's tick begins (exit file fsync, FIFO wake-up)",
        "3 tick begins -> _launch of the next job (reconcile, plan)",
        "4 _launch -> the job sent to an idle shim (record it running, commit)",
        "5 sent -> the next job's start stamp (shim spawns sh, sh runs date)",
        "  whole gap",
    )
    for gpu in range(4):
        on_gpu = sorted((j for j in stamps if stamps[j][2] == gpu), key=lambda j: stamps[j][0])
        for before, after in itertools.pairwise(on_gpu):
            if before not in ended or after not in go:
                continue
            marks = [
                stamps[before][1],
                ended[before],
                tick_of(launch[after]),
                launch[after],
                go[after],
                stamps[after][0],
            ]
            for name, a, b in zip(names, marks, marks[1:], strict=False):
                parts[name].append((b - a) * 1000)
            parts[names[-1]].append((marks[-1] - marks[0]) * 1000)
    steps: dict[str, list[float]] = collections.defaultdict(list)
    for entry in trace:
        if "t1" in entry:
            steps[entry["f"]].append((entry["t1"] - entry["t0"]) * 1000)
    return {
        "gap_parts_ms": {n: (statistics.mean(v), statistics.median(v), max(v)) for n, v in parts.items() if v},
        "steps_ms": {n: (len(v), statistics.mean(v), statistics.median(v), sum(v)) for n, v in steps.items()},
    }


def profile_dispatch(jobs: int, tmpfs: bool, spy: Path | None) -> None:
    base = Path(tempfile.mkdtemp(prefix="gpuq-profile-", dir="/dev/shm" if tmpfs else None))
    try:
        tool = Gpuq(base)
        proc = start_traced_daemon(tool)
        tool._up = True
        sampler = None
        try:
            if spy is not None:
                pid = tool.daemon_pid()
                sampler = subprocess.Popen(
                    ["py-spy", "record", "-p", str(pid), "-r", "1000", "-f", "raw", "-o", str(spy), "--nonblocking"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)
            figures = workloads.workload_a(tool, base, jobs)
        finally:
            if sampler is not None:
                sampler.send_signal(2)
                sampler.wait()
            tool.stop()
            proc.wait(timeout=30)
        print(f"workload A, {jobs} jobs, state dir on {'tmpfs' if tmpfs else 'disk'} ({base}):")
        print(
            f"  makespan {figures['makespan_s']:.3f} s (ideal {figures['ideal_s']:.2f}), "
            f"mean gap {figures['gap_mean_ms']:.2f} ms, correct {figures['correct']}"
        )
        found = breakdown(base, tool.home, jobs)
        print("  the gap between two jobs on one GPU, in parts (mean / median / max, ms):")
        for name, (mean, median, most) in sorted(found["gap_parts_ms"].items()):
            print(f"    {name:75s} {mean:7.2f} {median:7.2f} {most:7.2f}")
        print("  the daemon's steps (calls, mean ms, median ms, total ms):")
        for name, (count, mean, median, total) in sorted(found["steps_ms"].items(), key=lambda kv: -kv[1][3]):
            print(f"    {name:28s} {count:6d} {mean:8.2f} {median:8.2f} {total:9.1f}")
        if spy is not None and spy.exists():
            print(f"  py-spy: where the daemon was busy ({spy}):")
            print(summarize_spy(spy))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def profile_idle(runs: int) -> None:
    """Idle starts: each job submitted once the one before has ended and the daemon has settled."""
    base = Path(tempfile.mkdtemp(prefix="gpuq-profile-"))
    try:
        tool = Gpuq(base)
        proc = start_traced_daemon(tool)
        tool._up = True
        try:
            for _ in range(runs + 2):  # a daemon's first two starts are its dearer ones: not counted
                tool.submit_now(1, ["true"])
                tool.wait_idle()
                time.sleep(0.3)
        finally:
            tool.stop()
            proc.wait(timeout=30)
        trace = [json.loads(line) for line in (tool.home / "trace.jsonl").read_text().splitlines()]
        ticks = sorted((e["t0"], e["t1"]) for e in trace if e["f"] == "tick")
        gos = sorted(e["t0"] for e in trace if e["f"] == "go")[2:]
        steps: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        for go in gos:
            t0 = max(t for t, _ in ticks if t <= go)
            steps["job sent to its shim"].append((0.0, (go - t0) * 1000))
            seen: collections.Counter[str] = collections.Counter()
            for entry in trace:
                if "t1" in entry and entry["f"] not in ("tick", "table.batch") and t0 <= entry["t0"] <= go:
                    seen[entry["f"]] += 1  # a step that comes twice in a pass (a commit) is named by its turn
                    name = entry["f"] + ("" if seen[entry["f"]] == 1 else f" #{seen[entry['f']]}")
                    steps[name].append(((entry["t0"] - t0) * 1000, (entry["t1"] - t0) * 1000))
        print(f"{len(gos)} idle starts; the pass that started each, per step (they nest): medians, ms after the")
        print("pass began, of its begin and end, and of its length")
        for name, spans in sorted(steps.items(), key=lambda kv: statistics.median(b for b, _ in kv[1])):
            begin, end = statistics.median(b for b, _ in spans), statistics.median(e for _, e in spans)
            length = statistics.median(e - b for b, e in spans)
            print(f"  {name:32s} {begin:7.3f} {end:7.3f} {length:7.3f}  ({len(spans)})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def summarize_spy(path: Path, top: int = 25) -> str:
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        frames = {re.sub(r":\d+\)", ")", frame) for frame in stack.split(";")}
        total += int(count)
        for frame in frames:
            inclusive[frame] += int(count)
    lines = [f"    {total} samples"]
    lines += [f"    {n * 100 / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--tmpfs", action="store_true", help="state directory on /dev/shm (no fsync cost)")
    parser.add_argument("--py-spy", type=Path, dest="spy", help="sample the daemon with py-spy into this file")
    parser.add_argument("--idle", type=int, help="time N idle starts instead of workload A")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve_traced(args.serve)
    if args.idle:
        profile_idle(args.idle)
        return 0
    profile_dispatch(args.jobs, args.tmpfs, args.spy)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
