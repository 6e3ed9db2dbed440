"""What each fast-start part gains on workload A's gap: the harness's workload A with every part on, and with each
part switched off on its own (``GPUQ_FASTSTART_OFF``, ``launcher/supervisor/switches.py``), the others on, in
turn, round after round, in one run (the order turns by one each round: what runs later in a call runs slower
on a lent host):

    python bench/faststart.py OUT [--rounds 3] [--repeat 3] [--parts handoff,files,born,zygote] [--full]

Each turn is ``bench/harness.py --tools gpuq --workloads A --repeat N`` (``--quick``: 40 jobs, unless ``--full``)
into ``OUT/<config>-<round>/``; ``OUT/summary.txt`` has every run's mean gap and, per configuration, the median
over all its runs and its gain (``table``: positive, the part shortens the gap). gpuq is
installed once, as users get it (``GPUQ_BENCH_COMMAND`` if set).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.peers import gpuq as gpuq_peer  # noqa: E402


def gaps(folder: Path) -> list[float]:
    """The mean gap (ms) of each run the harness recorded in ``folder``."""
    found = []
    for path in sorted(folder.glob("bench-*.json")):
        runs = json.loads(path.read_text())["runs"].get("A", {}).get("gpuq", [])
        found += [run["gap_mean_ms"] for run in runs if "gap_mean_ms" in run]
    return found


def table(out: Path, configs: list[str], rounds: int) -> list[str]:
    """Per configuration: its runs, the median of their mean gaps, and its gain, the median over rounds of (its
    median in the round - all on's median in the round): paired within a round, so that a machine whose load
    drifts from round to round (a shared VM) blurs it less."""
    lines = [f"{'off':8} {'runs':>4} {'median gap':>10} {'gain, paired by round':>22}"]
    for config in configs:
        every = [g for r in range(1, rounds + 1) for g in gaps(out / f"{config}-{r}")]
        paired = [
            statistics.median(gaps(out / f"{config}-{r}")) - statistics.median(gaps(out / f"all-{r}"))
            for r in range(1, rounds + 1)
            if gaps(out / f"{config}-{r}") and gaps(out / f"all-{r}")
        ]
        median = statistics.median(every) if every else float("nan")
        each = " ".join(f"{d:+.2f}" for d in paired)
        gain = statistics.median(paired) if paired else float("nan")
        lines.append(f"{config:8} {len(every):4} {median:8.2f} ms {gain:+8.2f} ms   ({each})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default="handoff,files,born,zygote")
    parser.add_argument("--full", action="store_true", help="200 jobs a run rather than 40")
    parser.add_argument("--repeat", type=int, default=3, help="runs a turn (1: the finest interleaving)")
    parser.add_argument("--table", action="store_true", help="only the table of what OUT holds")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    configs = ["all", *args.parts.split(",")]
    if args.table:
        print("\n".join(table(args.out, configs, args.rounds)))
        return
    work = Path(tempfile.mkdtemp(prefix="gpuq-faststart-"))
    if not os.environ.get("GPUQ_BENCH_COMMAND"):
        regular, how = gpuq_peer.install_regular(work)
        if regular is None:
            raise SystemExit(f"gpuq could not be installed: {how}")
        os.environ["GPUQ_BENCH_COMMAND"] = regular
    lines = [
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} {platform.node()} {os.cpu_count()} cores "
        f"{platform.release()} load {os.getloadavg()[0]:.2f}; {args.rounds} rounds of {' '.join(configs)}, "
        f"A {'full' if args.full else 'quick'}, {args.repeat} run(s) a turn"
    ]
    print(lines[0], flush=True)
    for round_ in range(1, args.rounds + 1):
        turn = (round_ - 1) % len(configs)
        for config in configs[turn:] + configs[:turn]:
            env = {k: v for k, v in os.environ.items() if k != "GPUQ_FASTSTART_OFF"}
            if config != "all":
                env["GPUQ_FASTSTART_OFF"] = config
            folder = args.out / f"{config}-{round_}"
            sizes = [] if args.full else ["--quick"]
            command = [
                sys.executable,
                str(ROOT / "bench" / "harness.py"),
                "--tools",
                "gpuq",
                "--workloads",
                "A",
                "--repeat",
                str(args.repeat),
                "--out",
                str(folder),
                *sizes,
            ]
            subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=600)
            line = f"round {round_} {config:8} " + " ".join(f"{g:.2f}" for g in gaps(folder)) + " ms"
            print(line, flush=True)
            lines.append(line)
    lines += table(args.out, configs, args.rounds)
    lines.append(f"{time.strftime('%H:%M UTC', time.gmtime())} load {os.getloadavg()[0]:.2f}")
    print("\n".join(lines[-len(configs) - 2 :]))
    (args.out / "summary.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
