"""Where an idle start's time goes: `gpuq submit` on an idle queue to its job's first stamp, syscall by syscall.

    sudo python bench/idle_timeline.py --label NAME [--runs 12] [--out DIR]

Runs the installed gpuq (``GPUQ_BENCH_COMMAND``, as the harness does) with workload B's idle submit: a real
daemon on the fake inventory, one job at a time on an idle queue (``bench/job.sh``), as ``bench/harness.py``
times it. tracefs (root) records, on the monotonic clock, every syscall, fork, exec and exit of this process,
the daemon and everything they start (``set_event_pid`` with ``event-fork``). Per run, measured from the
submit command's exit, as the harness measures:

- the daemon's last syscall before the shim heard of the job (its write down the shim's pipe);
- the shim: its read of the job returned, its first and last syscall before the job's process exists, the
  job's process made (fork/clone/vfork), its exec done;
- the job's shell forks ``date``, ``date``'s exec done, and the job's start stamp.

``--out`` gets ``NAME.json`` (the milestones per run) and ``NAME-events.txt`` (each run's events of the daemon,
the shim and the job, with each syscall's time), to compare revisions installed in turn
(``bench/device_gap.sh`` with ``IDLE_TRACE=1``). The kernel's tracing adds about a microsecond to each syscall.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.handoff_timeline import Tracer  # noqa: E402
from bench.peers.base import job_argv, wait_until  # noqa: E402
from bench.peers.gpuq import Gpuq  # noqa: E402

_LINE = re.compile(r"^\s*(?P<comm>.+?)-(?P<tid>\d+)\s+\[\d+\]\s+\S+\s+(?P<ts>\d+\.\d+): (?P<text>.*)$")
_ENTER = re.compile(r"^(?P<name>sys_\w+)\((?P<args>.*)\)$")
_EXIT = re.compile(r"^(?P<name>sys_\w+) -> (?P<ret>\S+)$")
EVENTS = ("syscalls", "sched/sched_process_fork", "sched/sched_process_exec", "sched/sched_process_exit")

Event = tuple[float, int, str, str, str]  # (monotonic s, tid, comm, kind: enter/exit/fork/exec/exit, text)


def parse(lines: list[str]) -> list[Event]:
    found: list[Event] = []
    for line in lines:
        matched = _LINE.match(line)
        if not matched:
            continue
        ts, tid, comm, text = float(matched["ts"]), int(matched["tid"]), matched["comm"].strip(), matched["text"]
        if _ENTER.match(text):
            found.append((ts, tid, comm, "enter", text))
        elif _EXIT.match(text):
            found.append((ts, tid, comm, "exit", text))
        elif text.startswith("sched_process_fork"):
            found.append((ts, tid, comm, "fork", text))
        elif text.startswith("sched_process_exec"):
            found.append((ts, tid, comm, "exec", text))
        elif text.startswith("sched_process_exit"):
            found.append((ts, tid, comm, "gone", text))
    return found


def _field(text: str, name: str) -> str:
    matched = re.search(rf"\b{name}=(\S+)", text)
    return matched[1] if matched else ""


def times(events: list[Event], tid: int | None, kind: str, prefix: str = "") -> list[float]:
    """When ``tid`` (any, for None) had events of ``kind`` whose text starts with ``prefix``."""
    return [ts for ts, who, _, what, text in events if who == (tid or who) and what == kind and text.startswith(prefix)]


def forked(events: list[Event], parent: int | None = None, child: int | None = None) -> list[tuple[float, int, int]]:
    """The forks seen (when, parent thread, child pid), of ``parent`` or making ``child``."""
    found = [(ts, tid, int(_field(text, "child_pid") or 0)) for ts, tid, _, kind, text in events if kind == "fork"]
    return [(ts, tid, pid) for ts, tid, pid in found if tid == (parent or tid) and pid == (child or pid)]


def milestones(events: list[Event], submit: int, daemon: int, stamp: float, shims: set[int]) -> dict[str, Any]:
    """One run's milestones, ms after the submit's exit, and the lines of its daemon, shim and job. ``shims``:
    the daemon's idle shims before the submit, one of which may hold the job's process, born before it (a
    blank, at revisions before 2026-11-29 that had them): then the shim is the one that read the job."""
    exits = [ts for ts, tid, _, kind, _ in events if kind == "gone" and tid == submit]
    execs = [(ts, tid, text) for ts, tid, _, kind, text in events if kind == "exec"]
    job = next(((ts, tid) for ts, tid, text in execs if _field(text, "filename").endswith("job.sh")), None)
    if not exits or job is None:
        return {"error": "no submit exit or no job exec in the trace"}
    zero, (job_exec, job_pid) = exits[0], job
    began = min(ts for ts, tid, *_ in events if tid == submit)
    made = forked(events, child=job_pid)
    readers = [
        tid
        for ts, tid, _, kind, text in events
        if tid in shims and kind == "exit" and began < ts < job_exec and text.startswith("sys_read ")
    ]
    shim = made[0][1] if made else readers[0] if readers else -1
    found: dict[str, Any] = {"job exec done": job_exec, "start stamp": stamp}
    if made:
        found["job process made"] = made[0][0]
    else:  # a blank, born before the submit: the shim told it to go (its last write before the job's exec)
        told = [ts for ts in times(events, shim, "exit", "sys_write ") if ts < job_exec]
        if told:
            found["shim told its blank to go"] = told[-1]
    daemon_writes = times(events, daemon, "exit", "sys_write ")
    shim_reads = [ts for ts in times(events, shim, "exit", "sys_read ") if ts < job_exec]
    if shim_reads:
        # The shim's reads of its message: the first after the submit began (the shim idles in a read).
        after = [ts for ts in shim_reads if ts > began]
        if after:
            found["shim read its job"] = after[0]
            sent = [ts for ts in daemon_writes if ts <= after[0]]
            if sent:
                found["daemon wrote to the shim"] = sent[-1]
            woke = [ts for ts in times(events, daemon, "exit") if began < ts <= after[0]]
            if woke:
                found["daemon woke"] = woke[0]
    forks = forked(events, parent=job_pid)
    if forks:
        found["job forked date"] = forks[0][0]
        dated = [ts for ts, tid, text in execs if tid == forks[0][2] and _field(text, "filename").endswith("date")]
        if dated:
            found["date exec done"] = dated[0]
    ms = {name: round((ts - zero) * 1e3, 3) for name, ts in sorted(found.items(), key=lambda item: item[1])}
    lines = [
        f"{(ts - zero) * 1e3:9.3f} ms  {comm}-{tid}  {text[:150]}"
        for ts, tid, comm, _, text in events
        if tid in (daemon, shim, job_pid) and zero - 0.05 <= ts <= job_exec + 0.005
    ]
    return {"ms": ms, "lines": lines, "shim": shim, "job": job_pid}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    tracer = Tracer()
    if tracer.dir is None:
        raise SystemExit("tracefs is needed (root)")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(f"/tmp/gpuq-idle-timeline-{os.getpid()}")
    results, texts = [], []
    try:
        with Gpuq(work) as tool:
            assert isinstance(tool, Gpuq)
            daemon = tool.daemon_pid()
            tracer.start(os.getpid())
            assert tracer.dir is not None
            below = [child.pid for child in psutil.Process(daemon).children(recursive=True)]
            traced = " ".join(str(pid) for pid in (os.getpid(), daemon, *below))
            (tracer.dir / "set_event_pid").write_text(traced)  # its shims forked ahead too
            for event in EVENTS:
                (tracer.dir / "events" / event / "enable").write_text("1")
            out = work / "b-out"
            out.mkdir(parents=True, exist_ok=True)
            for run in range(args.runs):
                path = out / str(run)
                shims = {child.pid for child in psutil.Process(daemon).children()}
                (tracer.dir / "trace").write_text("")
                (tracer.dir / "tracing_on").write_text("1")
                tool.submit_now(1, job_argv(path, 0, 1))
                wait_until(lambda: path.exists() and path.read_text().strip(), 60, "the idle job", poll=0.002)  # noqa: B023
                stamp_wall = float(path.read_text().split()[0])
                stamp = stamp_wall - time.time() + time.monotonic()
                (tracer.dir / "tracing_on").write_text("0")  # this process's own reads of the trace would feed it
                lines = (tracer.dir / "trace").read_text().splitlines()
                events = parse(lines)
                forks = forked(events, parent=os.getpid())
                submit = forks[0][2] if forks else 0
                found = milestones(events, submit, daemon, stamp, shims)
                results.append(found.get("ms", found))
                texts.append(f"## run {run}: shim {found.get('shim')}, job {found.get('job')}")
                texts.append("\n".join(found.get("lines", [])))
                tool.wait_idle()
                time.sleep(0.3)
            (tracer.dir / "tracing_on").write_text("0")
            for event in EVENTS:
                (tracer.dir / "events" / event / "enable").write_text("0")
    finally:
        tracer.close()
    names: list[str] = []
    for found in results:
        names += [name for name in found if name not in names and name != "error"]
    summary = {name: statistics.median([r[name] for r in results if name in r]) for name in names}
    print(f"{args.label}: medians over {len(results)} idle starts, ms after the submit's exit")
    for name, value in sorted(summary.items(), key=lambda item: item[1]):
        print(f"  {name:<28} {value:8.3f}")
    (args.out / f"{args.label}.json").write_text(json.dumps({"runs": results, "medians": summary}, indent=1))
    (args.out / f"{args.label}-events.txt").write_text("\n".join(texts) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
