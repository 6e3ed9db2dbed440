# One module past 400 lines on purpose: one benchmark, its tracing and its report read as one story.
"""Where a successor hand-off's time goes: one job's end to the next one's start on its GPUs, step by step.

    sudo python bench/handoff_timeline.py [--jobs 40] [--seconds 0.1] [--rounds 3] [--against REV ...]
                                          [--tree NAME=DIR ...] [--no-self] [--no-trace] [--out DIR]

Drives the real shim (``launcher.supervisor.shim``, as ``bench/shim_cost.py`` does: a chain of jobs, each
staged while the one before it runs, so that every start is a hand-off) with workload A's own job
(``bench/job.sh``, which stamps its start and end with ``date``), and puts on one clock (CLOCK_MONOTONIC):

- the job's end stamp and the next job's start stamp (``date``'s wall clock, moved onto the monotonic one);
- the shim's steps, stamped by wrappers around its functions in the probe (nothing of gpuq is changed):
  the job reaped, ``containment.end`` (where there is one), the exit file written, the start called
  (``Born.go`` or the spawn) and returned;
- with tracefs (root; on by default where it can be had), the kernel's own events for the probe and
  everything it starts (``set_event_pid`` with ``event-fork``): the job's last process exits, the next
  job's exec, its shell's fork and exec of ``date``.

Each tree runs in a fresh interpreter, this checkout (unless ``--no-self``) and each ``--against`` revision (a
temporary git worktree) or ``--tree`` (another checkout's files, where there is no git: a lent GPU host) in turn,
``--rounds`` times, so that all face the same machine; a revision from before cgroups runs without.
The medians per step go to stdout and, with ``--out``, to ``timeline.md`` and ``timeline.json`` there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
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

from bench.shim_cost import importable  # noqa: E402

# Runs in a fresh interpreter: argv is the tree to import gpuq_scheduler from, the number of jobs, each job's
# seconds, the job script and a work directory. It waits for a line on stdin (the tracer set up), runs the
# chain, and prints one JSON object.
PROBE = r"""
import dataclasses, json, os, pickle, select, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
try:
    from gpuq_scheduler.launcher.supervisor import shim
    from gpuq_scheduler.launcher.supervisor import starting as spawner
    spawn_name = "start"
except ImportError:  # a revision from before the supervisor had a room of its own (and cgroups)
    from gpuq_scheduler.launcher.daemon import shim
    spawner, spawn_name = shim, "spawn"
jobs, seconds, script, work = int(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5])
marks = []
def mark(name, extra=None):
    marks.append((name, time.monotonic_ns(), extra))
def wrap(owner, name, before, after=None):
    inner = getattr(owner, name)
    def wrapped(*args, **kwargs):
        mark(before)
        try:
            return inner(*args, **kwargs)
        finally:
            if after:
                mark(after)
    setattr(owner, name, wrapped)
box_of = None
fields = {f.name for f in dataclasses.fields(shim.Launch)}
if "box" in fields:
    from gpuq_scheduler.launcher.supervisor import containment, intocgroup
    found = containment.open_for(work, os.environ)
    box_of = found.box if found.kind == containment.CGROUP else None
    wrap(containment, "end", "end<", "end>")
    wrap(intocgroup.Born, "go", "go<", "go>")
inner_start = getattr(spawner, spawn_name)
def start(*args, **kwargs):
    mark("start<")
    try:
        found = inner_start(*args, **kwargs)
    finally:
        mark("start>")
    reap = found[2]
    def reaping():
        mark("reap<")
        try:
            return reap()
        finally:
            mark("reap>")
    return (*found[:2], reaping, *found[3:])
setattr(spawner, spawn_name, start)
inner_write = shim.ahead.write
def write(path, data):
    inner_write(path, data)
    if str(path).endswith(".exit"):
        mark("exit>")
    else:
        mark("pid>", json.loads(data)["pid"])
shim.ahead.write = write
wrap(shim, "_finish", "finish<")
(work / "run").mkdir(); (work / "logs").mkdir(); (work / "out").mkdir()
wake = work / "wake"; os.mkfifo(wake); pokes = os.open(wake, os.O_RDWR)
env = dict(os.environ)
def launch(i):
    extra = {} if box_of is None else {"box": box_of(i)}
    return shim.Launch(i, ["/bin/sh", script, str(work / "out" / f"{i}.out"), seconds], env, str(work),
                       str(work / "logs" / f"{i}.log"), str(work / "run" / f"{i}.exit"),
                       str(work / "run" / f"{i}.pid"), wake, None, 5.0, **extra)
def message(kind, i):
    data = pickle.dumps(launch(i))
    return kind + len(data).to_bytes(8, "big") + data  # the message's form in every revision
pairs = []
for _ in range(200):
    a = time.monotonic_ns(); r = time.time_ns(); b = time.monotonic_ns()
    pairs.append((b - a, r - (a + b) // 2))
offset = min(pairs)[1]  # wall clock minus monotonic, from the tightest reading
sys.stdin.readline()  # the tracer is set up
pipe_read, pipe_write = os.pipe()
serve = getattr(shim, "serve", None) or shim._serve
shim_pid = os.fork()
if shim_pid == 0:  # the shim, as the daemon forks it; its steps go to a file when the daemon lets it go
    os.close(pipe_write)
    code = serve(pipe_read)
    (work / "marks.json").write_text(json.dumps(marks))
    os._exit(code)
os.close(pipe_read)
# This process plays the daemon: the first job, then each next job staged once the one before it started.
os.write(pipe_write, message(b"J", 1) + message(b"N", 2))
staged = 2
while True:
    word = os.read(pokes, 1)
    if word == b"h" and staged < jobs:
        staged += 1
        os.write(pipe_write, message(b"N", staged))
    elif word == b"!":  # the last job ended, with nothing staged
        break
os.close(pipe_write)
os.waitpid(shim_pid, 0)
per_job = []
for name, ns, extra in json.loads((work / "marks.json").read_text()):
    if name == "start<":
        per_job.append({"job": len(per_job) + 1, "marks": []})
    if per_job:
        per_job[-1]["marks"].append((name, ns))
        if name == "pid>":
            per_job[-1]["pid"] = extra
for job in per_job:
    job["stamps"] = [float(s) for s in (work / "out" / f"{job['job']}.out").read_text().split()[:2]]
print(json.dumps({"offset_ns": offset, "jobs": per_job, "contained": box_of is not None}))
"""

# A line of the trace; a system call's entry reads "sys_execve(filename: ...)".
_EVENT = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<tid>\d+)\s+\[\d+\]\s+\S+\s+(?P<ts>\d+\.\d+): (?P<event>\w+)[:(] ?(?P<rest>.*)"
)
EVENTS = (
    "sched/sched_process_exit",
    "sched/sched_process_exec",
    "sched/sched_process_fork",
    "syscalls/sys_enter_execve",
)


class Tracer:
    """An ftrace instance of its own (the global buffer stays whoever's it is), on the monotonic clock."""

    def __init__(self) -> None:
        self.mounted: str | None = None
        self.base = self._tracefs()
        self.dir: Path | None = None
        if self.base is not None:
            self.dir = Path(self.base) / "instances" / f"gpuq-timeline-{os.getpid()}"
            try:
                self.dir.mkdir()
            except OSError:
                self.dir = None

    def _tracefs(self) -> str | None:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                words = line.split()
                if words[2] == "tracefs":
                    return words[1]
        if os.geteuid() != 0:
            return None
        where = tempfile.mkdtemp(prefix="gpuq-tracefs-")
        if subprocess.run(["mount", "-t", "tracefs", "nodev", where], capture_output=True).returncode != 0:
            os.rmdir(where)
            return None
        self.mounted = where
        return where

    def start(self, pid: int) -> None:
        assert self.dir is not None
        (self.dir / "trace_clock").write_text("mono")
        (self.dir / "buffer_size_kb").write_text("8192")
        (self.dir / "options" / "event-fork").write_text("1")
        (self.dir / "set_event_pid").write_text(str(pid))
        for event in EVENTS:
            (self.dir / "events" / event / "enable").write_text("1")
        (self.dir / "trace").write_text("")
        (self.dir / "tracing_on").write_text("1")

    def stop(self) -> list[tuple[float, str, dict[str, str], int]]:
        """The events seen: (monotonic seconds, event, its fields, the thread it came from)."""
        assert self.dir is not None
        (self.dir / "tracing_on").write_text("0")
        found = []
        for line in (self.dir / "trace").read_text().splitlines():
            matched = _EVENT.match(line)
            if matched:
                fields = dict(word.split("=", 1) for word in matched["rest"].split() if "=" in word)
                found.append((float(matched["ts"]), matched["event"], fields, int(matched["tid"])))
        for event in EVENTS:
            (self.dir / "events" / event / "enable").write_text("0")
        return found

    def close(self) -> None:
        if self.dir is not None:
            with contextlib.suppress(OSError):
                self.dir.rmdir()
        if self.mounted is not None:
            subprocess.run(["umount", self.mounted], check=False)
            os.rmdir(self.mounted)


def run_probe(tree: Path, jobs: int, seconds: float, tracer: Tracer | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpuq-timeline-") as work:
        probe = subprocess.Popen(
            [sys.executable, "-c", PROBE, str(tree), str(jobs), str(seconds), str(ROOT / "bench" / "job.sh"), work],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if tracer is not None:
            tracer.start(probe.pid)
        out, err = probe.communicate("go\n")
        events = tracer.stop() if tracer is not None else []
    if probe.returncode != 0:
        raise SystemExit(f"the probe failed under {tree}:\n{err[-3000:]}")
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    result["events"] = events
    return result


def steps(result: dict[str, Any], warm: int) -> dict[str, list[float]]:
    """Per hand-off (after ``warm``), when each step came, in ms after the ended job's end stamp."""
    offset = result["offset_ns"] / 1e9
    exits: dict[int, float] = {}
    execs: dict[int, list[tuple[float, str]]] = {}
    calls: dict[int, list[float]] = {}  # a process's execve calls (the exec done: ``execs``)
    forks: dict[int, list[tuple[float, int]]] = {}
    for ts, event, fields, tid in result["events"]:
        if event == "sched_process_exit":
            exits[int(fields["pid"])] = ts  # the last of a pid (pids are not reused in a short run)
        elif event == "sched_process_exec":
            execs.setdefault(int(fields["pid"]), []).append((ts, fields.get("filename", "")))
        elif event == "sys_execve":
            calls.setdefault(tid, []).append(ts)
        elif event == "sched_process_fork":
            forks.setdefault(int(fields["pid"]), []).append((ts, int(fields["child_pid"])))
    jobs = result["jobs"]
    found: dict[str, list[float]] = {}
    for before, after in zip(jobs[warm:], jobs[warm + 1 :], strict=False):
        ended = before["stamps"][1] - offset
        begun = after["stamps"][0] - offset
        # The ended job's steps are marked in its own run; the next job's start in the next run.
        mine = {name: ns / 1e9 for name, ns in before["marks"]}
        theirs = {name: ns / 1e9 for name, ns in after["marks"]}
        called = theirs.get("start<", ended)
        run = [ts for ts, _ in execs.get(after["pid"], []) if ts >= called]  # not a waiter's exec at its birth
        asked = [ts for ts in calls.get(after["pid"], []) if ts >= called]
        forked = sorted(forks.get(after["pid"], []))[:1]  # its first child runs the start stamp's date
        dated = [ts for ts, name in execs.get(forked[0][1], []) if name.endswith("/date")] if forked else []
        points: list[tuple[str, float | None]] = [
            ("its shell exits (kernel)", exits.get(before["pid"])),
            ("reap returned", mine.get("reap>")),
            ("containment.end called", mine.get("end<")),
            ("containment.end returned", mine.get("end>")),
            ("_finish called", mine.get("finish<")),
            ("exit file written", mine.get("exit>")),
            ("start called", theirs.get("start<")),
            ("Born.go called", theirs.get("go<")),
            ("next job's execve called (kernel)", asked[0] if asked else None),
            ("next job's exec done (kernel)", run[0] if run else None),
            ("start returned", theirs.get("start>")),
            ("its shell forked date (kernel)", forked[0][0] if forked else None),
            ("date's exec done (kernel)", dated[0] if dated else None),
            ("next job's start stamp", begun),
        ]
        for name, at in points:
            if at is not None:
                found.setdefault(name, []).append((at - ended) * 1e3)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", action="append", default=[], help="a git revision to measure beside this")
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="another checkout's files (git archive, say), to measure beside this",
    )
    parser.add_argument("--no-self", action="store_true", help="only the --against and --tree checkouts")
    parser.add_argument("--no-trace", action="store_true", help="no kernel events (tracefs)")
    parser.add_argument("--out", type=Path, help="a directory for timeline.md and timeline.json")
    args = parser.parse_args()
    if args.jobs < 10 or args.rounds < 1:
        parser.error("--jobs is at least 10 (the first 5 warm up) and --rounds at least 1")
    tracer = None if args.no_trace else Tracer()
    if tracer is not None and tracer.dir is None:
        print("no tracefs here (root, and tracefs, are needed): the shim's steps only", file=sys.stderr)
        tracer.close()
        tracer = None
    per_tree: dict[str, dict[str, list[float]]] = {}
    rounds: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {} if args.no_self else {"this checkout": importable(ROOT, Path(tmp) / "here")}
        others = []
        for number, revision in enumerate(args.against):
            other = Path(tmp) / f"other{number}"
            added = subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(other), revision],
                capture_output=True,
                text=True,
            )
            if added.returncode != 0:
                parser.error(f"--against {revision}: {added.stderr.strip().splitlines()[-1]}")
            others.append(other)
            trees[revision] = importable(other, Path(tmp) / f"there{number}")
        for number, named in enumerate(args.tree):
            name, _, where = named.partition("=")
            if not where or not (Path(where) / "gpuq_scheduler" / "__init__.py").is_file():
                parser.error(f"--tree {named}: not NAME=DIR of a checkout")
            trees[name] = importable(Path(where).resolve(), Path(tmp) / f"tree{number}")
        try:
            for number in range(args.rounds):
                for name, tree in trees.items():
                    result = run_probe(tree, args.jobs, args.seconds, tracer)
                    found = steps(result, warm=5)
                    for step, values in found.items():
                        per_tree.setdefault(name, {}).setdefault(step, []).extend(values)
                    gap = statistics.median(found["next job's start stamp"])
                    rounds.setdefault(name, []).append(gap)
                    print(
                        f"[{time.strftime('%H:%M:%S')}] round {number + 1} {name}: median gap {gap:.2f} ms"
                        f"{'' if result['contained'] else ' (no cgroup)'}",
                        flush=True,
                    )
        finally:
            for other in others:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], check=False)
            if tracer is not None:
                tracer.close()
    text = _table(per_tree, rounds, args, tracer is not None)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "timeline.md").write_text(text + "\n")
        (args.out / "timeline.json").write_text(
            json.dumps({"steps_ms": per_tree, "rounds": rounds, "args": {k: str(v) for k, v in vars(args).items()}})
        )
    return 0


def _table(per_tree: dict[str, dict[str, list[float]]], rounds: dict[str, list[float]], args: Any, traced: bool) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    names = list(per_tree)
    lines = [
        f"A hand-off's steps, median ms over {args.rounds} rounds x {args.jobs - 6} hand-offs of bench/job.sh "
        f"({args.seconds} s), {os.cpu_count()} cores, kernel {platform.release()}, {stamp}"
        f"{'' if traced else ' (no kernel events)'}. Each row: when that step came, ms after the job's end stamp "
        "(the next job's start stamp: the gap).",
        "",
        "| step | " + " | ".join(names) + " |",
        "| --- |" + " --- |" * len(names),
    ]
    order: list[str] = []
    for found in per_tree.values():
        order += [step for step in found if step not in order]
    for step in order:
        cells = [f"{statistics.median(per_tree[n][step]):.3f}" if step in per_tree[n] else "" for n in names]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines.append(
        "| each round's median gap | " + " | ".join(", ".join(f"{g:.2f}" for g in rounds[n]) for n in names) + " |"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
