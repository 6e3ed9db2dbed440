"""A victim preempted where it cannot be suspended, requeued (#28): it gets its place in the queue back, as a
suspended victim resumes before the jobs submitted after it. A real daemon on the fake inventory."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import counted, wait_for
from tests.test_preemption import _events, _never_double_booked, _requeue_queue


def test_a_requeued_victim_gets_its_place_back_ahead_of_jobs_submitted_after_it(tmp_path: Path) -> None:
    """One GPU. A preemptible job that cannot be suspended is requeued for an urgent one; a job of its own
    priority submitted meanwhile (preemptible too: a job that is not may preempt it by itself) waits behind
    it: once the urgent job ended, the victim runs first, as a suspended victim would resume first (not held
    back by the retries' backoff, which is for failures)."""
    queue = _requeue_queue(tmp_path, GPUQ_RETRY_BACKOFF="30")
    try:
        counts = queue.cwd / "counts"
        victim = queue.submit("--preemptible", "fake_preemptible.py", "60", str(counts), "200")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(victim)["peak_mem"], 30, "the job to count")
        urgent = queue.submit("--priority", "10", "fake_cuda.py", "70", "2")
        queue.wait_state(urgent, "running", timeout=60)
        later = queue.submit("--preemptible", "fake_cuda.py", "70", "0.5")
        assert queue.wait_state(later, "succeeded", "failed", timeout=90)["state"] == "succeeded"
        assert queue.wait_state(victim, "succeeded", "failed", timeout=90)["state"] == "succeeded"
        assert counted(counts) == list(range(1, 201))
        starts = [(e["job"], e["t"]) for e in _events(queue) if e.get("event") == "started"]
        assert [job for job, _ in starts] == [victim, urgent, victim, later]
        _never_double_booked(_events(queue))
    finally:
        queue.cleanup()
