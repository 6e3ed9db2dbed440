"""How low could workload A's gap go with a successor hand-off? Its best case, beside sgs and gpuq, in one run.

    python bench/handoff_bound.py [--jobs 200] [--repeat 3] [--tick-ms 0.9] [--settle-ms 5] [--out bench/results]
                                  [--tools ideal,modelled,settled,sgs,gpuq]

A *successor hand-off* would have the daemon give a job's supervisor the next job for the same GPUs ahead of
time, so that the supervisor starts it the moment the first ends, with no daemon on the way. Before building
one (a staged job state, durable, that cancel, hold, drain and a daemon restart must all reach), this
measures what it could reach at best on this machine, with the same job (``bench/job.sh``) and the same
workload code as the harness:

- ``ideal``: one supervisor process per GPU that starts its next job the moment the last one ends (pidfd and
  select, the job in its own session with its output on a pipe, as gpuq's shim does), and records nothing.
  No durable queue can be faster than this.
- ``modelled``: the same, plus what a durable hand-off must still do per end: the ended job's exit file,
  naming its successor, written (atomically) before the successor starts; the daemon poked after; and a
  daemon that spends ``--tick-ms`` of CPU on each poke (gpuq's tick for one end and one launch is ~0.7-0.9 ms
  here), competing with the jobs for the machine's cores.
- ``settled``: ``modelled`` with a daemon that, once poked, waits ``--settle-ms`` before its pass, so that one
  pass records a burst of ends after their successors have started.
- ``sgs`` (simple_gpu_scheduler, the fastest peer in the harness) and ``gpuq`` as it is, for reference.

The tools run in turn, ``--repeat`` times, and the table gives medians; the figures go to
``<out>/handoff-bound-<date>.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import workloads  # noqa: E402
from bench.peers.base import GPUS, Tool, ToolError  # noqa: E402
from bench.peers.gpuq import Gpuq, install_regular  # noqa: E402
from bench.peers.sgs import SimpleGpuScheduler  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TOOLS = ("ideal", "modelled", "settled", "sgs", "gpuq")


class HandOff(Tool):
    """The hand-off's best case: per GPU, a supervisor that already holds its jobs and starts each one as the
    last ends. ``modelled`` adds the records and the daemon a durable hand-off cannot do without."""

    def __init__(self, work: Path, name: str, *, tick_ms: float = 0.0, settle_ms: float = 0.0) -> None:
        super().__init__(work)
        self.name = self.title = name
        self.modelled = bool(tick_ms)
        self.tick = tick_ms / 1000
        self.settle = settle_ms / 1000
        self.jobs: list[list[str]] = []
        self.lanes: list[int] = []
        self.daemon: int | None = None
        self.wake = work / "wake"

    def queue(self, jobs: Sequence[tuple[int, list[str]]]) -> None:
        if any(gpus != 1 for gpus, _ in jobs):
            raise ToolError("the hand-off model runs 1-GPU jobs only")
        self.jobs.extend(argv for _, argv in jobs)

    def release(self) -> None:
        if self.modelled:
            with contextlib.suppress(FileExistsError):
                os.mkfifo(self.wake)
            self.daemon = _fork(lambda: _daemon(self.wake, self.tick, self.settle))
        share = [self.jobs[gpu::GPUS] for gpu in range(GPUS)]  # equal jobs: as good as any other split
        self.lanes = [
            _fork(lambda g=gpu: _supervise(g, share[g], self.work, self.env, self.modelled)) for gpu in range(GPUS)
        ]
        self.jobs = []

    def wait_idle(self, timeout: float = 300.0) -> None:
        for pid in self.lanes:
            os.waitpid(pid, 0)
        self.lanes = []
        self.stop()

    def stop(self) -> None:
        if self.daemon is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.daemon, 9)
            os.waitpid(self.daemon, 0)
            self.daemon = None

    def version(self) -> str:
        return "model"


def _fork(body: Any) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        finally:
            os._exit(code)
    return pid


def _supervise(gpu: int, jobs: list[list[str]], work: Path, env: dict[str, str], modelled: bool) -> None:
    env = {**env, "CUDA_VISIBLE_DEVICES": str(gpu)}
    log = os.open(work / f"lane{gpu}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for number, argv in enumerate(jobs):
        out_read, out_write = os.pipe()
        job = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out_write, stderr=out_write, start_new_session=True
        )
        os.close(out_write)
        pidfd = os.pidfd_open(job.pid)
        watched = [pidfd, out_read]
        while pidfd in watched:
            ready, _, _ = select.select(watched, [], [])
            if out_read in ready:
                data = os.read(out_read, 1 << 16)
                if data:
                    os.write(log, data)
                else:
                    watched.remove(out_read)
            if pidfd in ready:
                watched.remove(pidfd)
        job.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, 9)
        os.close(pidfd)
        os.close(out_read)
        if modelled:  # the end and its successor on disk before the successor starts; the daemon told after
            following = number + 1 if number + 1 < len(jobs) else None
            exit_file = work / f"gpu{gpu}.exit"
            temporary = exit_file.with_suffix(".tmp")
            temporary.write_text(
                json.dumps({"job": number, "exit_code": job.returncode, "next": following, "ended_at": time.time()})
            )
            os.rename(temporary, exit_file)
            with contextlib.suppress(OSError):
                fd = os.open(work / "wake", os.O_WRONLY | os.O_NONBLOCK)
                os.write(fd, b"!")
                os.close(fd)


def _daemon(wake: Path, tick: float, settle: float) -> None:
    """Sleeps on the FIFO; each wake-up costs ``tick`` seconds of CPU, as recording an end would, after
    ``settle`` seconds of waiting for more pokes."""
    fifo = os.open(wake, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(wake, os.O_WRONLY | os.O_NONBLOCK)  # noqa: F841 (no end of file between pokes)
    while True:
        select.select([fifo], [], [])
        if settle:
            time.sleep(settle)  # let the other ends of a burst come, and their successors start, first
        with contextlib.suppress(BlockingIOError):
            while os.read(fifo, 4096):
                continue
        until = time.thread_time() + tick
        while time.thread_time() < until:
            continue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tick-ms", type=float, default=0.9)
    parser.add_argument("--settle-ms", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {','.join(TOOLS)}")
    args = parser.parse_args(argv)
    names = [name for name in args.tools.split(",") if name]
    if not names or set(names) - set(TOOLS):
        parser.error(f"--tools: choose from {', '.join(TOOLS)}")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="gpuq-handoff-") as tmp:
        if not os.environ.get("GPUQ_BENCH_COMMAND"):  # gpuq as users install it, as the harness does
            command, how = install_regular(Path(tmp))
            if command is None:
                raise SystemExit(how)
            os.environ["GPUQ_BENCH_COMMAND"] = command
        for repeat in range(args.repeat):
            for name in names:
                work = Path(tmp) / f"{name}-{repeat}"
                tool: Tool
                if name == "sgs":
                    tool = SimpleGpuScheduler(work)
                elif name == "gpuq":
                    tool = Gpuq(work)
                elif name == "ideal":
                    tool = HandOff(work, name)
                else:
                    settle = args.settle_ms if name == "settled" else 0.0
                    tool = HandOff(work, name, tick_ms=args.tick_ms, settle_ms=settle)
                with tool:
                    figures = workloads.workload_a(tool, work, args.jobs)
                if figures["problems"]:
                    raise SystemExit(f"{name}: {figures['problems']}")
                runs[name].append(figures)
                print(
                    f"[{time.strftime('%H:%M:%S')}] {name} run {repeat + 1}: mean gap {figures['gap_mean_ms']:.2f} "
                    f"ms, makespan {figures['makespan_s']:.3f} s",
                    flush=True,
                )
    table = _table(runs, args)
    print(table)
    stamp = time.strftime("%Y-%m-%d")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"handoff-bound-{stamp}.json").write_text(
        json.dumps({"machine": _machine(), "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=1)
    )
    (args.out / f"handoff-bound-{stamp}.md").write_text(table + "\n")
    return 0


def _table(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    lines = [
        f"Workload A, {args.jobs} x 0.2 s on {GPUS} GPUs, medians of {args.repeat} ({_machine()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); the modelled daemon spends {args.tick_ms} ms "
        f"of CPU per pass (the settled one after {args.settle_ms} ms).",
        "",
        "| tool | mean gap | median gap | makespan | each run's mean gap |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, figures in runs.items():
        gaps = [f["gap_mean_ms"] for f in figures]
        lines.append(
            f"| {name} | {statistics.median(gaps):.2f} ms | "
            f"{statistics.median(f['gap_median_ms'] for f in figures):.2f} ms | "
            f"{statistics.median(f['makespan_s'] for f in figures):.3f} s | {', '.join(f'{g:.2f}' for g in gaps)} |"
        )
    return "\n".join(lines)


def _machine() -> str:
    return f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, Python {platform.python_version()}"


if __name__ == "__main__":
    raise SystemExit(main())
