"""The workloads every tool runs (A dispatch, B submit, C mixed) and gpuq's packing run (E, fake GPUs).

Each function takes a started tool and returns a flat dict of figures (seconds, unless the name says
ms or pct) plus a ``problems`` list from the correctness checks; the harness takes medians over repeats.
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers.base import GPUS, Tool, ToolError, job_argv, timed, wait_until
from bench.peers.gpuq import Gpuq


@dataclass(frozen=True)
class Stamp:
    job: int
    start: float
    end: float
    gpus: tuple[int, ...]


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def wait_for_stamps(out: Path, count: int, timeout: float) -> None:
    """Each job's file appears when it ends: wait until ``count`` of them are there."""
    wait_until(lambda: len(os.listdir(out)) >= count, timeout, f"{count} jobs to end in {out}", poll=0.02)


def stamped(path: Path) -> bool:
    """The job has written its line (the file exists a moment before its line is in it)."""
    try:
        return path.read_bytes().endswith(b"\n")
    except FileNotFoundError:
        return False


def read_stamps(out: Path, wanted: Sequence[int], problems: list[str]) -> list[Stamp]:
    """Every job's stamp; a job that ran zero or several times, or saw bad GPU ids, is a problem."""
    stamps = []
    for job, gpus in enumerate(wanted):
        path = out / str(job)
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) != 1:
            problems.append(f"job {job} ran {len(lines)} times")
            if not lines:
                continue
        start, end, *rest = lines[0].split()
        ids = tuple(int(i) for i in rest[0].split(",")) if rest and rest[0] else ()
        if len(ids) != gpus or len(set(ids)) != len(ids) or any(not 0 <= i < GPUS for i in ids):
            problems.append(f"job {job} asked for {gpus} GPU(s) and saw CUDA_VISIBLE_DEVICES={','.join(map(str, ids))}")
        stamps.append(Stamp(job, float(start), float(end), ids))
    return stamps


def analyse(
    stamps: Sequence[Stamp], problems: list[str], ideal: float, released: float, per_gpu: int = 1
) -> dict[str, Any]:
    """Makespan (first start to last end), gaps between jobs on each GPU, and overlap checks: at most
    ``per_gpu`` jobs on one GPU at any instant (1 for whole-GPU jobs)."""
    if not stamps:
        return {"problems": problems or ["no job ran"]}
    gaps: list[float] = []
    most = 0
    for gpu in range(GPUS):
        on_gpu = sorted((s for s in stamps if gpu in s.gpus), key=lambda s: s.start)
        level = 0
        for _, step in sorted([(s.start, 1) for s in on_gpu] + [(s.end, -1) for s in on_gpu]):
            level += step  # an end sorts before a start at the same instant
            most = max(most, level)
        if per_gpu > 1:
            continue
        for before, after in itertools.pairwise(on_gpu):
            gap = after.start - before.end
            if gap < 0:
                problems.append(
                    f"GPU {gpu} shared: job {after.job} started {-gap * 1000:.1f} ms before job {before.job} ended"
                )
            gaps.append(gap)
    if most > per_gpu:
        problems.append(f"{most} jobs ran on one GPU at once; at most {per_gpu} fit")
    first = min(s.start for s in stamps)
    makespan = max(s.end for s in stamps) - first
    busy = statistics.mean(s.end - s.start for s in stamps)
    return {
        "makespan_s": makespan,
        "ideal_s": ideal,
        "makespan_over_ideal": makespan / ideal,
        "gap_mean_ms": statistics.mean(gaps) * 1000 if gaps else None,
        "gap_median_ms": statistics.median(gaps) * 1000 if gaps else None,
        "gap_max_ms": max(gaps) * 1000 if gaps else None,
        "release_to_first_start_ms": (first - released) * 1000,
        "job_mean_s": busy,
        "most_jobs_on_one_gpu": most,
        "correct": not problems,
        "problems": problems[:20],
    }


def batch(
    tool: Tool,
    out: Path,
    pattern: Sequence[int],
    count: int,
    seconds: float,
    *,
    mem: str | None = None,
    per_gpu: int = 1,
) -> dict[str, Any]:
    """Queue ``count`` jobs (GPUs per job cycling through ``pattern``) while held, release, wait, check."""
    fresh_dir(out)
    wanted = [pattern[i % len(pattern)] for i in range(count)]
    jobs = [(gpus, job_argv(out / str(i), seconds, gpus)) for i, gpus in enumerate(wanted)]
    tool.hold()
    if mem is not None:
        assert isinstance(tool, Gpuq)
        tool.queue(jobs, mem=mem)
    else:
        tool.queue(jobs)
    time.sleep(0.5)  # let the tool settle with everything queued
    released = time.time()
    tool.release()
    ideal = sum(wanted) * seconds / GPUS
    wait_for_stamps(out, count, timeout=max(120.0, ideal * 20))
    tool.wait_idle()
    time.sleep(0.2)  # a job that ran twice would write its second line now
    problems: list[str] = []
    return analyse(read_stamps(out, wanted, problems), problems, ideal, released, per_gpu)


def workload_a(tool: Tool, work: Path, jobs: int) -> dict[str, Any]:
    """A, dispatch: ``jobs`` 1-GPU jobs of 0.2 s on 4 GPUs, all queued then released."""
    return batch(tool, work / "a-out", [1], jobs, 0.2)


def workload_c(tool: Tool, work: Path, jobs: int) -> dict[str, Any]:
    """C, mixed: jobs of 1, 1, 2 GPUs (0.2 s each), for tools that can give a job 2 GPUs."""
    if tool.max_gpus_per_job < 2:
        raise ToolError(f"{tool.title} gives a job one GPU only")
    return batch(tool, work / "c-out", [1, 1, 2], jobs, 0.2)


def workload_b(tool: Tool, work: Path, singles: int, many: int, idle_runs: int) -> dict[str, Any]:
    """B, submit: one CLI submit (median, tool held), ``many`` CLI submits one call each (tool released),
    idle submit-to-start."""
    result: dict[str, Any] = {}
    tool.hold()
    argv = job_argv(Path("/dev/null"), 0, 1)  # a script (sbatch takes only scripts); never runs: discarded
    times = [timed(tool.submit_argv(1, argv), tool.env) for _ in range(singles)]
    result["submit_ms"] = statistics.median(times) * 1000
    result["submit_p90_ms"] = sorted(times)[int(len(times) * 0.9)] * 1000
    tool.discard()
    # Released: the no-op jobs run while we submit, as they would for a user. (Held, task-spooler blocks
    # near 1000 queued jobs: each keeps a waiting client process and server connection.)
    command = tool.submit_argv(1, job_argv(Path("/dev/null"), 0, 1))
    started = time.perf_counter()
    for _ in range(many):
        timed(command, tool.env)
    result["many_submits"] = many
    result["many_submits_s"] = time.perf_counter() - started
    tool.discard()
    python = getattr(tool, "python", None)  # a tool whose command is a Python script: its interpreter's floor
    if python:
        started = time.perf_counter()
        for _ in range(many):
            timed([python, "-c", "pass"], tool.env)
        result["python_floor_s"] = time.perf_counter() - started

    out = fresh_dir(work / "b-out")
    to_start, call_to_start = [], []
    for run in range(idle_runs):
        path = out / str(run)
        called = time.time()
        tool.submit_now(1, job_argv(path, 0, 1))
        returned = time.time()
        wait_until(lambda: stamped(path), 60, f"idle job {run} to end", poll=0.002)  # noqa: B023
        start = float(path.read_text().split()[0])
        to_start.append(start - returned)  # negative: the job started before the submit command exited
        call_to_start.append(start - called)
        tool.wait_idle()
        time.sleep(0.3)  # idle again: nothing queued, nothing running, the tool back at rest
    result["idle_submit_to_start_ms"] = statistics.median(to_start) * 1000
    result["idle_submit_to_start_all_ms"] = [round(t * 1000, 2) for t in to_start]
    result["idle_call_to_start_ms"] = statistics.median(call_to_start) * 1000
    return result


def workload_b_bulk(tool: Gpuq, work: Path, count: int) -> dict[str, Any]:
    """B, gpuq's bulk paths: ``count`` jobs as one ``--array`` CLI call and as one Python API ``array()``.

    Also how long the daemon takes to have them all in its table (pending) after the submit returned.
    """
    result: dict[str, Any] = {"bulk_count": count}
    for how in ("cli", "api"):
        tool.discard()
        tool.hold()
        before = tool.pending_count()
        started = time.perf_counter()
        if how == "cli":
            timed([tool.binary, "submit", "--array", f"0-{count - 1}", "--gpus", "1", "true", "{index}"], tool.env)
        else:
            from gpuq_scheduler.jobs.api import array

            array(["true", "{index}"], range(count), gpus=1, home=tool.home)
        result[f"bulk_{how}_s"] = time.perf_counter() - started
        goal = before + count
        wait_until(lambda: tool.pending_count() >= goal, 120, "the daemon to ingest the array", poll=0.005)  # noqa: B023
        result[f"bulk_{how}_ingested_s"] = time.perf_counter() - started
    tool.discard()
    return result


def workload_e(work: Path, jobs: int, seconds: float) -> dict[str, Any]:
    """E, packing on fake GPUs: ``jobs`` jobs that each need 10 GiB, whole-GPU vs ``--mem 10G``."""
    result: dict[str, Any] = {"jobs": jobs, "seconds": seconds}
    fit = (80 * 1024 - 512) // (10 * 1024 + 1024)  # jobs of 10 GiB (+1 GiB overhead) an 80 GiB GPU holds
    for label, mem, per_gpu in (("whole", None, 1), ("mem", "10G", fit)):
        with Gpuq(work / f"e-{label}") as tool:
            figures = batch(tool, work / f"e-{label}-out", [1], jobs, seconds, mem=mem, per_gpu=per_gpu)
        result[f"{label}_makespan_s"] = figures.get("makespan_s")
        result[f"{label}_correct"] = figures.get("correct", False)
        result[f"{label}_problems"] = figures.get("problems", [])
        result[f"{label}_most_on_one_gpu"] = figures.get("most_jobs_on_one_gpu")
    if result.get("whole_makespan_s") and result.get("mem_makespan_s"):
        result["speedup"] = result["whole_makespan_s"] / result["mem_makespan_s"]
    return result
