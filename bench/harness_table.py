"""The results table of bench/harness.py, in Markdown: one row per figure (each workload's makespan, gaps,
correctness, submit latencies, scale and packing figures), each tool's median over the repeats, gpuq's
target for it and whether it is met, and each peer's figure over gpuq's; plus a row for packing on real
GPUs, from the latest bench/gpu_validation.py result in bench/results/. It runs nothing: it only lays out
the figures the harness measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GPU_VALIDATION = sorted((Path(__file__).resolve().parent / "results").glob("gpu_validation-*.json"))
PEERS = ("tsp", "sgs", "slurm")


def real_packing() -> dict[str, Any] | None:
    """Packing on real GPUs from the latest bench/gpu_validation.py result (by the date recorded in it)."""
    found = []
    for path in GPU_VALIDATION:
        try:
            data = json.loads(path.read_text())
            packing = data["packing"]
            gpus = data.get("machine", {}).get("gpus", [])
            spans = dict(packing["makespan_s"])
            whole = spans.pop("whole_gpu")
            mem_key, mem = next(iter(spans.items()))  # e.g. mem_4G
            found.append(
                {
                    "file": path.name,
                    "label": f"{len(gpus)}x {gpus[0]}" if gpus else "real GPUs",
                    "jobs": packing["jobs"],
                    "whole_s": whole,
                    "mem_s": mem,
                    "mem": mem_key.removeprefix("mem_"),
                    "speedup": packing["speedup"],
                    "date": str(data.get("machine", {}).get("date", "")),
                }
            )
        except (OSError, ValueError, KeyError, IndexError, TypeError, StopIteration):
            continue
    return max(found, key=lambda r: (r["date"], r["file"])) if found else None


def build_rows(med: dict[str, dict[str, dict[str, Any]]], size: dict[str, Any]) -> list[dict[str, Any]]:
    """Each row: label, the value per tool, gpuq's target and whether it is met."""
    rows: list[dict[str, Any]] = []

    def get(workload: str, tool: str, key: str) -> Any:
        return med.get(workload, {}).get(tool, {}).get(key)

    def row(
        label: str,
        workload: str,
        key: str,
        fmt: str,
        *,
        target: float | None = None,
        lower: bool = True,
        scale: float = 1.0,
        tools: tuple[str, ...] = (*PEERS, "gpuq"),
        target_text: str = "",
        target_key: str | None = None,
        target_scale: float = 1.0,
    ) -> None:
        values = {}
        for tool in tools:
            value = get(workload, tool, key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = value * scale
            values[tool] = value
        met = None
        if target is not None:
            mine = get(workload, "gpuq", target_key or key)
            if isinstance(mine, (int, float)):
                mine = mine * target_scale
                met = mine <= target if lower else mine >= target
        rows.append({"label": label, "values": values, "fmt": fmt, "lower": lower, "target": target_text, "met": met})

    ideal_a = size["a_jobs"] * 0.2 / 4
    ideal_c = size["c_jobs"] / 3 * 4 * 0.2 / 4
    row(
        f"A makespan, {size['a_jobs']} x 0.2 s jobs (ideal {ideal_a:g} s)",
        "A",
        "makespan_s",
        "{:.2f} s",
        target=1.025,
        target_key="makespan_over_ideal",
        target_text=f"<= {ideal_a * 1.025:.2f} s",
    )
    row("A mean gap, end -> next start on a GPU", "A", "gap_mean_ms", "{:.1f} ms", target=2.5, target_text="<= 2.5 ms")
    row("A correct (no GPU shared, each ran once, right ids)", "A", "correct", "bool")
    row(
        f"C makespan, {size['c_jobs']} jobs of 1,1,2 GPUs (ideal {ideal_c:g} s)",
        "C",
        "makespan_s",
        "{:.2f} s",
        tools=("tsp", "slurm", "gpuq"),
    )
    row("C mean gap", "C", "gap_mean_ms", "{:.1f} ms", tools=("tsp", "slurm", "gpuq"))
    row("C correct", "C", "correct", "bool", tools=("tsp", "slurm", "gpuq"))
    row("B one CLI submit (median)", "B", "submit_ms", "{:.1f} ms", target=50, target_text="<= 50 ms")
    row(
        "B idle submit -> job start, after the submit returned",
        "B",
        "idle_submit_to_start_ms",
        "{:.1f} ms",
        target=5,
        target_text="<= 5 ms",
    )
    row(
        "B idle: submit command started -> job start",
        "B",
        "idle_call_to_start_ms",
        "{:.1f} ms",
        target=20,
        target_text="<= 20 ms",
    )
    row(
        f"B {size['b_many']} submits, one CLI call each",
        "B",
        "many_submits_s",
        "{:.2f} s",
        target=8 * size["b_many"] / 1000,
        target_text=f"<= {8 * size['b_many'] / 1000:g} s",
    )
    row(
        f"B ... the floor: {size['b_many']} x `python -c pass` (gpuq's interpreter), same loop",
        "B",
        "python_floor_s",
        "{:.2f} s",
        tools=("gpuq",),
    )
    row(
        f"B {size['bulk']:,} jobs as one --array CLI call",
        "B",
        "bulk_cli_s",
        "{:.3f} s",
        target=0.5,
        tools=("gpuq",),
        target_text="<= 0.5 s",
    )
    row(
        f"B {size['bulk']:,} jobs as one Python API array()",
        "B",
        "bulk_api_s",
        "{:.3f} s",
        target=0.5,
        tools=("gpuq",),
        target_text="<= 0.5 s",
    )
    row(
        "B ... all in the daemon's table, after the CLI call began",
        "B",
        "bulk_cli_ingested_s",
        "{:.2f} s",
        tools=("gpuq",),
    )
    row(
        "D one placement pass, 10,000 pending, 8 GPUs (worst case)",
        "D",
        "place_worst_ms",
        "{:.1f} ms",
        target=10,
        tools=("gpuq",),
        target_text="<= 10 ms",
    )
    row(
        "D the daemon's pass after an event, 10,000 pending, 8 busy GPUs",
        "D",
        "daemon_pass_ms",
        "{:.1f} ms",
        target=10,
        tools=("gpuq",),
        target_text="<= 10 ms",
    )
    row(
        "D the daemon's pass when nothing changed (a periodic wake-up)",
        "D",
        "daemon_unchanged_pass_ms",
        "{:.2f} ms",
        tools=("gpuq",),
    )
    row(
        "D gpuq status, 100,000 finished jobs",
        "D",
        "status_ms",
        "{:.0f} ms",
        target=200,
        tools=("gpuq",),
        target_text="<= 200 ms",
    )
    row(
        "D gpuq status --all, 100,000 finished jobs",
        "D",
        "status_all_ms",
        "{:.0f} ms",
        target=500,
        tools=("gpuq",),
        target_text="<= 500 ms",
    )
    row(
        "D idle daemon CPU (% of one core)",
        "D",
        "idle_cpu_pct",
        "{:.2f} %",
        target=1.0,
        tools=("gpuq",),
        target_text="< 1 %",
    )
    row("D daemon CPU, 1,000 jobs waiting (% of one core)", "D", "waiting_cpu_pct", "{:.2f} %", tools=("gpuq",))
    row(
        f"E fake 4x80GiB: {size['e_jobs']} jobs of 10 GiB, whole GPUs",
        "E",
        "whole_makespan_s",
        "{:.2f} s",
        tools=("gpuq",),
    )
    row("E fake: the same jobs with --mem 10G", "E", "mem_makespan_s", "{:.2f} s", tools=("gpuq",))
    row("E fake: packing speedup", "E", "speedup", "{:.2f}x", lower=False, tools=("gpuq",))
    real = real_packing()
    if real is not None:
        rows.append(
            {
                "label": f"E real {real['label']}: {real['jobs']} jobs, whole GPU -> --mem {real['mem']} "
                f"({real['file']})",
                "values": {"gpuq": f"{real['whole_s']:.1f} s -> {real['mem_s']:.1f} s = {real['speedup']:.2f}x"},
                "fmt": "text",
                "lower": False,
                "target": "",
                "met": None,
            }
        )
    return rows


def fmt_value(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "bool":
        return "yes" if value else "NO"
    if fmt == "text" or isinstance(value, str):
        return str(value)
    return fmt.format(value)


def ratio(peer: Any, mine: Any, lower: bool, fmt: str) -> str:
    if fmt in ("bool", "text") or not isinstance(peer, (int, float)) or not isinstance(mine, (int, float)):
        return ""
    if isinstance(peer, bool) or isinstance(mine, bool) or peer <= 0 or mine <= 0:
        return ""
    return f"{(peer / mine) if lower else (mine / peer):.2f}x"


def table(rows: list[dict[str, Any]], skipped: dict[str, str]) -> str:
    header = [
        "figure",
        "task-spooler",
        "simple_gpu_scheduler",
        "Slurm, tuned",
        "gpuq",
        "gpuq target",
        "met",
        "gpuq vs tsp",
        "vs sgs",
        "vs Slurm",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for r in rows:
        if all(v is None for v in r["values"].values()):
            continue  # a workload that was not run (or failed everywhere: the JSON has its errors)
        values = r["values"]
        cells = [r["label"]]
        for tool in (*PEERS, "gpuq"):
            if tool in skipped:
                cells.append("skipped")
            elif tool not in values:
                cells.append("n/a")
            else:
                cells.append(fmt_value(values[tool], r["fmt"]))
        cells.append(r["target"])
        cells.append("" if r["met"] is None else ("yes" if r["met"] else "**NO**"))
        cells += [ratio(values.get(p), values.get("gpuq"), r["lower"], r["fmt"]) for p in PEERS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
