"""bench/state_shape.py counts what the daemon's steps reach of its shared state (#41 part 1). A step narrowed to a
Protocol that stands for the state still reaches the state: those members are counted in a column of their own, so
narrowing shows as narrowing and not as hiding."""

from __future__ import annotations

from pathlib import Path

from bench import state_shape

STATE = """
class SchedulerState:
    def __init__(self) -> None:
        self.table = object()
        self.journal: list[dict] = []
        self.lives = object()

    def stop(self, job) -> None: ...

    def forget(self, job_id: int) -> None:
        self.lives.end(job_id)
"""

STEP = """
from typing import Protocol

from gpuq_scheduler.launcher.daemon.state import SchedulerState


class Journaling(Protocol):
    @property
    def journal(self) -> list[dict]: ...

    def stop(self, job) -> None: ...


class Helper(Protocol):  # a part's, not the state's: what it reaches is not the state
    def result(self) -> dict: ...


def whole(scheduler: SchedulerState) -> None:
    scheduler.table.commit()


def handed_on(scheduler: SchedulerState) -> None:
    whole(scheduler)


def narrowed(scheduler: Journaling, job) -> None:
    scheduler.journal.append({})
    scheduler.stop(job)


def helped(helper: Helper) -> None:
    helper.result()
"""


def _tree(root: Path) -> Path:
    daemon = root / "launcher" / "daemon"
    daemon.mkdir(parents=True)
    (daemon / "state.py").write_text(STATE)
    (daemon / "step.py").write_text(STEP)
    return root


def test_a_step_narrowed_to_a_protocol_of_the_state_still_counts_what_it_reaches(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    assert state_shape.attributes(tree) == {"step": {"table"}}
    protocols = state_shape.state_protocols(tree)
    assert protocols == {"Journaling"}  # every member the state's; Helper's are not
    assert state_shape.attributes(tree, protocols) == {"step": {"journal", "stop"}}
    assert state_shape.taking_state(tree) == {"step": 2}  # handed_on takes it only to hand it on, and is counted
