"""What suspending and preemption cost each job and user (launcher/views/suspend_costs.py): counted from the
journal's events and the records, shown by `gpuq show`, `gpuq report` and /metrics. Plain values here; the
real daemon's journal is checked in tests/test_preemption.py."""

from __future__ import annotations

from pathlib import Path

from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.events import Preempted, Resumed, Started, Suspended
from gpuq_scheduler.launcher.views.live import Picture
from gpuq_scheduler.launcher.views.metrics import exposition
from gpuq_scheduler.launcher.views.report import build_report
from gpuq_scheduler.launcher.views.report_html import render_html
from gpuq_scheduler.launcher.views.report_text import render_text
from gpuq_scheduler.launcher.views.suspend_costs import Moves, by_user, from_events, of_job

GiB = 1 << 30
NOW = 1_700_000_000.0


def _record(job_id: int, user: str, state: JobState = JobState.SUCCEEDED, **more: object) -> JobRecord:
    spec = JobSpec(command=("x",), cwd="/")
    return JobRecord(
        id=job_id,
        spec=spec,
        uid=1000,
        user=user,
        state=state,
        submitted_at=NOW - 3600,
        started_at=NOW - 3000,
        ended_at=None if state is not JobState.SUCCEEDED else NOW - 60,
        gpus=(0,),
        **more,  # type: ignore[arg-type]
    )


EVENTS = [
    Preempted(1.0, 1, "priority 10 > 0", preemptor=3),
    Suspended(2.0, 1, 40 * GiB),
    Resumed(3.0, 1),
    Suspended(4.0, 2, 10 * GiB),  # a `gpuq suspend` by hand
    # A suspend the driver refused, then the requeue: one preemption, requeued.
    Preempted(5.0, 4, "job 4 is --preemptible", preemptor=3),
    Preempted(6.0, 4, "job 4 is --preemptible", preemptor=3, requeue="MPS"),
    Started(8.0, 5, (0,)),
]


def test_preemptions_suspends_and_bytes_are_counted_per_job_from_the_journal() -> None:
    moves = from_events(EVENTS)
    assert moves[1] == Moves(preemptions=1, suspends=1, bytes=40 * GiB)
    assert moves[2] == Moves(suspends=1, bytes=10 * GiB)
    assert moves[4] == Moves(preemptions=1, requeues=1)
    assert 5 not in moves


def test_time_suspended_comes_from_the_record_so_far_while_suspended() -> None:
    moves = from_events(EVENTS)
    done = _record(1, "alice", suspended_for=120.0)
    assert of_job(done, moves, NOW).seconds == 120.0
    now_suspended = _record(2, "bob", JobState.SUSPENDED, suspended_for=30.0, suspended_at=NOW - 60)
    assert of_job(now_suspended, moves, NOW) == Moves(suspends=1, bytes=10 * GiB, seconds=90.0)
    assert of_job(done, moves, NOW).text() == "preempted once; suspended once, 40.0G moved, 2m00s suspended"


def test_the_report_and_metrics_count_them_per_user() -> None:
    records = [
        _record(1, "alice", suspended_for=120.0),
        _record(2, "bob", JobState.SUSPENDED, suspended_for=30.0, suspended_at=NOW - 60),
        _record(4, "alice"),
        _record(6, "carol"),  # never suspended: not listed
    ]
    moves = from_events(EVENTS)
    users = by_user(records, moves, NOW)
    assert users == {
        "alice": Moves(preemptions=2, requeues=1, suspends=1, bytes=40 * GiB, seconds=120.0),
        "bob": Moves(suspends=1, bytes=10 * GiB, seconds=90.0),
    }
    text = render_text(build_report(records, 1, NOW, since=7200, moves=moves))
    assert "USER   PREEMPTED  REQUEUED  SUSPENDS  MOVED  SUSPENDED" in text
    picture = Picture(NOW, [], [], [], {}, False)
    scraped = exposition(lambda: picture, lambda: records, lambda: moves)().decode()
    assert 'gpuq_preemptions_total{user="alice"} 2.0' in scraped
    assert 'gpuq_suspend_bytes_total{user="alice"} 4.294967296e+10' in scraped
    assert 'gpuq_suspended_seconds_total{user="bob"} 90.0' in scraped
    assert 'gpuq_suspends_total{user="carol"}' not in scraped


def test_the_html_report_has_the_table_per_user_and_per_job() -> None:
    records = [
        _record(1, "alice", suspended_for=120.0),
        _record(2, "<b>bob</b>", JobState.SUSPENDED, suspended_for=30.0, suspended_at=NOW - 60),
        _record(4, "alice"),
        _record(6, "carol"),  # never suspended: in neither table
    ]
    report = build_report(records, 1, NOW, since=7200, moves=from_events(EVENTS))
    page = render_html(report)
    by_user = page[page.index('<table id="suspensions-by-user">') :].split("</table>")[0]
    header = "<th>USER</th><th>PREEMPTED</th><th>REQUEUED</th><th>SUSPENDS</th><th>MOVED</th><th>SUSPENDED</th>"
    assert header in by_user
    assert "<tr><td>alice</td><td>2</td><td>1</td><td>1</td><td>40.0G</td><td>2m00s</td></tr>" in by_user
    assert (
        "<tr><td>&lt;b&gt;bob&lt;/b&gt;</td><td>0</td><td>0</td><td>1</td><td>10.0G</td><td>1m30s</td></tr>" in by_user
    )
    assert "carol" not in by_user
    by_job = page[page.index('<table id="suspensions-by-job">') :].split("</table>")[0]
    assert by_job.count("<tr><td>") == 3
    assert (
        "<tr><td>1</td><td>x</td><td>alice</td><td>1</td><td>0</td><td>1</td><td>40.0G</td><td>2m00s</td></tr>"
        in by_job
    )
    assert "<tr><td>4</td><td>x</td><td>alice</td><td>1</td><td>1</td><td>0</td><td>0B</td><td>0.0s</td></tr>" in by_job
    assert "<td>6</td>" not in by_job
    quiet = render_html(build_report([_record(6, "carol")], 1, NOW, since=7200, moves={}))
    assert '<p id="suspensions-by-user" class="empty">none</p>' in quiet


def test_without_the_journal_show_says_the_time_suspended_alone() -> None:
    assert Moves(seconds=75.0).text() == "1m15s suspended"
    assert Moves(suspends=2, bytes=2 * GiB).text() == "suspended 2 times, 2.0G moved"


def test_the_journal_is_read_for_the_kinds_and_job_asked(tmp_path: Path) -> None:
    from gpuq_scheduler.jobs.store import journal
    from gpuq_scheduler.launcher.views.suspend_costs import read

    path = tmp_path / "events.jsonl"
    journal.append(path, EVENTS)
    with path.open("ab") as handle:
        handle.write(b'{"t": 7.0, "job": "junk", "event": "suspended"}\n')  # not an event: left out
        handle.write(b'{"t": 9.0, "job": 1, "event": "suspe')  # a torn last line (a crash mid-write)
    assert read(path) == from_events(EVENTS)
    assert read(path, job=1) == {1: Moves(preemptions=1, suspends=1, bytes=40 * GiB)}
    assert read(path, job=10) == {} and read(tmp_path / "none.jsonl") == {}
