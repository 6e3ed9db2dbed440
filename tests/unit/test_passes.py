"""A real scheduler's pass, on a real job table and state directory, where what it must keep is not on disk.

A pass that fails is rolled back: the table forgets what it did, and the daemon reads its live jobs back from the
table (``Scheduler.reload``). What the table never held must come through that: a job's marks (how often it was
preempted, a resume asked for) stay with it while it is live, and a job gpuq is stopping is still ending, with
the outcome it gets (issue 41, part 1: the decision that let those maps move onto the lives). And a job a pass
cannot start ends with its end in events.jsonl."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.launcher.daemon.lives import EndingLife, Phase
from gpuq_scheduler.launcher.daemon.scheduler import Scheduler
from gpuq_scheduler.launcher.gpus.fake import FakeGpus

RUNNING, WAITING = 1, 2


def _record(job_id: int) -> JobRecord:
    spec = JobSpec(command=("true",), cwd="/tmp", env={"PATH": "/usr/bin:/bin"}, gpus=1)
    return JobRecord(id=job_id, spec=spec, uid=os.getuid(), user="me", state=JobState.PENDING, submitted_at=0.0, log="")


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[Scheduler]:
    """A real scheduler on two fake GPUs: job 1 running on GPU 0 (started by an earlier daemon of this boot),
    job 2 waiting."""
    state = StateDir(tmp_path / "home")
    state.ensure()
    table = JobTable(state.db, create=True)
    table.insert_pending([_record(RUNNING), _record(WAITING)])
    table.close()
    scheduler = Scheduler(state, FakeGpus("2x80GiB"))
    launch = Launch(shim_pid=0, shim_start=None, boot_id=scheduler.boot_id, port=None)
    scheduler.table.mark_running(RUNNING, (0,), ("GPU-0",), 0.0, launch)
    scheduler.load_lives()
    try:
        yield scheduler
    finally:
        scheduler.after_commit, scheduler.on_rollback = [], []
        for job_id in list(scheduler.lives.running):
            scheduler.lives.end(job_id)
        scheduler.close()


def _fails() -> None:
    raise RuntimeError("a step failed")


def test_a_pass_rolled_back_keeps_the_marks_and_the_stops_of_the_jobs_still_live(scheduler: Scheduler) -> None:
    assert RUNNING in scheduler.running and WAITING in scheduler.pending
    scheduler.lives.marks(RUNNING).preemptions = 3
    scheduler.lives.marks(WAITING).no_handoff = True
    lost = Outcome.gpu_lost("GPU 0 was lost")
    scheduler.lives.stop(RUNNING, lost)  # signalled already: a rollback cannot take that back
    with pytest.raises(RuntimeError, match="a step failed"):
        scheduler._transaction(_fails)
    life = scheduler.lives.get(RUNNING)
    assert isinstance(life, EndingLife) and life.outcome is lost and scheduler.stopped_for == {RUNNING: lost}
    assert scheduler.lives.marks(RUNNING).preemptions == 3
    assert scheduler.lives.marks(WAITING).no_handoff


def test_a_stop_its_own_pass_takes_back_is_gone_after_the_rollback(scheduler: Scheduler) -> None:
    """A requeued victim's stop is sent only once its pass is committed: the pass failing takes it back
    (``preempting._requeue``'s undo), and the job runs on."""

    def stop_then_fail() -> None:
        scheduler.lives.stop(RUNNING, Outcome.preempted(WAITING, "priority 10 > 0"))
        scheduler.on_rollback.append(lambda: scheduler.lives.unstop(RUNNING))
        _fails()

    with pytest.raises(RuntimeError):
        scheduler._transaction(stop_then_fail)
    assert scheduler.lives.phase(RUNNING) is Phase.RUNNING and not scheduler.stopped_for


def test_a_job_the_rolled_back_table_no_longer_holds_live_takes_its_marks_with_it(scheduler: Scheduler) -> None:
    scheduler.lives.marks(WAITING).preemptions = 1
    scheduler.table.finish(WAITING, Outcome.cancelled("me"), 1.0)  # committed: it ended
    with pytest.raises(RuntimeError):
        scheduler._transaction(_fails)
    assert WAITING not in scheduler.lives and scheduler.lives.peek(WAITING) is None


def test_a_job_the_daemon_cannot_start_ends_failed_to_spawn_and_its_end_is_journalled(scheduler: Scheduler) -> None:
    """A launch refused before any fork (here its --ram, which no controller here enforces) ends the job; its
    ``ended`` event was written to a list nobody kept, so events.jsonl never said how it ended."""
    record = scheduler.pending[WAITING]
    asked = record.replace(spec=dataclasses.replace(record.spec, ram=1 << 30))
    scheduler.lives.update(asked)
    if not scheduler.unenforceable(asked.spec):
        pytest.skip("this host's daemon enforces --ram")
    scheduler._transaction(lambda: scheduler._launch(asked, (1,), ("GPU-1",), 5.0))
    row = scheduler.table.get(WAITING)
    assert row is not None and row.state is JobState.FAILED and row.reason.startswith("could not start: --ram")
    ended = [json.loads(line) for line in scheduler.state.events.read_text().splitlines()]
    assert [(e["event"], e["job"]) for e in ended if e.get("job") == WAITING] == [("failed", WAITING)]
