"""Placement skips a pass in which nothing it reads has changed; "something changed" must follow from the
change itself. A change made through the state's own collections, with no counter bumped by hand, must
make the next pass look again and place the job it freed (issue #29, point 2)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.jobs.units import parse_size
from gpuq_scheduler.launcher.daemon import placing
from gpuq_scheduler.launcher.daemon.lives import Running
from gpuq_scheduler.launcher.daemon.scheduler import Scheduler
from gpuq_scheduler.launcher.daemon.tracked import Changes, TrackedDict, TrackedSet
from gpuq_scheduler.launcher.gpus.fake import FakeGpus

WAITING = 1  # the job each case frees through the state alone


def _spec(mem: str) -> JobSpec:
    return JobSpec(command=("true",), cwd="/tmp", env={"PATH": "/usr/bin:/bin"}, gpus=1, mem_per_gpu=parse_size(mem))


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[Scheduler]:
    """A real scheduler on one fake 80 GiB GPU, with job 1 (40 GiB) queued."""
    state = StateDir(tmp_path / "home")
    state.ensure()
    table = JobTable(state.db, create=True)
    table.insert_pending(
        [
            JobRecord(
                id=WAITING,
                spec=_spec("40GiB"),
                uid=os.getuid(),
                user="me",
                state=JobState.PENDING,
                submitted_at=0.0,
                log="",
            )
        ]
    )
    table.close()
    scheduler = Scheduler(state, FakeGpus("1x80GiB"))
    try:
        yield scheduler
    finally:
        scheduler.after_commit, scheduler.on_rollback = [], []  # no job is started: the test looks at placement
        for job_id in list(scheduler.running):
            scheduler.lives.end(job_id)
        scheduler.close()


def _pass(scheduler: Scheduler, now: float) -> None:
    with scheduler.table.batch():
        placing.place_and_launch(scheduler, scheduler.placement, now, scheduler.snapshot(), scheduler._launch)


def _release_the_hold(scheduler: Scheduler) -> Callable[[], None]:
    record = scheduler.pending[WAITING]
    scheduler.lives.update(record.replace(held=True, reason="held"))
    return lambda: scheduler.lives.update(record)


def _shrink_the_running_job(scheduler: Scheduler) -> Callable[[], None]:
    """A running job whose reservation shrinks as it runs (a ``--mem auto`` probe that settled)."""
    busy = JobRecord(
        id=2,
        spec=_spec("70GiB"),
        uid=os.getuid(),
        user="me",
        state=JobState.RUNNING,
        submitted_at=0.0,
        started_at=0.0,
        gpus=(0,),
        log="",
    )
    job = Running(busy, Launch(shim_pid=0, shim_start=None, boot_id=scheduler.boot_id, port=None))
    scheduler.lives.add(busy)
    scheduler.lives.start(job)

    def shrink() -> None:
        job.record = busy.replace(spec=_spec("30GiB"))

    return shrink


def _undrain(scheduler: Scheduler) -> Callable[[], None]:
    scheduler.drained.add(0)
    return lambda: scheduler.drained.discard(0)


@pytest.mark.parametrize("block", [_release_the_hold, _shrink_the_running_job, _undrain])
def test_a_change_nobody_announced_still_wakes_placement(
    scheduler: Scheduler, block: Callable[[Scheduler], Callable[[], None]]
) -> None:
    unblock = block(scheduler)
    _pass(scheduler, 1.0)
    _pass(scheduler, 2.0)  # nothing changed: this pass is skipped
    assert WAITING in scheduler.pending
    unblock()  # through the state's own collections and the lives' moves, no counter touched
    _pass(scheduler, 3.0)
    assert WAITING not in scheduler.pending
    assert WAITING in scheduler.running
    row = scheduler.table.get(WAITING)
    assert row is not None and row.state is JobState.RUNNING


def test_a_blocked_queue_costs_no_pass_when_nothing_changed(scheduler: Scheduler) -> None:
    scheduler.lives.update(scheduler.pending[WAITING].replace(held=True, reason="held"))
    _pass(scheduler, 1.0)
    seen = scheduler.changes.count
    for now in (2.0, 3.0, 4.0):
        _pass(scheduler, now)
    assert scheduler.changes.count == seen  # placement's own reads and rewrites changed nothing


def test_every_change_to_a_tracked_collection_is_marked_and_no_change_is_not() -> None:
    changes = Changes()
    jobs: TrackedDict[int, str] = TrackedDict(changes, {1: "a"})
    gpus: TrackedSet[int] = TrackedSet(changes, {0})

    def marks(act: Callable[[], object]) -> int:
        before = changes.count
        act()
        return changes.count - before

    value = jobs[1]
    assert marks(lambda: jobs.__setitem__(1, value)) == 0
    assert marks(lambda: jobs.pop(9, None)) == 0
    assert marks(lambda: jobs.setdefault(1, "z")) == 0
    assert marks(lambda: gpus.add(0)) == 0
    assert marks(lambda: gpus.discard(9)) == 0
    assert marks(lambda: gpus.update({0})) == 0
    assert marks(lambda: jobs.__setitem__(1, "b")) == 1
    assert marks(lambda: jobs.setdefault(2, "c")) == 1
    assert marks(lambda: jobs.update({3: "d"})) == 1
    assert marks(lambda: jobs.__ior__({4: "e"})) == 1
    assert marks(lambda: jobs.pop(2)) == 1
    assert marks(lambda: jobs.__delitem__(3)) == 1
    assert marks(jobs.popitem) == 1
    assert marks(jobs.clear) == 1
    assert marks(lambda: gpus.add(1)) == 1
    assert marks(lambda: gpus.__ior__({2})) == 1
    assert marks(lambda: gpus.__isub__({2})) == 1
    assert marks(lambda: gpus.__iand__({0})) == 1
    assert marks(lambda: gpus.__ixor__({5})) == 1
    assert marks(lambda: gpus.remove(5)) == 1
    assert marks(gpus.pop) == 1
    assert marks(gpus.clear) == 0  # already empty
    assert not jobs and not gpus


def test_a_collection_put_in_place_whole_is_tracked_too(scheduler: Scheduler) -> None:
    """A reload assigns plain dicts and sets: they are wrapped, and changing them later still counts."""
    seen = scheduler.changes.count
    scheduler.fence_waits = {WAITING: ((0,), ("GPU-0",))}
    scheduler.drained = set()
    assert isinstance(scheduler.fence_waits, TrackedDict) and isinstance(scheduler.drained, TrackedSet)
    assert scheduler.changes.count > seen
    seen = scheduler.changes.count
    scheduler.fence_waits.pop(WAITING)
    scheduler.drained |= {0}
    assert scheduler.changes.count == seen + 2
