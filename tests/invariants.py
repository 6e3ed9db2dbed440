"""Checks over what jobs themselves reported: no GPU over-committed, no whole GPU shared, each job once."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

MARGIN = 512 << 20


def check_exactly_once(reports: list[dict[str, Any]], job_ids: list[int]) -> None:
    counts: dict[int, int] = defaultdict(int)
    for line in reports:
        counts[line["job"]] += 1
    twice = {job: n for job, n in counts.items() if n > 1}
    missing = sorted(set(job_ids) - set(counts))
    assert not twice, f"jobs that ran more than once: {twice}"
    assert not missing, f"jobs that never ran: {missing}"


def check_no_overcommit(reports: list[dict[str, Any]], totals: dict[int, int]) -> None:
    """At every job's start, the jobs running on each of its GPUs fit in that GPU, and whole GPUs are alone."""
    per_gpu: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line in reports:
        for gpu in (int(g) for g in line["cvd"].split(",") if g != ""):
            per_gpu[gpu].append(line)
    for gpu, lines in per_gpu.items():
        for line in lines:
            instant = line["start"]
            present = [other for other in lines if other["start"] <= instant < other["end"]]
            whole = [other for other in present if not other["mem"]]
            if whole:
                assert len(present) == 1, f"GPU {gpu} shared by a whole-GPU job at {instant}: {present}"
            else:
                used = sum(int(other["mem"]) for other in present)
                assert used <= totals[gpu] - MARGIN, f"GPU {gpu} over-committed at {instant}: {used} bytes"
