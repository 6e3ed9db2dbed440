"""Reservations (#42) with real daemons on the fake inventory: the CLI's errors, backfill before the start,
the start with running preemptible and non-preemptible work, a restart in the middle, cancel, idle release."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.conftest import Gpuq, counted, fake_cuda_queue, wait_for

COUNTER = Path(__file__).parent / "fixtures" / "fake_counter.py"


def _queue(tmp_path: Path, gpus: str | list[dict[str, Any]] = "2x80GiB", **extra: str) -> Gpuq:
    queue = fake_cuda_queue(tmp_path, gpus, **{"GPUQ_FAKE_HOST_MEMORY": "256GiB", **extra})
    shutil.copy(COUNTER, queue.cwd / "fake_counter.py")
    return queue


def _events(queue: Gpuq) -> list[dict[str, Any]]:
    path = queue.home / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _listed(queue: Gpuq) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in json.loads(queue.run("reserve", "--list", "--json").stdout)}


def test_a_start_gpuq_cannot_read_is_one_line_exit_2_and_nothing_is_asked(gpuq: Gpuq) -> None:
    for start, words in (
        ("09:99", "no such time of day"),
        ("next week", "cannot read --start"),
        ("2020-01-01 10:00", "is in the past"),
    ):
        result = gpuq.run("reserve", "--gpus", "2", "--start", start, "--duration", "3h", check=False)
        assert result.returncode == 2 and words in result.stderr and result.stderr.count("\n") == 1
    for args, words in (
        (["--gpus", "2", "--start", "+1h"], "needs --gpus N, --start WHEN and --duration"),
        (["--gpus", "2", "--start", "+1h", "--duration", "0s"], "--duration"),
        (["--list", "--cancel", "x"], "give --list, --cancel NAME, or"),
        (["--gpus", "1", "--start", "now", "--duration", "1h", "--name", "../x"], "reservation name"),
    ):
        result = gpuq.run("reserve", *args, check=False)
        assert result.returncode == 2 and words in result.stderr and result.stderr.count("\n") == 1
    assert not (gpuq.home / "reservations.json").exists()
    spool = gpuq.home / "spool"
    assert not spool.exists() or not [p for p in spool.iterdir() if p.name.startswith("control-")]


def test_the_daemon_refuses_what_only_it_can_check_in_one_line(gpuq: Gpuq) -> None:
    made = gpuq.run("reserve", "--gpus", "3", "--start", "+1h", "--duration", "2h", "--name", "first")
    assert "reserved GPUs 0-2 for " in made.stdout and "as first" in made.stdout
    for args, words in (
        (["--gpus", "2"], "only 1 GPU(s) are free of other reservations"),
        (["--gpus", "9"], "this machine has 4 usable GPU(s)"),
        (["--gpus", "1", "--name", "first"], "a reservation named first exists"),
    ):
        result = gpuq.run("reserve", *args, "--start", "+90m", "--duration", "1h", check=False)
        assert result.returncode == 2 and words in result.stderr and result.stderr.count("\n") == 1
    assert list(_listed(gpuq)) == ["first"]


def test_before_the_start_only_work_that_ends_in_time_backfills_the_reserved_gpu(tmp_path: Path) -> None:
    queue = _queue(tmp_path)
    try:
        made = queue.run("reserve", "--gpus", "1", "--start", "+1h", "--duration", "2h", "--name", "later")
        assert "reserved GPU 0 for " in made.stdout
        endless = queue.submit("fake_cuda.py", "1", "600")
        assert queue.wait_state(endless, "running")["gpus"] == [1]  # not GPU 0: it would still be there at the start
        second = queue.submit("fake_cuda.py", "1", "600")
        short = queue.submit("--time", "10m", "fake_cuda.py", "1", "600")
        assert queue.wait_state(short, "running")["gpus"] == [0]  # ends before the start: it backfills
        reason = wait_for(lambda: queue.job(second)["reason"], 30, "a reason")
        assert reason.startswith("GPU 0 is reserved for ") and " from " in reason
        assert queue.job(second)["state"] == "pending"
        queue.run("reserve", "--cancel", "later")  # cancelled: nothing bars GPU 0 once the short job is gone
        queue.run("cancel", str(short))
        assert queue.wait_state(second, "running")["gpus"] == [0]
        assert _listed(queue)["later"]["ended"].startswith("cancelled by ")
    finally:
        queue.cleanup()


def test_at_the_start_the_preemptible_job_steps_aside_and_the_rest_was_said_ahead(tmp_path: Path) -> None:
    """Two GPUs: a preemptible counter on one, a job that is not preemptible (no time limit) on the other. A
    reservation of both from two seconds on: its owner is told at once that the second will still be there;
    at the start the counter is suspended, the owner's job runs in its place, a stranger's job waits; the
    daemon is killed and restarted in the middle; cancelled, the reservation lets the counter resume and
    finish its count intact."""
    queue = _queue(tmp_path)
    try:
        counts = queue.cwd / "counts"
        counter = queue.submit("--preemptible", "fake_counter.py", "60", str(counts), "3000")
        steady = queue.submit("fake_cuda.py", "10", "900")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(counter)["peak_mem"], 30, "the counter to count")
        queue.wait_state(steady, "running")
        made = queue.run("reserve", "--gpus", "2", "--start", "+2s", "--duration", "1h", "--name", "deadline")
        steady_gpu = queue.job(steady)["gpus"][0]
        assert f"note: job {steady} (" in made.stdout
        assert f"not --preemptible) will still hold GPU {steady_gpu}" in made.stdout
        assert "it has no time limit" in made.stdout
        suspended = queue.wait_state(counter, "suspended", timeout=60)
        assert suspended["reason"].startswith("suspended for reservation deadline (")
        assert queue.job(steady)["state"] == "running"  # not preemptible: it stays, as its owner was told
        mine = queue.submit("--reservation", "deadline", "fake_cuda.py", "70", "1")
        stranger = queue.submit("--time", "1m", "fake_cuda.py", "1", "1")
        assert queue.wait_state(mine, "succeeded", "failed")["state"] == "succeeded"
        assert queue.job(mine)["gpus"] == suspended["gpus"]  # in the counter's place
        reason = wait_for(lambda: queue.job(stranger)["reason"], 30, "the stranger's reason")
        assert "are reserved for " in reason and " until " in reason and queue.job(stranger)["state"] == "pending"
        # A restart in the middle: the calendar and the victim's place survive it.
        queue.kill_daemon()
        queue.run("daemon", "start")
        probe = queue.submit("--gpus", "0", "true")
        assert queue.wait_state(probe, "succeeded")["state"] == "succeeded"  # the new daemon has made passes
        assert queue.job(counter)["state"] == "suspended" and "deadline" in _listed(queue)
        assert queue.job(stranger)["state"] == "pending"
        queue.run("reserve", "--cancel", "deadline")
        assert queue.wait_state(counter, "succeeded", "failed", timeout=120)["state"] == "succeeded"
        assert counted(counts) == list(range(1, 3001))  # stopped where it was, went on from there
        assert queue.wait_state(stranger, "succeeded", "failed")["state"] == "succeeded"
        events = _events(queue)
        kinds = [e["event"] for e in events if e.get("job") == counter]
        assert kinds.index("preempted") < kinds.index("suspended") < kinds.index("resumed")
        said = [e for e in events if e.get("event") == "reserved"]
        assert said and said[0]["said"]
        started = next(e["t"] for e in events if e.get("job") == mine and e["event"] == "started")
        suspended_at = next(e["t"] for e in events if e.get("job") == counter and e["event"] == "suspended")
        assert suspended_at <= started
    finally:
        queue.cleanup()


def test_an_unused_reservation_is_released_after_the_idle_time_and_its_owner_reads_why(tmp_path: Path) -> None:
    queue = _queue(tmp_path, "1x80GiB", GPUQ_RESERVATION_IDLE="2s")
    try:
        queue.run("reserve", "--gpus", "1", "--start", "now", "--duration", "1h", "--name", "idle")
        waiting = queue.submit("fake_cuda.py", "1", "1")
        assert queue.wait_state(waiting, "succeeded", timeout=60)["state"] == "succeeded"  # once it was released
        ended = _listed(queue)["idle"]
        assert ended["ended"] == "released: no job ran in it for 2.0s"
        assert "released: no job ran in it for 2.0s" in queue.run("reserve", "--list").stdout
        said = queue.run("status").stderr  # its owner reads it in `gpuq status`
        assert "note: your reservation idle ended at " in said and ": released: no job ran in it for 2.0s" in said
        assert any(e.get("event") == "reservation-ended" and e["name"] == "idle" for e in _events(queue))
    finally:
        queue.cleanup()


def test_status_top_and_the_dashboard_show_reservations_now_and_to_come(gpuq: Gpuq) -> None:
    from gpuq_scheduler.jobs.store.queue import Queue
    from gpuq_scheduler.jobs.store.statedir import StateDir
    from gpuq_scheduler.launcher.gpus.sources import open_source
    from gpuq_scheduler.launcher.views import live
    from gpuq_scheduler.launcher.views.serve import Dashboard

    gpuq.run("reserve", "--gpus", "2", "--start", "now", "--duration", "2h", "--name", "now")
    gpuq.run("reserve", "--gpus", "1", "--start", "+1h", "--duration", "1h", "--name", "later")
    status = gpuq.run("status")
    line = next(text for text in status.stderr.splitlines() if text.startswith("reservations: "))
    assert "now (" in line and "GPUs 0,1) on until " in line and "later (" in line and "GPU 2) from " in line
    source = open_source(gpuq.env)
    try:
        queue = Queue(StateDir(gpuq.home))
        picture = live.take(queue, source)
        summary = live.summary(picture, "id", False)
        assert "\nreservation now (" in summary and "\nreservation later (" in summary
        page = Dashboard(queue, source).page(picture)
    finally:
        source.close()
    assert page.count('<rect class="reservation"') == 3  # GPUs 0 and 1 now, GPU 2 from an hour on
    assert 'id="reservations"' in page and "reserved: later (" in page


def test_a_preemptible_job_that_cannot_be_suspended_is_requeued_at_the_start_and_runs_after(tmp_path: Path) -> None:
    """Its 60 GiB would not fit in the host's 1 GiB: at the start it is signalled and requeued (as preemption
    does), waits while the reservation is on, and runs again once it is cancelled."""
    queue = _queue(tmp_path, "1x80GiB", GPUQ_FAKE_HOST_MEMORY="1GiB")
    try:
        counts = queue.cwd / "counts"
        job = queue.submit("--preemptible", "fake_counter.py", "60", str(counts), "100000")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count")
        queue.run("reserve", "--gpus", "1", "--start", "+1s", "--duration", "1h", "--name", "r")
        queue.wait_state(job, "pending", timeout=60)
        preempted = [e for e in _events(queue) if e.get("job") == job and e.get("event") == "preempted"]
        assert preempted and "would not fit in the host" in preempted[0]["requeue"]
        assert "requeued" in [e["event"] for e in _events(queue) if e.get("job") == job]
        reason = wait_for(lambda: "GPU 0 is reserved for " in (why := queue.job(job)["reason"]) and why, 30, "why")
        assert " until " in reason and queue.job(job)["state"] == "pending"
        queue.run("reserve", "--cancel", "r")
        queue.wait_state(job, "running")
        queue.run("cancel", str(job))
    finally:
        queue.cleanup()


def test_a_gpu_of_a_reservation_lost_ahead_of_its_start_is_said_to_its_owner_when_it_is_known(tmp_path: Path) -> None:
    queue = _queue(tmp_path, [{"total": "80GiB"}, {"total": "80GiB"}])
    try:
        queue.run("reserve", "--gpus", "2", "--start", "+1h", "--duration", "1h", "--name", "later")
        assert _listed(queue)["later"]["said"] == []
        inventory = tmp_path / "gpus.json"
        inventory.write_text(json.dumps({"gpus": [{"total": "80GiB"}, {"total": "80GiB", "lost": True}]}))
        said = wait_for(lambda: _listed(queue)["later"]["said"], 30, "the owner told")
        assert said == ["GPU 1 is gone from this machine (lost or removed)"]
        assert "note: your reservation later: GPU 1 is gone from this machine" in queue.run("status").stderr
        assert any(e.get("event") == "reservation-warning" for e in _events(queue))
    finally:
        queue.cleanup()


def test_a_victim_keeps_its_place_when_its_reservation_ends_while_the_owners_job_runs_on(tmp_path: Path) -> None:
    """One GPU: the counter is suspended for the reservation; the owner's 10 GiB job runs in it; the
    reservation is cancelled while that job runs on. A stranger's 30 GiB job would fit beside the owner's
    were the counter's place not kept: it waits, and starts only after the counter resumed (and ended)."""
    queue = _queue(tmp_path, "1x80GiB")
    try:
        counts = queue.cwd / "counts"
        counter = queue.submit("--preemptible", "fake_counter.py", "60", str(counts), "1500")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(counter)["peak_mem"], 30, "the counter to count")
        queue.run("reserve", "--gpus", "1", "--start", "+1s", "--duration", "1h", "--name", "r")
        queue.wait_state(counter, "suspended", timeout=60)
        owner = queue.submit("--reservation", "r", "--mem", "10G", "fake_cuda.py", "10", "600")
        queue.wait_state(owner, "running")
        queue.run("reserve", "--cancel", "r")
        wait_for(lambda: _listed(queue)["r"]["ended"], 30, "the cancel")
        stranger = queue.submit("--mem", "30G", "fake_cuda.py", "30", "1")
        wait_for(lambda: queue.job(stranger)["reason"], 30, "the stranger placed or told why")
        assert queue.job(stranger)["state"] == "pending" and queue.job(counter)["state"] == "suspended"
        queue.run("cancel", str(owner))
        assert queue.wait_state(counter, "succeeded", "failed", timeout=120)["state"] == "succeeded"
        assert counted(counts) == list(range(1, 1501))
        assert queue.wait_state(stranger, "succeeded", "failed")["state"] == "succeeded"
        events = _events(queue)
        resumed = next(e["t"] for e in events if e.get("job") == counter and e["event"] == "resuming")
        started = next(e["t"] for e in events if e.get("job") == stranger and e["event"] == "started")
        assert resumed < started
    finally:
        queue.cleanup()
