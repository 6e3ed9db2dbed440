"""What a job cost the host: CPU time and peak host memory, from its cgroup, in the report (per job and per
user), /api/jobs and /metrics, as GPU-hours and energy are (tests/test_energy.py). Real daemons and jobs
that burn CPU in a `setsid` child, so the figure is the cgroup's, not the job's first process's; this
machine's cgroup2 has no memory controller, so peak host memory is checked where the daemon recorded one
(the lent GPU host) and its absence everywhere else. The report's sums are pure: checked on plain records.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.units import format_duration, format_size
from gpuq_scheduler.launcher.views.report import build_report
from gpuq_scheduler.launcher.views.report_text import outcome_table, user_table
from tests.conftest import Gpuq, make_env, wait_for
from tests.test_containment import needs_cgroup2, script
from tests.test_serve import Served

NOW = 1_700_000_000.0
DONE = ("succeeded", "failed", "cancelled", "timeout", "lost")
BURN = "import time\nwhile time.process_time() < 0.3:\n    pass\n"


def record(job_id: int, user: str, cpu: float | None, peak: int | None) -> JobRecord:
    spec = JobSpec(command=("x",), cwd="/", gpus=1)
    return JobRecord(
        id=job_id,
        spec=spec,
        uid=1000,
        user=user,
        state=JobState.SUCCEEDED,
        submitted_at=NOW - 60,
        started_at=NOW - 50,
        ended_at=NOW - 10,
        gpus=(0,),
        cpu_seconds=cpu,
        peak_ram=peak,
    )


def test_the_report_sums_cpu_time_per_user_and_gives_the_largest_peak_never_a_sum_of_peaks() -> None:
    records = [record(1, "alice", 30.0, 2 << 30), record(2, "alice", 12.5, 5 << 30), record(3, "bob", 4.0, None)]
    report = build_report(records, gpu_count=1, now=NOW, since=3600)
    assert report.cpu_by_user == pytest.approx({"alice": 42.5, "bob": 4.0})
    assert report.peak_ram_by_user == {"alice": 5 << 30}
    header, rows = user_table(report)
    assert header == ("USER", "GPU-HOURS", "CPU TIME", "PEAK RAM")
    assert sorted(rows) == [("alice", "0.02", "42.5s", "5.0G"), ("bob", "0.01", "4.0s", "-")]
    header, rows = outcome_table(report)
    at = header.index("CPU TIME")
    assert header[at : at + 2] == ("CPU TIME", "PEAK RAM")
    assert [row[at : at + 2] for row in rows] == [("30.0s", "2.0G"), ("12.5s", "5.0G"), ("4.0s", "-")]


def test_the_report_claims_no_host_use_that_no_cgroup_measured() -> None:
    report = build_report([record(1, "alice", None, None)], gpu_count=1, now=NOW, since=3600)
    assert report.cpu_by_user == {} and report.peak_ram_by_user == {}
    assert user_table(report)[0] == ("USER", "GPU-HOURS")
    header, _ = outcome_table(report)
    assert "CPU TIME" not in header and "PEAK RAM" not in header and "PEAK MEM" in header  # GPU memory stays


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Gpuq]:
    home, work = tmp_path / "state dir", tmp_path / "work dir"
    work.mkdir()
    (work / "burn.py").write_text(BURN)
    client = Gpuq(home, make_env(home, "1x80GiB"), work)
    yield client
    client.cleanup()


def burner(queue: Gpuq, then: str = "") -> str:
    """A job whose setsid child burns 0.3 s of CPU: only its cgroup sees that time as the job's."""
    return script(queue, "burn.sh", f"setsid {sys.executable} burn.py & wait\ntouch burned\n{then}")


def memory_accounted(queue: Gpuq) -> bool:
    return "memory" in json.loads((queue.home / "gpus.json").read_text())["containment"]["controllers"]


def outcomes_of(page: str) -> dict[str, dict[str, str]]:
    """The HTML report's outcomes table: job id -> column -> cell."""
    table = page.split('<table id="outcomes">', 1)[1].split("</table>", 1)[0]
    header = re.findall(r"<th>(.*?)</th>", table)
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1])]
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows}


def by_user_of(page: str) -> dict[str, dict[str, str]]:
    table = page.split('<table id="by-user">', 1)[1].split("</table>", 1)[0]
    header = re.findall(r"<th>(.*?)</th>", table)
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1])]
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows}


@needs_cgroup2
def test_the_report_gives_each_jobs_host_cpu_time_and_each_users_sum(queue: Gpuq) -> None:
    jobs = [queue.submit(burner(queue)) for _ in range(2)]
    shown = [queue.wait_state(job, *DONE) for job in jobs]
    assert [r["state"] for r in shown] == ["succeeded", "succeeded"], shown
    assert all(r["cpu_seconds"] >= 0.3 for r in shown), shown
    page_file = queue.cwd / "report.html"
    text = queue.run("report", "--html", str(page_file)).stdout
    page = page_file.read_text()
    outcomes, users = outcomes_of(page), by_user_of(page)
    for job, r in zip(jobs, shown, strict=True):
        assert outcomes[str(job)]["CPU TIME"] == format_duration(r["cpu_seconds"])
        assert outcomes[str(job)].get("PEAK RAM") == (format_size(r["peak_ram"]) if memory_accounted(queue) else None)
    user = shown[0]["user"]
    assert users[user]["CPU TIME"] == format_duration(sum(r["cpu_seconds"] for r in shown))
    if memory_accounted(queue):
        assert users[user]["PEAK RAM"] == format_size(max(r["peak_ram"] for r in shown))
    else:
        assert "PEAK RAM" not in users[user] and all(r["peak_ram"] is None for r in shown)
    user_header = next(line for line in text.splitlines() if line.startswith("USER"))
    assert user_header.split()[:3] == ["USER", "GPU-HOURS", "CPU"]
    mine = next(line for line in text.splitlines() if line.startswith(f"{user} "))
    assert format_duration(sum(r["cpu_seconds"] for r in shown)) in mine.split()


@needs_cgroup2
def test_api_jobs_gives_a_running_jobs_cpu_time_so_far_and_metrics_count_every_jobs(queue: Gpuq) -> None:
    done = queue.submit(burner(queue))
    assert queue.wait_state(done, *DONE)["state"] == "succeeded"
    (queue.cwd / "burned").unlink()
    running = queue.submit(burner(queue, "exec sleep 300\n"))
    wait_for(lambda: (queue.cwd / "burned").exists(), 30, "the running job to burn its CPU")
    server = Served(queue)
    try:
        listed = server.json("/api/jobs")["running"]
        assert [j["id"] for j in listed] == [running] and listed[0]["cpu_seconds"] >= 0.3, listed
        me = (("user", queue.job(done)["user"]),)
        so_far = server.metrics()
        assert so_far[("gpuq_cpu_seconds_total", me)] >= queue.job(done)["cpu_seconds"] + 0.3
        queue.run("cancel", str(running))
        records = [queue.wait_state(job, *DONE) for job in (done, running)]
        found = server.metrics()
        assert found[("gpuq_cpu_seconds_total", me)] == pytest.approx(sum(r["cpu_seconds"] for r in records))
        assert found[("gpuq_cpu_seconds_total", me)] >= so_far[("gpuq_cpu_seconds_total", me)]  # a counter
        _check_peak_ram_histogram(queue, found, me, records)
    finally:
        server.close()


def _check_peak_ram_histogram(queue: Gpuq, found: dict[Any, float], me: Any, records: list[dict[str, Any]]) -> None:
    if not memory_accounted(queue):
        assert not any(name.startswith("gpuq_job_peak_ram_bytes") for name, _ in found)
        return
    assert found[("gpuq_job_peak_ram_bytes_count", me)] == len(records)
    assert found[("gpuq_job_peak_ram_bytes_sum", me)] == sum(r["peak_ram"] for r in records)


def test_under_the_fallback_no_host_cpu_time_is_claimed_anywhere(tmp_path: Path) -> None:
    """Without a cgroup nothing accounts a job's processes together: the report, /api/jobs and /metrics say
    nothing rather than a figure that would leave out every child that left the job's process tree."""
    home, work = tmp_path / "state dir", tmp_path / "work dir"
    work.mkdir()
    (work / "burn.py").write_text(BURN)
    queue = Gpuq(home, make_env(home, "1x80GiB", GPUQ_CONTAINMENT="fallback"), work)
    try:
        job = queue.submit(burner(queue))
        assert queue.wait_state(job, *DONE)["cpu_seconds"] is None
        page_file = queue.cwd / "report.html"
        queue.run("report", "--html", str(page_file))
        page = page_file.read_text()
        assert "CPU TIME" not in outcomes_of(page)[str(job)]
        assert "CPU TIME" not in by_user_of(page)[queue.job(job)["user"]]
        server = Served(queue)
        try:
            assert not any(name.startswith(("gpuq_cpu_seconds", "gpuq_job_peak_ram")) for name, _ in server.metrics())
        finally:
            server.close()
    finally:
        queue.cleanup()
