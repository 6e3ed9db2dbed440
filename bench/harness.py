"""gpuq against task-spooler, simple_gpu_scheduler and Slurm, in one command:

    python bench/harness.py [--quick] [--repeat 3] [--out bench/results] [--tools tsp,sgs,slurm,gpuq]
                            [--workloads A,B,C,D,E]

Installs the peers that are missing (Debian's task-spooler and Slurm with apt-get, which needs root;
simple_gpu_scheduler with pip into this Python), skips a peer whose install fails and says why, runs
each workload on each tool (figures are medians over --repeat runs), writes the raw figures with the
machine, date and versions to OUT/bench-<date>.json (and the table to OUT/bench-<date>.md), and prints
the results table last. ``--quick`` runs reduced sizes, for development and as a smoke test; its
files are named bench-<date>-quick.*. bench/README.md says what each workload measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gpuq_scale, workloads  # noqa: E402
from bench.harness_table import build_rows, real_packing, table  # noqa: E402
from bench.peers import TOOLS, Tool  # noqa: E402
from bench.peers import gpuq as gpuq_peer  # noqa: E402
from bench.peers import sgs as sgs_peer  # noqa: E402
from tests.slurm_local import missing_commands  # noqa: E402

RESULTS = ROOT / "bench" / "results"

FULL = {
    "a_jobs": 200,
    "c_jobs": 120,
    "b_singles": 50,
    "b_many": 1000,
    "b_idle": 20,
    "bulk": 10_000,
    "e_jobs": 16,
    "e_seconds": 1.0,
}
QUICK = {
    "a_jobs": 40,
    "c_jobs": 24,
    "b_singles": 10,
    "b_many": 50,
    "b_idle": 5,
    "bulk": 10_000,
    "e_jobs": 16,
    "e_seconds": 0.5,
}

# What the peers reached on the issue's machine (2026-11-22, medians of 3), for the record.
ISSUE_PEERS = {
    "A makespan (s)": {"tsp": 10.30, "sgs": 10.31, "slurm": 13.29},
    "A mean gap (ms)": {"tsp": 3.1, "sgs": 2.8, "slurm": 46},
    "idle submit -> start (ms)": {"tsp": 3.3, "sgs": 3.2, "slurm": 604},
    "one CLI submit (ms)": {"tsp": 0.9, "slurm": 4.0},
    "1000 submits (s)": {"tsp": 1.07, "sgs": 0.95, "slurm": 8.5},
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- installing the peers ---------------------------------------------------------------------------


class Installer:
    def __init__(self) -> None:
        self.updated = False

    def apt(self, packages: list[str]) -> str | None:
        """apt-get install; None when it worked, else why not."""
        if shutil.which("apt-get") is None:
            return "apt-get is not available (install the Debian packages by hand: " + " ".join(packages) + ")"
        if os.geteuid() != 0:
            return "installing Debian packages needs root: apt-get install -y " + " ".join(packages)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for attempt in range(2):
            if attempt or not self.updated:
                log("apt-get update")
                subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
                self.updated = True
            log(f"apt-get install -y {' '.join(packages)}")
            proc = subprocess.run(
                ["apt-get", "install", "-y", "-q", *packages], env=env, capture_output=True, text=True
            )
            if proc.returncode == 0:
                return None
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return f"apt-get install {' '.join(packages)} failed: " + " / ".join(tail)

    def pip(self, spec: list[str]) -> str | None:
        log(f"pip install {' '.join(spec)}")
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *spec], capture_output=True, text=True)
        if proc.returncode == 0:
            return None
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return f"pip install {' '.join(spec)} failed: " + " / ".join(tail)


def ensure_installed(names: list[str]) -> dict[str, str]:
    """Install what is missing; returns {tool: why it is skipped} for the tools that cannot run."""
    installer = Installer()
    skipped: dict[str, str] = {}
    checks: dict[str, tuple[Callable[[], bool], Callable[[], str | None]]] = {
        "tsp": (lambda: shutil.which("tsp") is not None, lambda: installer.apt(["task-spooler"])),
        "slurm": (lambda: not missing_commands(), lambda: installer.apt(["slurmctld", "slurmd", "slurm-client"])),
        "sgs": (lambda: sgs_peer.binary() is not None, lambda: installer.pip(["simple_gpu_scheduler"])),
        "gpuq": (lambda: gpuq_peer.binary() is not None, lambda: installer.pip(["-e", str(ROOT)])),
    }
    for name in names:
        present, install = checks[name]
        if present():
            continue
        why = install()
        if why is None and not present():
            why = "installed, but its command is still not found"
        if why is not None:
            skipped[name] = why
            log(f"SKIPPING {TOOLS[name].title}: {why}")
    if "slurm" in names and "slurm" not in skipped and os.geteuid() != 0:
        skipped["slurm"] = "a private Slurm needs root (slurmd runs jobs as their submitter; mknod for the GPUs)"
        log(f"SKIPPING Slurm: {skipped['slurm']}")
    return skipped


# -- the machine ------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    def first(path: str, key: str) -> str:
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return line.split(":", 1)[1].strip().strip('"') if ":" in line else line.split("=", 1)[1]
        except OSError:
            pass
        return "unknown"

    try:
        mem = int(first("/proc/meminfo", "MemTotal").split()[0]) / (1 << 20)
    except (ValueError, IndexError):
        mem = 0.0
    os_name = "unknown"
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return {
        "host": platform.node(),
        "cpu": first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "os": os_name,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_at_start": list(os.getloadavg()),
        "PYTHONDONTWRITEBYTECODE_was_set": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
    }


# -- running ------------------------------------------------------------------------------------------


def run_tool_workload(name: str, work: Path, body: Callable[[Tool], dict[str, Any]]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        with TOOLS[name](work) as tool:
            figures = body(tool)
    except Exception as err:  # one tool's failure must not end the run: record it and go on
        log(f"  {name}: ERROR {err}")
        return {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(limit=4)}
    figures["wall_s"] = time.perf_counter() - started
    return figures


def summary(figures: dict[str, Any]) -> str:
    keys = (
        "makespan_s",
        "gap_mean_ms",
        "correct",
        "submit_ms",
        "idle_submit_to_start_ms",
        "many_submits_s",
        "bulk_cli_s",
        "speedup",
    )
    parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items() if k in keys]
    if figures.get("problems"):
        parts.append(f"problems={figures['problems'][:3]}")
    return " ".join(parts) or str(figures.get("error", ""))[:200]


def run_all(args: argparse.Namespace, tools: list[str], work: Path) -> dict[str, Any]:
    size = QUICK if args.quick else FULL
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}

    def record(workload: str, tool: str, figures: dict[str, Any]) -> None:
        runs.setdefault(workload, {}).setdefault(tool, []).append(figures)
        log(f"  {workload} {tool}: {summary(figures)}")

    for rep in range(args.repeat):
        log(f"repeat {rep + 1} of {args.repeat}")
        if "A" in args.workloads:
            for name in tools:
                log(f"A dispatch: {size['a_jobs']} jobs of 0.2 s on {name}")
                record(
                    "A",
                    name,
                    run_tool_workload(
                        name, work / f"A-{name}-{rep}", lambda t: workloads.workload_a(t, t.work, size["a_jobs"])
                    ),
                )
        if "C" in args.workloads:
            for name in tools:
                if TOOLS[name].max_gpus_per_job < 2:
                    continue
                log(f"C mixed: {size['c_jobs']} jobs of 1,1,2 GPUs on {name}")
                record(
                    "C",
                    name,
                    run_tool_workload(
                        name, work / f"C-{name}-{rep}", lambda t: workloads.workload_c(t, t.work, size["c_jobs"])
                    ),
                )
        if "B" in args.workloads:
            for name in tools:
                log(f"B submit on {name}")

                def body(t: Tool) -> dict[str, Any]:
                    figures = workloads.workload_b(t, t.work, size["b_singles"], size["b_many"], size["b_idle"])
                    if isinstance(t, gpuq_peer.Gpuq):
                        figures.update(workloads.workload_b_bulk(t, t.work, size["bulk"]))
                    return figures

                record("B", name, run_tool_workload(name, work / f"B-{name}-{rep}", body))
        if "E" in args.workloads and "gpuq" in tools:
            log(f"E packing: {size['e_jobs']} jobs of 10 GiB, whole GPU vs --mem 10G, on gpuq")
            try:
                figures = workloads.workload_e(work / f"E-{rep}", size["e_jobs"], size["e_seconds"])
            except Exception as err:
                figures = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(limit=4)}
            record("E", "gpuq", figures)
    if "D" in args.workloads and "gpuq" in tools:
        log("D scale (gpuq): a pass over 10,000 pending, status over 100,000 finished, daemon CPU")
        try:
            figures = gpuq_scale.workload_d(work / "D", args.quick)
        except Exception as err:
            figures = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(limit=4)}
        record("D", "gpuq", figures)
    return runs


def medians(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per workload and tool, the median of each number over the repeats that did not fail."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for workload, by_tool in runs.items():
        for tool, reps in by_tool.items():
            good = [r for r in reps if "error" not in r]
            merged: dict[str, Any] = {"repeats": len(good)}
            if len(good) < len(reps):
                merged["errors"] = [r["error"] for r in reps if "error" in r]
            for key in {k for r in good for k in r}:
                values = [r[key] for r in good if key in r]
                if all(isinstance(v, bool) for v in values):
                    merged[key] = all(values)
                elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                    merged[key] = statistics.median(values)
            merged["problems"] = sorted({p for r in good for p in r.get("problems", [])})[:20]
            out.setdefault(workload, {})[tool] = merged
    return out


def versions(tools: list[str], work: Path) -> dict[str, str]:
    found = {}
    for name in tools:
        try:
            found[name] = TOOLS[name](work / f"version-{name}").version()
        except Exception as err:
            found[name] = f"unknown ({err})"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="reduced sizes, for development and a smoke test")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each workload; figures are medians")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON and the table go")
    parser.add_argument("--tools", default="tsp,sgs,slurm,gpuq", help="comma-separated: tsp,sgs,slurm,gpuq")
    parser.add_argument("--workloads", default="A,B,C,D,E", help="comma-separated: A,B,C,D,E")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (stamps, logs)")
    args = parser.parse_args(argv)
    args.workloads = {w.strip().upper() for w in args.workloads.split(",") if w.strip()}
    wanted = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in TOOLS]
    if unknown:
        parser.error(f"unknown tool(s) {', '.join(unknown)}; choose from {', '.join(TOOLS)}")
    started = time.time()
    skipped = ensure_installed(wanted)
    tools = [t for t in wanted if t not in skipped]
    work = Path(tempfile.mkdtemp(prefix="gpuq-bench-"))
    log(
        f"work directory {work}; tools {', '.join(tools)}; workloads {','.join(sorted(args.workloads))}; "
        f"{'quick' if args.quick else 'full'} sizes, {args.repeat} repeat(s)"
    )
    gpuq_install = "editable (the development venv)"
    if "gpuq" in tools and not os.environ.get("GPUQ_BENCH_COMMAND"):
        # Timed as users install it: an editable install loads setuptools' import hook at every start.
        regular, how = gpuq_peer.install_regular(work)
        if regular is not None:
            os.environ["GPUQ_BENCH_COMMAND"] = regular
            gpuq_install = how
        else:
            gpuq_install += f"; a regular install failed: {how}"
        log(f"gpuq: {gpuq_install}")
    try:
        info = machine()
        info["gpuq_install"] = gpuq_install
        found_versions = versions(tools, work)
        runs = run_all(args, tools, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    size = QUICK if args.quick else FULL
    med = medians(runs)
    rows = build_rows(med, size)
    text = table(rows, skipped)
    info["load_at_end"] = list(os.getloadavg())
    date = time.strftime("%Y-%m-%d", time.gmtime(started))
    stem = f"bench-{date}" + ("-quick" if args.quick else "")
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": info,
        "versions": found_versions,
        "args": {
            "quick": args.quick,
            "repeat": args.repeat,
            "tools": wanted,
            "workloads": sorted(args.workloads),
            "sizes": size,
        },
        "skipped": skipped,
        "medians": med,
        "runs": runs,
        "real_gpu_packing": real_packing(),
        "issue_peer_figures_2026_11_22": ISSUE_PEERS,
        "table": text,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"{stem}.json"
    json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    head = (
        f"{result['date']}, {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB, {info['os']}; "
        f"load {info['load_at_start'][0]:.2f} at start, {info['load_at_end'][0]:.2f} at end; "
        f"{'quick sizes' if args.quick else 'full sizes'}, medians of {args.repeat}"
    )
    notes = [f"- {name}: {ver}" for name, ver in found_versions.items()]
    notes += [f"- {TOOLS[name].title} skipped: {why}" for name, why in skipped.items()]
    md = f"{head}\n\n{text}\n\nRatios: the peer's figure over gpuq's (above 1: gpuq is faster).\n\n" + "\n".join(notes)
    (args.out / f"{stem}.md").write_text(md + "\n")
    log(f"wrote {json_path} and {args.out / (stem + '.md')} in {result['duration_s']:.0f} s")
    print()
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
