"""One typed life per live job (issue 41, part 1): each phase carries its own data, the moves a phase does not
allow are refused, a job's end is one removal, and the indexes the steps read follow the moves."""

from __future__ import annotations

import os

import pytest

from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState, Step
from gpuq_scheduler.launcher.daemon.lives import (
    Acting,
    ImpossibleMove,
    Lives,
    Pending,
    Phase,
    ResumingLife,
    Running,
    RunningLife,
    Staged,
    StagedLife,
    SuspendedLife,
    SuspendingLife,
)
from gpuq_scheduler.launcher.daemon.tracked import Changes


def _record(job_id: int, **fields: object) -> JobRecord:
    spec = JobSpec(command=("true",), cwd="/tmp", env={"PATH": "/usr/bin:/bin"})
    return JobRecord(
        id=job_id, spec=spec, uid=os.getuid(), user="me", state=JobState.PENDING, submitted_at=0.0, log="", **fields
    )  # type: ignore[arg-type]


def _running(job_id: int) -> Running:
    record = _record(job_id).replace(state=JobState.RUNNING, gpus=(0,))
    return Running(record, Launch(shim_pid=1, shim_start=1.0, boot_id="boot"))


SUSPEND, RESUME = Acting(Step.SUSPENDING, "me", action="suspend"), Acting(Step.RESUMING, "me", action="resume")


def _views(lives: Lives) -> tuple[set[int], set[int], set[int], set[int], set[int]]:
    return set(lives.pending), set(lives.staged), set(lives.running), set(lives.suspended), set(lives.acting)


def test_a_life_goes_through_every_phase_and_the_indexes_follow() -> None:
    lives = Lives(Changes())
    lives.add(_record(1))
    assert lives.phase(1) is Phase.PENDING and _views(lives) == ({1}, set(), set(), set(), set())
    staged = Staged(after=9, gpus=(0,), uuids=("GPU-0",))
    lives.stage(1, staged)
    assert isinstance(lives.get(1), StagedLife) and lives.staged[1] is staged
    assert _views(lives) == ({1}, {1}, set(), set(), set())  # staged jobs stay pending, out of placement
    assert lives.unstage(1) is staged and isinstance(lives.get(1), Pending)
    assert _views(lives) == ({1}, set(), set(), set(), set())
    job = _running(1)
    lives.start(job)
    assert lives.running[1] is job and _views(lives) == (set(), set(), {1}, set(), set())
    lives.act(1, SUSPEND)
    life = lives.get(1)
    assert isinstance(life, SuspendingLife) and life.acting is SUSPEND and life.job is job
    assert _views(lives) == (set(), set(), {1}, set(), {1})  # a job being suspended holds its GPUs
    job.held = {0: 2**30}  # the last sample of its GPUs
    assert lives.suspend(1) is job and isinstance(lives.get(1), SuspendedLife)
    assert job.held == {}  # suspended, its GPUs hold nothing of it
    assert _views(lives) == (set(), set(), set(), {1}, set())
    assert lives.resume(1) is job and isinstance(lives.get(1), RunningLife)
    lives.act(1, RESUME)
    assert isinstance(lives.get(1), ResumingLife) and lives.acting[1] is RESUME
    assert _views(lives) == (set(), set(), {1}, set(), {1})
    again = Acting(Step.RESUMING, "me", again=True)
    lives.act(1, again)  # a resume that failed, tried again
    assert lives.acting[1] is again
    assert lives.acted(1) is again and isinstance(lives.get(1), RunningLife)
    assert _views(lives) == (set(), set(), {1}, set(), set())
    lives.act(1, SUSPEND)
    lives.acted(1)  # the suspend refused by the driver, undone: running on
    lives.act(1, SUSPEND)
    lives.requeue(_record(1, attempt=2))  # it died while being suspended, and is retried
    assert lives.pending[1].attempt == 2 and _views(lives) == ({1}, set(), set(), set(), set())


def test_a_staged_job_starts_from_staged() -> None:
    lives = Lives(Changes())
    lives.add(_record(1))
    lives.stage(1, Staged(after=9, gpus=(0,), uuids=("GPU-0",)))
    lives.start(_running(1))
    assert _views(lives) == (set(), set(), {1}, set(), set())


@pytest.mark.parametrize(
    ("setup", "move", "words"),
    [
        ("pending", lambda lives: lives.suspend(1), "job 1 cannot be suspended: it is pending"),
        ("pending", lambda lives: lives.resume(1), "job 1 cannot resume: it is pending"),
        ("pending", lambda lives: lives.unstage(1), "job 1 cannot be unstaged: it is pending"),
        ("pending", lambda lives: lives.add(_record(1)), "job 1 is already pending"),
        ("staged", lambda lives: lives.stage(1, Staged(2, (1,), ("GPU-1",))), "job 1 cannot be staged: it is staged"),
        ("staged", lambda lives: lives.requeue(_record(1)), "job 1 cannot be requeued: it is staged"),
        ("running", lambda lives: lives.start(_running(1)), "job 1 cannot start: it is running"),
        ("running", lambda lives: lives.update(_record(1)), "job 1 cannot be updated: it is running"),
        ("running", lambda lives: lives.resume(1), "job 1 cannot resume: it is running"),
        ("running", lambda lives: lives.stage(1, Staged(2, (1,), ("GPU-1",))), "job 1 cannot be staged: it is running"),
        ("pending", lambda lives: lives.act(1, SUSPEND), "job 1 cannot begin suspending: it is pending"),
        ("running", lambda lives: lives.suspend(1), "job 1 cannot be suspended: it is running"),
        ("running", lambda lives: lives.acted(1), "job 1 cannot end a suspend or resume: it is running"),
        ("suspending", lambda lives: lives.act(1, RESUME), "job 1 cannot begin resuming: it is suspending"),
        ("suspending", lambda lives: lives.resume(1), "job 1 cannot resume: it is suspending"),
        ("suspending", lambda lives: lives.start(_running(1)), "job 1 cannot start: it is suspending"),
        ("suspended", lambda lives: lives.suspend(1), "job 1 cannot be suspended: it is suspended"),
        ("suspended", lambda lives: lives.act(1, RESUME), "job 1 cannot begin resuming: it is suspended"),
        ("suspended", lambda lives: lives.acted(1), "job 1 cannot end a suspend or resume: it is suspended"),
        ("suspended", lambda lives: lives.start(_running(1)), "job 1 cannot start: it is suspended"),
        ("ended", lambda lives: lives.resume(1), "job 1 cannot resume: it is not live"),
        ("ended", lambda lives: lives.update(_record(1)), "job 1 cannot be updated: it is not live"),
    ],
)
def test_an_impossible_move_is_refused_and_changes_nothing(setup: str, move, words: str) -> None:  # type: ignore[no-untyped-def]
    lives = Lives(Changes())
    lives.add(_record(1))
    if setup == "staged":
        lives.stage(1, Staged(after=9, gpus=(0,), uuids=("GPU-0",)))
    elif setup in ("running", "suspending", "suspended"):
        lives.start(_running(1))
        if setup != "running":
            lives.act(1, SUSPEND)
        if setup == "suspended":
            lives.suspend(1)
    elif setup == "ended":
        lives.end(1)
    before, life = _views(lives), lives.get(1)
    with pytest.raises(ImpossibleMove, match=words):
        move(lives)
    assert _views(lives) == before and lives.get(1) is life


def test_an_end_is_one_removal_from_every_index() -> None:
    lives = Lives(Changes())
    for job_id in (1, 2, 3, 4, 5):
        lives.add(_record(job_id))
    lives.stage(2, Staged(after=3, gpus=(0,), uuids=("GPU-0",)))
    for job_id in (3, 4, 5):
        lives.start(_running(job_id))
    lives.act(4, SUSPEND)
    lives.suspend(4)
    lives.act(5, SUSPEND)
    for job_id in (1, 2, 3, 4, 5):
        assert lives.end(job_id) is not None
    assert _views(lives) == (set(), set(), set(), set(), set()) and len(lives) == 0
    assert lives.end(1) is None  # already gone: nothing to do


def test_every_move_that_changes_what_placement_reads_marks_a_change_and_a_record_replaced_marks_one() -> None:
    changes = Changes()
    lives = Lives(changes)
    moves = [  # (move, whether placement reads what it changes: a helper acting on a job holding its GPUs is not)
        (lambda: lives.add(_record(1)), True),
        (lambda: lives.stage(1, Staged(after=9, gpus=(0,), uuids=("GPU-0",))), True),
        (lambda: lives.unstage(1), True),
        (lambda: lives.start(_running(1)), True),
        (lambda: lives.act(1, SUSPEND), False),
        (lambda: lives.suspend(1), True),
        (lambda: lives.resume(1), True),
        (lambda: lives.act(1, RESUME), False),
        (lambda: lives.acted(1), False),
        (lambda: lives.requeue(_record(1)), True),
        (lambda: lives.end(1), True),
    ]
    for move, placement_reads in moves:
        before = changes.count
        move()
        assert (changes.count > before) is placement_reads
    lives.add(_record(2))
    before = changes.count
    lives.update(_record(2, held=True))
    assert changes.count == before + 1 and lives.pending[2].held


def test_a_job_ended_while_the_pending_jobs_are_tried_one_at_a_time_stays_ended() -> None:
    """daemon.isolation tries each pending job alone. It used to swap the state's dict for one holding that job
    and put the whole dict back after, so any other job ended meanwhile would have come back pending."""
    lives = Lives(Changes())
    for job_id in (1, 2, 3):
        lives.add(_record(job_id))
    with lives.narrowed(2):
        assert set(lives.pending) == {2}
        lives.update(_record(2, held=True))
        lives.end(3)
    assert set(lives.pending) == {1, 2} and lives.pending[2].held and 3 not in lives


def test_load_starts_again_from_the_table() -> None:
    lives = Lives(Changes())
    lives.add(_record(7))
    lives.load([_record(1)], [_running(2)], [_running(3)], {})
    assert _views(lives) == ({1}, set(), {2}, {3}, set()) and 7 not in lives


def test_a_requeued_jobs_backoff_is_on_its_pending_life_and_ends_with_it() -> None:
    """A job requeued with a backoff waits on its pending life: held or released it keeps it, started it leaves it,
    and a job that ends leaves nothing behind (the daemon's forget needs no line for it)."""
    changes = Changes()
    lives = Lives(changes)
    lives.add(_record(1))
    lives.start(_running(1))
    seen = changes.count
    lives.requeue(_record(1, attempt=2), not_before=50.0)
    assert changes.count > seen  # placement looks again: a backoff began
    assert lives.not_before == {1: 50.0} and isinstance(lives.get(1), Pending)
    lives.update(_record(1, attempt=2, held=True))
    assert lives.not_before == {1: 50.0}  # held and released, the backoff stays
    lives.due(1)
    assert lives.not_before == {} and 1 in lives.pending  # being started: the backoff is over
    lives.start(_running(1))
    lives.requeue(_record(1, attempt=3), not_before=80.0)
    lives.stage(1, Staged(after=9, gpus=(0,), uuids=("GPU-0",)))
    assert lives.not_before == {}  # staged behind a running job, it was placed: past its backoff
    lives.unstage(1)
    lives.start(_running(1))
    lives.requeue(_record(1, attempt=4), not_before=90.0)
    lives.end(1)
    assert lives.not_before == {} and 1 not in lives


def test_a_daemon_that_starts_again_finds_each_pending_jobs_backoff_on_its_life() -> None:
    lives = Lives(Changes())
    lives.load([_record(1), _record(2)], [_running(3)], [], {1: 40.0, 3: 99.0})
    assert lives.not_before == {1: 40.0}  # only pending jobs wait on a backoff
    lives.load([_record(2)], [], [], {})
    assert lives.not_before == {}
