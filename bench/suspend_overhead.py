"""What gpuq adds around a suspend and a resume, with the fake checkpoint (any machine, no GPU):

    python bench/suspend_overhead.py [--rounds 10] [--roots /path/to/other/checkout .] [--ways gpuq click]
                                     [--installed] [--out FILE]

Each root is a gpuq source tree (run through PYTHONPATH, so a checkout of main in another worktree and this
one can be compared in one run, taking turns round after round). Each way is how the command is run:
``gpuq`` as the `gpuq` script runs it (``launcher.cli.entry``: the quick path where it takes the command),
``click`` through click's commands alone (``launcher.cli.app``); the ways take turns too, on the same queue.
``--installed``: this checkout installed as users get it (``pip install .`` into a venv of its own, as
bench/cli_cost.py does), without the development venv's editable-install hook that every Python start there
loads; one root only. For each root, a queue on one fake 80 GiB GPU
runs a fake CUDA job holding 4 GiB (tests/fixtures/fake_counter.py); the fake checkpoint takes no time
(GPUQ_FAKE_CHECKPOINT_SECONDS=0), so everything measured is gpuq's own. Each round suspends it with
`gpuq suspend` and resumes it with `gpuq resume`, and reads the times from events.jsonl, counted from
the moment before the command starts:

    command    the `gpuq suspend` process, start to exit (the CLI)
    seen       the daemon's pass that took the request (its ``suspending`` / ``resume-requested`` event)
    helper     the helper process running (its first and last moment, where the tree records them)
    recorded   the pass that recorded the job suspended / running again (its ``suspended`` / ``resumed`` event)

and prints the median of each per root. ``recorded`` less the helper's driver calls (none here) is the fixed
overhead that bench/gpu_suspend.py sees beside the real driver's.
"""

from __future__ import annotations

import argparse
import json
import os
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
    sys.path.insert(0, str(ROOT))  # bench.peers, for --installed
FIXTURES = ROOT / "tests" / "fixtures"


# How each way runs `gpuq ARGS` (``python -c CODE ARGS``): as the `gpuq` script does, or through click alone.
WAYS = {
    "gpuq": "from gpuq_scheduler.launcher.cli.entry import main; raise SystemExit(main())",
    "click": "from gpuq_scheduler.launcher.cli.app import main; raise SystemExit(main())",
}


class Queue:
    """A private queue on one fake GPU, run from the source tree ``root`` (``python``: an interpreter with
    gpuq installed, the tree then unused)."""

    def __init__(self, root: Path, work: Path, python: str | None = None) -> None:
        self.root, self.home, self.work = root, work / "state", work / "work"
        self.python = python or sys.executable
        usage = work / "usage"
        for folder in (self.work, usage):
            folder.mkdir(parents=True)
        for name in ("fake_cuda.py", "fake_counter.py"):
            shutil.copy(FIXTURES / name, self.work / name)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
        self.env.pop("PYTHONPATH", None)
        self.env.update(
            GPUQ_HOME=str(self.home),
            GPUQ_FAKE_GPUS="1x80GiB",
            GPUQ_FAKE_USAGE=str(usage),
            GPUQ_FAKE_HOST_MEMORY="256GiB",
            GPUQ_FAKE_CHECKPOINT_SECONDS="0",
            PATH=str(Path(self.python).parent) + os.pathsep + os.environ.get("PATH", os.defpath),
        )
        if python is None:
            self.env["PYTHONPATH"] = str(root)
        self.events = self.home / "events.jsonl"
        self._read = 0  # bytes of events.jsonl already looked through
        self.job = 0

    def gpuq(self, *args: str, way: str = "gpuq") -> str:
        return subprocess.run(
            [self.python, "-c", WAYS[way], *args],
            env=self.env,
            cwd=self.work,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout

    def start(self) -> None:
        counts = self.work / "counts"
        self.job = int(json.loads(self.gpuq("submit", "--json", "fake_counter.py", "4", str(counts), "10000000"))["id"])
        deadline = time.monotonic() + 60
        while not json.loads(self.gpuq("show", "--json", str(self.job)))["peak_mem"]:
            if time.monotonic() > deadline:
                raise TimeoutError("the job to count and be seen")
            time.sleep(0.2)
        self._read = self.events.stat().st_size

    def wait_event(self, kind: str, timeout: float = 60.0) -> dict[str, Any]:
        """The next event of this kind for the job, read from where the last look stopped."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.events.open("rb") as handle:
                handle.seek(self._read)
                chunk = handle.read()
            lines = chunk.split(b"\n")
            for at, line in enumerate(lines[:-1]):  # the last is empty or still being written
                data = json.loads(line)
                if data.get("job") == self.job and data.get("event") == kind:
                    self._read += sum(len(done) + 1 for done in lines[: at + 1])
                    return dict(data)
            time.sleep(0.005)
        raise TimeoutError(f"job {self.job}'s {kind} event")

    def act(self, action: str, way: str) -> dict[str, float]:
        """One suspend or resume, its times from the moment before the command started."""
        seen_kind, done_kind = ("suspending", "suspended") if action == "suspend" else ("resume-requested", "resumed")
        at = time.time()
        self.gpuq(action, str(self.job), way=way)
        command = time.time() - at
        seen, done = self.wait_event(seen_kind), self.wait_event(done_kind)
        found = {"command": command, "seen": seen["t"] - at, "recorded": done["t"] - at}
        helper = done.get("helper") or {}
        for key in ("spawned", "began", "ended"):
            if key in helper:
                found[f"helper_{key}"] = float(helper[key]) - at
        found["driver_calls"] = sum(float(v) for k, v in (done.get("steps") or {}).items() if k in DRIVER_CALLS)
        return {k: round(v, 4) for k, v in found.items()}

    def floor(self) -> float:
        """Seconds `python -c pass` takes with this queue's interpreter and environment."""
        at = time.perf_counter()
        subprocess.run([self.python, "-c", "pass"], env=self.env, cwd=self.work, check=True, timeout=60)
        return time.perf_counter() - at

    def stop(self) -> None:
        for args in (("cancel", str(self.job)), ("daemon", "stop")):
            subprocess.run([self.python, "-c", WAYS["gpuq"], *args], env=self.env, capture_output=True, timeout=60)


DRIVER_CALLS = ("lock", "checkpoint", "restore", "unlock")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--roots", type=Path, nargs="+", default=[ROOT], help="gpuq source trees to compare")
    parser.add_argument("--ways", nargs="+", choices=sorted(WAYS), default=["gpuq"], help="how to run the command")
    parser.add_argument("--installed", action="store_true", help="this checkout, installed as users get it")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    roots = [root.resolve() for root in args.roots]
    if args.installed and roots != [ROOT]:
        parser.error("--installed measures this checkout alone: leave --roots out")
    found: dict[str, dict[str, list[dict[str, float]]]] = {
        _name(root, way): {"suspend": [], "resume": []} for root in roots for way in args.ways
    }
    floor: dict[str, list[float]] = {str(root): [] for root in roots}  # `python -c pass`, for the scale
    how = "the source tree through PYTHONPATH (the development venv's interpreter)"
    with tempfile.TemporaryDirectory(prefix="gpuq-overhead-") as tmp:
        python = None
        if args.installed:
            from bench.peers.gpuq import install_regular

            script, how = install_regular(Path(tmp))
            if script is None:
                sys.exit(f"suspend_overhead: {how}")
            python = str(Path(script).parent / "python")
        queues = [Queue(root, Path(tmp) / str(index), python) for index, root in enumerate(roots)]
        try:
            for queue in queues:
                queue.start()
            for index in range(args.rounds):
                order = queues if index % 2 == 0 else queues[::-1]  # which goes first alternates
                ways = args.ways if index % 2 == 0 else args.ways[::-1]
                for queue in order:
                    floor[str(queue.root)].append(queue.floor())
                    for way in ways:
                        for action in ("suspend", "resume"):
                            found[_name(queue.root, way)][action].append(queue.act(action, way))
                            time.sleep(0.2)  # let the daemon settle back into its idle sleep
        finally:
            for queue in queues:
                queue.stop()
    medians = {name: {action: _medians(rows) for action, rows in actions.items()} for name, actions in found.items()}
    floors = {root: round(statistics.median(times), 4) for root, times in floor.items()}
    for root, median in floors.items():
        print(f"{root}: python -c pass {median * 1000:.0f} ms (the floor any Python command pays)")
    for name, actions in medians.items():
        for action, row in actions.items():
            print(f"{name} {action}: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in row.items()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        summary = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "cpus": os.cpu_count(),
            "rounds": args.rounds,
            "gpuq": how,
            "python": sys.version.split()[0],
            "load_at_end": os.getloadavg(),
        }
        found_all = {"medians": medians, "python_floor": floors, "rounds_found": found}
        args.out.write_text(json.dumps({**summary, **found_all}, indent=1) + "\n")


def _name(root: Path, way: str) -> str:
    return f"{root} ({way})"


def _medians(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = [key for key in rows[0] if all(key in row for row in rows)]
    return {key: round(statistics.median(row[key] for row in rows), 4) for key in keys}


if __name__ == "__main__":
    main()
