"""What one ``gpuq submit`` costs, taken apart against what any Python command pays first, in one run.

    python bench/cli_cost.py [--rounds 200] [--out FILE]

Installs this checkout the way users get it (``pip install .`` into a venv of its own, as the harness
does: the development venv's editable install adds an import hook to every Python start), starts a
daemon on fake GPUs with the queue paused, and times each rung of a ladder, one call of each in turn
round after round, so that the machine's moods fall on every rung alike:

    /bin/true                             starting any process (from Python, as the harness does)
    python -I -S -c pass                  the interpreter alone, without site
    python -c pass                        the floor every Python command pays (the harness's "floor")
      ... ending in os._exit(0)           less the interpreter's teardown, which a submit skips
      ... importing submit's modules      plus the modules a ``gpuq submit`` imports
    gpuq submit --gpus 1 true             the whole command: imports, the id, the spool file, the wake-up

and prints the median per call and what 1000 calls, one after another, take at that rung (the issue's
"1000 separate submits" figure is the last rung's, measured by the harness with the daemon running the
jobs). The modules are read from ``-X importtime`` of one real submit.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.peers.base import ToolError, timed  # noqa: E402
from bench.peers.gpuq import Gpuq, install_regular  # noqa: E402


def submit_modules(python: str, gpuq: str, env: dict[str, str]) -> list[str]:
    """The modules one ``gpuq submit`` imports after the interpreter's own start (site and what it loads)."""
    proc = subprocess.run(
        [python, "-X", "importtime", gpuq, "submit", "--gpus", "1", "true"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", proc.stderr, re.MULTILINE)
    return names[names.index("site") + 1 :]


def ladder(tool: Gpuq, rounds: int) -> tuple[list[str], dict[str, list[float]]]:
    python = tool.python
    if python is None:
        raise ToolError(f"{tool.binary} is not a Python script")
    modules = submit_modules(python, tool.binary, tool.env)
    imports = ", ".join(modules)
    rungs = {
        "/bin/true": ["/bin/true"],
        "python -I -S -c pass": [python, "-I", "-S", "-c", "pass"],
        "python -c pass": [python, "-c", "pass"],
        "  ... ending in os._exit(0)": [python, "-c", "import os; os._exit(0)"],
        f"  ... importing submit's {len(modules)} modules": [python, "-c", f"import os, {imports}; os._exit(0)"],
        "gpuq submit --gpus 1 true": [tool.binary, "submit", "--gpus", "1", "true"],
    }
    samples: dict[str, list[float]] = {label: [] for label in rungs}
    for _ in range(rounds):
        for label, argv in rungs.items():
            samples[label].append(timed(argv, tool.env))
    return modules, samples


def report(modules: list[str], samples: dict[str, list[float]], how: str) -> str:
    lines = [
        f"gpuq CLI cost ladder, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, Python {sys.version.split()[0]}",
        f"gpuq installed: {how}; {len(next(iter(samples.values())))} rounds, one call of each rung a round",
        "",
        f"{'rung':40s} {'median ms':>10s} {'p90 ms':>8s} {'step ms':>8s} {'1000 calls':>11s}",
    ]
    previous = 0.0
    for label, times in samples.items():
        median = statistics.median(times) * 1000
        p90 = sorted(times)[int(len(times) * 0.9)] * 1000
        lines.append(f"{label:40s} {median:10.2f} {p90:8.2f} {median - previous:+8.2f} {median:9.2f} s")
        previous = median
    lines += ["", "the modules a submit imports after site: " + ", ".join(modules)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpuq-cli-") as tmp:
        work = Path(tmp)
        gpuq, how = install_regular(work)
        if gpuq is None:
            print(f"cli_cost: {how}", file=sys.stderr)
            return 1
        tool = Gpuq(work, command=gpuq)
        with tool:
            tool.hold()  # the submitted jobs wait: the ladder times the command, not the jobs it starts
            modules, samples = ladder(tool, args.rounds)
    text = report(modules, samples, how)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
