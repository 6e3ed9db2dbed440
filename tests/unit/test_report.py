"""The morning report: GPU-hours, idle time while work waited, clipping to the window, and a safe HTML page."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.views.report import build_report
from gpuq_scheduler.launcher.views.report_html import render_html
from gpuq_scheduler.launcher.views.report_text import render_text
from tests.conftest import REPORT, Gpuq

H = 3600.0
NOW = 1_700_000_000.0  # a fixed "now": the report is a pure function of the records and the clock


def job(
    job_id: int,
    *,
    user: str = "alice",
    state: JobState = JobState.SUCCEEDED,
    submitted: float = 0.0,
    started: float | None = None,
    ended: float | None = None,
    gpus: tuple[int, ...] = (),
    want: int | None = None,
    name: str = "",
    array: int | None = None,
    held: bool = False,
    **more: Any,
) -> JobRecord:
    """A record with times given in hours relative to NOW (negative: in the past)."""
    spec = JobSpec(command=("x",), cwd="/", gpus=len(gpus) if want is None else want, name=name)
    return JobRecord(
        id=job_id,
        spec=spec,
        uid=1000,
        user=user,
        state=state,
        submitted_at=NOW + submitted * H,
        started_at=None if started is None else NOW + started * H,
        ended_at=None if ended is None else NOW + ended * H,
        gpus=gpus,
        array_id=array,
        array_index=None if array is None else job_id,
        held=held,
        **more,
    )


def test_gpu_hours_are_gpus_times_running_time_by_user_and_by_array() -> None:
    records = [
        job(1, user="alice", submitted=-2, started=-2, ended=-1.5, gpus=(0, 1)),  # 2 GPUs x 30 min
        job(2, user="bob", submitted=-2, started=-2, ended=-1, gpus=(2,), array=7),  # 1 GPU x 1 h
        job(3, user="bob", submitted=-2, started=-1, ended=-0.5, gpus=(2,), array=7),  # 1 GPU x 30 min
        job(4, user="carol", submitted=-2, started=-2, ended=-1, gpus=()),  # a CPU job holds no GPU
    ]
    report = build_report(records, gpu_count=4, now=NOW, since=12 * H)
    assert report.gpu_hours_by_user == pytest.approx({"bob": 1.5, "alice": 1.0, "carol": 0.0})
    assert list(report.gpu_hours_by_user) == ["bob", "alice", "carol"]  # largest first
    assert report.gpu_hours_by_array == pytest.approx({7: 1.5})
    assert report.gpu_hours == pytest.approx(2.5)
    assert report.counts == {JobState.SUCCEEDED: 4}


def test_jobs_and_hours_are_clipped_to_the_window() -> None:
    records = [
        job(1, submitted=-15, started=-14, ended=-10, gpus=(0,)),  # 2 of its 4 hours fall in a 12 h window
        job(2, submitted=-20, started=-20, ended=-13, gpus=(1,)),  # ended before the window: left out
        job(3, state=JobState.RUNNING, submitted=-1, started=-0.5, gpus=(2, 3)),  # running: counts up to now
    ]
    report = build_report(records, gpu_count=4, now=NOW, since=12 * H)
    assert [row.id for row in report.rows] == [1, 3]
    assert report.gpu_hours_by_user == pytest.approx({"alice": 2.0 + 1.0})
    first = [s for s in report.segments if s.job_id == 1]
    assert [(s.gpu, s.start, s.end) for s in first] == [(0, NOW - 12 * H, NOW - 10 * H)]
    assert {(s.gpu, s.end) for s in report.segments if s.job_id == 3} == {(2, NOW), (3, NOW)}
    assert report.rows[0].runtime == pytest.approx(4 * H)  # the table shows the whole run, not the clipped part
    assert report.timeline_start == NOW - 12 * H


def test_idle_gpus_while_a_big_job_waits_are_counted() -> None:
    # 4 GPUs; job 1 holds one for an hour while job 2 waits for all four: 3 GPUs idle for an hour.
    records = [
        job(1, submitted=-3, started=-3, ended=-2, gpus=(0,)),
        job(2, submitted=-3, started=-2, ended=-1, gpus=(0, 1, 2, 3)),
    ]
    report = build_report(records, gpu_count=4, now=NOW, since=12 * H)
    assert report.idle_gpu_hours == pytest.approx(3.0)
    assert report.gpu_hours_by_user["alice"] == pytest.approx(1.0 + 4.0)


def test_no_idle_time_is_counted_when_nothing_waits() -> None:
    records = [
        job(1, submitted=-2, started=-2, ended=-1, gpus=(0,)),
        job(2, submitted=-1, started=-1, gpus=(1,), state=JobState.RUNNING),
    ]
    assert build_report(records, gpu_count=4, now=NOW, since=12 * H).idle_gpu_hours == 0.0


def test_idle_time_counts_still_pending_and_cancelled_waiters_but_not_held_or_cpu_jobs() -> None:
    records = [
        job(1, state=JobState.PENDING, submitted=-0.5, want=1),  # waiting now, 2 GPUs free for 30 min
        job(2, state=JobState.CANCELLED, submitted=-3, ended=-2.75, want=2),  # cancelled after 15 min of waiting
        job(3, state=JobState.PENDING, submitted=-6, want=1, held=True),  # held on purpose: not the GPUs' loss
        job(4, state=JobState.PENDING, submitted=-6, want=0),  # a CPU job waiting
    ]
    report = build_report(records, gpu_count=2, now=NOW, since=12 * H)
    assert report.idle_gpu_hours == pytest.approx(2 * 0.5 + 2 * 0.25)
    assert report.counts == {JobState.PENDING: 3, JobState.CANCELLED: 1}


def test_gpus_shared_by_mem_jobs_are_busy_once_and_the_waiter_is_clipped_to_the_window() -> None:
    records = [
        job(1, submitted=-30, started=-1, ended=0, gpus=(0,)),  # waited 29 h, 11 of them in the window
        job(2, submitted=-1, started=-1, ended=0, gpus=(1,)),
        job(3, submitted=-1, started=-1, ended=0, gpus=(1,)),  # --mem jobs sharing GPU 1
        job(4, state=JobState.PENDING, submitted=-1, want=3),
    ]
    report = build_report(records, gpu_count=3, now=NOW, since=12 * H)
    assert report.idle_gpu_hours == pytest.approx(3 * 11 + 1 * 1)


@st.composite
def schedules(draw: st.DrawFn) -> tuple[int, list[JobRecord]]:
    """Random histories on whole hours, so sampling the middle of each hour gives the exact idle time."""
    gpu_count = draw(st.integers(1, 4))
    records = []
    for job_id in range(1, draw(st.integers(0, 8)) + 1):
        submitted = draw(st.integers(-20, -1))
        kind = draw(st.sampled_from(["done", "running", "pending", "cancelled"]))
        gpus = tuple(sorted(draw(st.sets(st.integers(0, gpu_count - 1), min_size=0, max_size=gpu_count))))
        want = len(gpus) if kind in ("done", "running") else draw(st.integers(0, gpu_count))
        started = draw(st.integers(submitted, 0)) if kind in ("done", "running") else None
        ended = draw(st.integers(started, 0)) if kind == "done" and started is not None else None
        ended = draw(st.integers(submitted, 0)) if kind == "cancelled" else ended
        state = {
            "done": JobState.SUCCEEDED,
            "running": JobState.RUNNING,
            "pending": JobState.PENDING,
            "cancelled": JobState.CANCELLED,
        }[kind]
        records.append(
            job(
                job_id,
                state=state,
                submitted=submitted,
                started=started,
                ended=ended,
                gpus=gpus if started is not None else (),
                want=want,
            )
        )
    return gpu_count, records


@settings(max_examples=300, deadline=None)
@given(schedules(), st.integers(1, 24))
def test_idle_sweep_matches_sampling_every_hour(schedule: tuple[int, list[JobRecord]], since: int) -> None:
    gpu_count, records = schedule
    expected = 0.0
    for hour in range(-since, 0):
        t = NOW + (hour + 0.5) * H
        waiting = any(
            r.spec.gpus > 0 and r.submitted_at <= t and t < (r.started_at or r.ended_at or NOW) for r in records
        )
        busy = {
            g for r in records if r.started_at is not None and r.started_at <= t < (r.ended_at or NOW) for g in r.gpus
        }
        expected += (gpu_count - len(busy)) if waiting else 0
    report = build_report(records, gpu_count, now=NOW, since=since * H)
    assert report.idle_gpu_hours == pytest.approx(expected)


def test_text_report_has_the_headline_tables_and_idle_time() -> None:
    records = [
        job(1, name="seed1", submitted=-3, started=-3, ended=-2, gpus=(0,), exit_code=0, peak_mem=3 << 30),
        job(
            2,
            name="seed2",
            state=JobState.FAILED,
            submitted=-3,
            started=-2,
            ended=-1,
            gpus=(0, 1, 2, 3),
            exit_code=3,
            reason="exit code 3",
            array=5,
        ),
        job(
            3,
            user="bob",
            state=JobState.FAILED,
            submitted=-1,
            started=-1,
            ended=-0.9,
            gpus=(1,),
            signal=9,
            reason="killed by SIGKILL",
        ),
    ]
    text = render_text(build_report(records, gpu_count=4, now=NOW, since=12 * H))
    headline, usage, *_ = text.splitlines()
    assert "3 jobs, 1 succeeded, 2 failed" in headline and "(12h00m)" in headline
    assert "4 GPUs" in usage and "idle while work waited 3.00 GPU-hours" in usage
    assert re.search(r"^2\s+seed2\s+alice\s+5\[2\]\s+-\s+failed\s+3\s+1h00m\s+-\s+0,1,2,3\s+exit code 3$", text, re.M)
    assert re.search(r"^3\s+seed.*SIGKILL", text, re.M) is None  # job 3 has no name: it shows its command
    assert re.search(r"^3\s+x\s+bob\s+-\s+-\s+failed\s+SIGKILL\s", text, re.M)
    assert re.search(r"^1\s+seed1.*3\.0G", text, re.M)
    assert re.search(r"^alice\s+5\.00$", text, re.M) and re.search(r"^bob\s+0\.10$", text, re.M)
    assert re.search(r"^ARRAY\s+NAME\s+GPU-HOURS\n5\s+-\s+4\.00$", text, re.M)


def test_the_report_names_arrays_and_shows_each_members_own_arguments_failures_first() -> None:
    """The report showed members as 5[2], with neither the array's name nor what the member ran with."""
    sweep = JobSpec(command=("train.py", "--lr", "{lr}"), cwd="/", gpus=1, sweep=(("lr", ("1e-4", "1e-3")),))
    members = [
        JobRecord(
            id=6 + i,
            spec=sweep.member(i),
            uid=1000,
            user="alice",
            state=state,
            submitted_at=NOW - H,
            started_at=NOW - H,
            ended_at=NOW,
            gpus=(0,),
            array_id=5,
            array_index=i,
        )
        for i, state in enumerate((JobState.SUCCEEDED, JobState.FAILED))
    ]
    plain = job(1, submitted=-1, started=-1, ended=0, gpus=(1,))
    report = build_report([plain, *members], gpu_count=2, now=NOW, since=2 * H, array_names={5: "lr-sweep"})
    assert [row.id for row in report.rows] == [7, 1, 6]  # what did not succeed first
    text = render_text(report)
    assert re.search(r"^7\s+train\.py lr=1e-3\s+alice\s+lr-sweep 5\[1\]\s+lr=1e-3\s+failed\s", text, re.M), text
    assert re.search(r"^ARRAY\s+NAME\s+GPU-HOURS\n5\s+lr-sweep\s+2\.00$", text, re.M)
    assert "lr-sweep 5[0]" in render_html(report)


def test_an_empty_window_says_so() -> None:
    report = build_report([], gpu_count=2, now=NOW, since=12 * H)
    assert "0 jobs, 0 succeeded, 0 failed" in render_text(report)
    assert "no jobs in this window" in render_text(report)
    assert '<svg id="timeline"' in render_html(report)


def test_html_escapes_user_input_and_has_no_scripts() -> None:
    evil = "<script>alert(1)</script>"
    records = [
        job(
            1,
            name=evil,
            user='eve"><b>',
            state=JobState.FAILED,
            submitted=-1,
            started=-1,
            ended=-0.5,
            gpus=(0,),
            reason="</title><script>alert(2)</script>",
        )
    ]
    page = render_html(build_report(records, gpu_count=1, now=NOW, since=12 * H))
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'eve"><b>' not in page and "eve&quot;&gt;&lt;b&gt;" in page
    assert "</title><script>" not in page


def test_html_stands_alone() -> None:
    records = [job(1, submitted=-1, started=-1, ended=-0.5, gpus=(0,))]
    page = render_html(build_report(records, gpu_count=2, now=NOW, since=12 * H))
    assert re.findall(r"(?:https?|ftp):|//[a-z]", page, re.I) == []  # no URL at all, not even an SVG xmlns
    for loader in ("<script", "<link", "<img", "<iframe", "@import", "url(", "src="):
        assert loader not in page.lower()
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_html_timeline_has_a_lane_per_gpu_and_a_rect_per_job_gpu() -> None:
    records = [
        job(17, name="seed3", submitted=-2, started=-2, ended=-1, gpus=(0, 2)),
        job(18, state=JobState.RUNNING, submitted=-1, started=-1, gpus=(1,)),
    ]
    page = render_html(build_report(records, gpu_count=3, now=NOW, since=3 * H))
    assert '<svg id="timeline"' in page
    assert [f"GPU {g}" for g in range(3)] == re.findall(r'class="lane-label"[^>]*>(GPU \d+)<', page)
    rects = re.findall(r'<rect class="job state-(\w+)" data-job="(\d+)" data-gpu="(\d+)"', page)
    assert sorted(rects) == [("running", "18", "1"), ("succeeded", "17", "0"), ("succeeded", "17", "2")]
    clock = time.strftime("%H:%M", time.localtime(NOW - 2 * H))
    assert f"<title>job 17 seed3 (alice) {clock}-" in page and " succeeded</title>" in page
    assert len(re.findall(r'class="tick"', page)) >= 3
    assert re.search(r'class="job-label"[^>]*>17<', page)


def test_report_from_a_real_daemon_run(gpuq: Gpuq) -> None:
    out = str(gpuq.cwd / "r.jsonl")
    pair = gpuq.submit("--gpus", "2", "--name", "pair", str(REPORT), out, "0.5")
    bad = gpuq.submit("--gpus", "1", "--name", "bad", str(REPORT), out, "0.2", "3")
    cpu = gpuq.submit("--gpus", "0", str(REPORT), out, "0.1")
    big = gpuq.submit("--gpus", "4", "--name", "big", str(REPORT), out, "0.3")
    gpuq.run("wait", check=False)  # exits 1: one job failed on purpose
    queue = Queue(StateDir(gpuq.home))
    inventory = queue.inventory()
    assert inventory is not None
    report = build_report(queue.records(), len(inventory.totals), now=time.time(), since=H)

    states = {row.id: (row.state, row.exit) for row in report.rows}
    assert states == {
        pair: (JobState.SUCCEEDED, "0"),
        bad: (JobState.FAILED, "3"),
        cpu: (JobState.SUCCEEDED, "0"),
        big: (JobState.SUCCEEDED, "0"),
    }
    assert report.gpu_count == 4
    by_job = {s.job_id: s for s in report.segments}
    assert cpu not in by_job and {pair, bad, big} <= set(by_job)
    assert sorted(s.gpu for s in report.segments if s.job_id == big) == [0, 1, 2, 3]
    # 2 GPUs x ~0.5 s + 1 x ~0.2 s + 4 x ~0.3 s of GPU time, give or take process start-up.
    assert 2.0 / H < report.gpu_hours < 60.0 / H
    user = next(iter(report.gpu_hours_by_user))
    text = render_text(report)
    assert "4 jobs, 3 succeeded, 1 failed" in text and user in text
    page = render_html(report)
    assert page.count('class="lane-label"') == 4 and f'data-job="{big}"' in page


def test_the_report_tells_packings_payoff_and_who_was_stopped_at_a_fence() -> None:
    gib = 1 << 30

    def packed(job_id: int, share: int, **more: Any) -> JobRecord:
        record = job(job_id, **more)
        return record.replace(spec=JobSpec(command=("x",), cwd="/", gpus=len(record.gpus), mem_per_gpu=share))

    alice = [packed(i, 7 * gib, submitted=-1, started=-1, ended=0, gpus=(0,), array=10) for i in range(1, 5)]
    stopped = packed(
        5,
        3 * gib,
        user="bob",
        state=JobState.FAILED,
        submitted=-1,
        started=-1,
        ended=-59 / 60,
        gpus=(1,),
        reason="CUDA out of memory at its 3.0G share (--mem 3.0G) (exit code 1)",
        cause=Cause.OOM_PAST_SHARE,
    )
    # Counted by its cause: a job that printed those words and exited 1 was not stopped at a fence.
    printed = packed(
        7,
        3 * gib,
        user="bob",
        state=JobState.FAILED,
        submitted=-1,
        started=-1,
        ended=-59 / 60,
        gpus=(1,),
        reason=stopped.reason,
        cause=Cause.EXIT_CODE,
    )
    whole = job(6, user="bob", submitted=-1, started=-0.5, ended=0, gpus=(1,))
    report = build_report([*alice, stopped, printed, whole], 2, now=NOW, totals=(80 * gib, 80 * gib), overhead=1 * gib)
    assert report.saved_by_user["alice"] == pytest.approx(4 * 0.9)  # each held 8 of 80 GiB for an hour
    assert report.saved_by_array == pytest.approx({10: 3.6})
    assert report.saved_by_user["bob"] == pytest.approx(2 * (1 - 4 / 80) / 60)  # two minutes at 4 of 80 GiB
    assert report.fenced_by_user == {"bob": 1} and report.fenced_by_array == {}
    text = render_text(report)
    assert "packing saved 3.63 GPU-hours against whole GPUs; 1 job(s) stopped at their fence" in text
    assert "array 10" in text and "user bob" in text
    page = render_html(report)
    assert '<table id="packing">' in page and "<td>user bob</td><td>0.03</td><td>1</td>" in page
    assert "<b>3.63</b>GPU-hours saved by packing" in page
