"""One typed life per live job (issue 41, part 1): each phase carries its own data, the moves a phase does not
allow are refused, a job's end is one removal, and the indexes the steps read follow the moves."""

from __future__ import annotations

import os

import pytest

from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome, Step
from gpuq_scheduler.launcher.daemon.lives import (
    Acting,
    EndingLife,
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
    Taking,
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


LOST = Outcome.gpu_lost("GPU 0 was lost")
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
        ("suspended", lambda lives: lives.stop(1, LOST), "job 1 cannot be stopped: it is suspended"),
        ("pending", lambda lives: lives.stop(1, LOST), "job 1 cannot be stopped: it is pending"),
        ("ending", lambda lives: lives.stop(1, LOST), "job 1 cannot be stopped: it is ending"),
        ("ending", lambda lives: lives.act(1, SUSPEND), "job 1 cannot begin suspending: it is ending"),
        ("ending", lambda lives: lives.acted(1), "job 1 cannot end a suspend or resume: none is under way"),
        ("ending", lambda lives: lives.resume(1), "job 1 cannot resume: it is ending"),
        ("running", lambda lives: lives.unstop(1), "job 1 cannot be stopped no more: it is running"),
        ("ended", lambda lives: lives.marks(1), "job 1 cannot be marked: it is not live"),
        ("ended", lambda lives: lives.resume(1), "job 1 cannot resume: it is not live"),
        ("ended", lambda lives: lives.update(_record(1)), "job 1 cannot be updated: it is not live"),
    ],
)
def test_an_impossible_move_is_refused_and_changes_nothing(setup: str, move, words: str) -> None:  # type: ignore[no-untyped-def]
    lives = Lives(Changes())
    lives.add(_record(1))
    if setup == "staged":
        lives.stage(1, Staged(after=9, gpus=(0,), uuids=("GPU-0",)))
    elif setup in ("running", "suspending", "suspended", "ending"):
        lives.start(_running(1))
        if setup in ("suspending", "suspended"):
            lives.act(1, SUSPEND)
        if setup == "suspended":
            lives.suspend(1)
        if setup == "ending":
            lives.stop(1, LOST)
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


def test_a_stopped_job_is_ending_on_its_gpus_with_its_outcome_until_its_end() -> None:
    lives = Lives(Changes())
    lives.add(_record(1))
    job = _running(1)
    lives.start(job)
    lives.stop(1, LOST)
    life = lives.get(1)
    assert isinstance(life, EndingLife) and life.phase is Phase.ENDING and life.job is job
    assert lives.running[1] is job and lives.stopped_for == {1: LOST}  # it holds its GPUs until it ends
    lives.end(1)
    assert dict(lives.stopped_for) == {} and 1 not in lives  # the stop goes with its life: no map to forget


def test_a_job_stopped_while_a_helper_acts_stays_ending_whatever_the_helper_does() -> None:
    """The watchdog or a lost GPU may stop a job being suspended: its helper is still followed to its end, and
    the job, whether its suspend went through or not, stays on its GPUs until it ends, as the stop says."""
    for finish in ("suspend", "acted"):
        lives = Lives(Changes())
        lives.add(_record(1))
        lives.start(_running(1))
        lives.act(1, SUSPEND)
        lives.stop(1, LOST)
        assert lives.acting[1] is SUSPEND and lives.stopped_for[1] is LOST
        lives.suspend(1) if finish == "suspend" else lives.acted(1)
        life = lives.get(1)
        assert isinstance(life, EndingLife) and life.acting is None and life.outcome is LOST
        assert _views(lives) == (set(), set(), {1}, set(), set())


def test_a_stop_taken_back_leaves_the_job_as_it_was() -> None:
    lives = Lives(Changes())
    lives.add(_record(1))
    lives.start(_running(1))
    lives.stop(1, LOST)
    lives.unstop(1)
    assert isinstance(lives.get(1), RunningLife) and dict(lives.stopped_for) == {}
    lives.act(1, RESUME)
    lives.stop(1, LOST)
    lives.unstop(1)
    assert isinstance(lives.get(1), ResumingLife) and lives.acting[1] is RESUME


def test_a_jobs_marks_follow_it_through_its_phases_and_go_with_it() -> None:
    lives = Lives(Changes())
    lives.add(_record(1))
    lives.add(_record(2))
    assert lives.peek(1) is None and lives.marked() == []  # a read marks nothing
    lives.marks(1).no_handoff = True
    lives.start(_running(1))
    lives.act(1, SUSPEND)
    lives.marks(1).preempted_by = (2, "priority 10 > 0")
    lives.suspend(1)
    marks = lives.peek(1)
    assert marks is not None and marks.no_handoff and marks.preempted_by == (2, "priority 10 > 0")
    assert [job_id for job_id, _ in lives.marked()] == [1]
    lives.end(1)
    assert lives.peek(1) is None and lives.marked() == []


def test_a_taking_is_a_change_placement_sees() -> None:
    changes = Changes()
    lives = Lives(changes)
    lives.add(_record(1))
    before = changes.count
    taking = Taking({2}, (0,), ("GPU-0",))
    lives.take(1, taking)
    assert changes.count > before and lives.marks(1).taking is taking and lives.takings() == {1: taking}
    before = changes.count
    lives.take(1, None)
    assert changes.count > before and lives.marks(1).taking is None and lives.takings() == {}


def test_load_keeps_the_marks_of_the_jobs_still_live_and_drops_the_others() -> None:
    """A pass rolled back reads the phases back from the table; what the steps marked of a job stays with it
    (they undo their own marks), and a job the table no longer holds live takes its marks with it."""
    lives = Lives(Changes())
    for job_id in (1, 2):
        lives.add(_record(job_id))
        lives.marks(job_id).preemptions = job_id
    lives.load([_record(1)], [], [], {})
    assert lives.marks(1).preemptions == 1 and lives.peek(2) is None and 2 not in lives
