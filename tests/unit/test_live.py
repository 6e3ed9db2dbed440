"""The live view's picture as plain data: memory bars and folded arrays, without a terminal."""

from __future__ import annotations

import pytest

from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.gpus.sources import open_source
from gpuq_scheduler.launcher.views import live
from gpuq_scheduler.launcher.views.gpu_rows import GpuRow
from tests.conftest import Gpuq

G = 1 << 30


def _line(total: int, jobs: int, reserved: int, outside: int, lost: bool = False) -> live.GpuLine:
    row = GpuRow(0, "GPU-x", "H100", total, outside, reserved, 0, (), "lost: gone" if lost else "ok", "mps")
    return live.GpuLine(row, jobs, 50, drained=False)


def test_a_bar_splits_a_gpu_into_its_jobs_use_their_unused_reservation_outside_use_and_free() -> None:
    bar = live.bar(_line(80 * G, jobs=20 * G, reserved=40 * G, outside=20 * G), 8)
    assert bar == "██▒▒░░  "  # 20 used of 40 reserved, 20 outside, 20 free: a quarter each
    assert live.bar(_line(80 * G, 0, 0, 0), 8) == " " * 8
    assert live.bar(_line(80 * G, jobs=90 * G, reserved=10 * G, outside=10 * G), 8) == "█" * 8  # never past the card
    assert "LOST" in live.gpu_label(_line(80 * G, 0, 0, 0, lost=True))


def _member(job_id: int, array: int | None) -> JobRecord:
    return JobRecord(job_id, JobSpec(command=("x",), cwd="/"), "alice", 1000, JobState.RUNNING, 0.0, array_id=array)


def test_an_array_folds_to_its_first_member_and_says_how_many_it_stands_for() -> None:
    records = [_member(1, None), _member(3, 2), _member(4, 2), _member(5, 2), _member(9, 8)]
    kept, counts = live.fold(records)
    assert [r.id for r in kept] == [1, 3, 9] and counts == {2: 3}  # a one-member line needs no count


@pytest.mark.slow
def test_gpus_is_a_count_in_every_table_and_on_says_which_gpus(gpuq: Gpuq) -> None:
    """Issue #39, friction 8: GPUS read "0,1" (GPU numbers) in the Running table of `gpuq top` and the
    dashboard, and "2" (a count) in their Waiting table and in `gpuq status`. Now GPUS is a count everywhere
    and ON the numbers of the GPUs a running job holds."""
    pair = gpuq.submit("--gpus", "2", "--name", "pair", "sleep", "300")
    one = gpuq.submit("--gpus", "1", "--name", "one", "sleep", "300")
    gpuq.wait_state(pair, "running")
    gpuq.wait_state(one, "running")
    waiting = gpuq.submit("--gpus", "2", "--name", "later", "sleep", "300")  # one GPU is left: it waits
    source = open_source(gpuq.env)
    try:
        picture = live.take(Queue(StateDir(gpuq.home)), source)
    finally:
        source.close()
    running = {row[0]: dict(zip(live.RUNNING_COLUMNS, row, strict=True)) for row in live.running_rows(picture)}
    assert running[str(pair)]["GPUS"] == "2" and running[str(one)]["GPUS"] == "1"
    held = {job["id"]: job["gpus"] for job in gpuq.status()}
    assert running[str(pair)]["ON"] == ",".join(map(str, held[pair])) and running[str(one)]["ON"] == str(held[one][0])
    waits = {row[0]: dict(zip(live.WAITING_COLUMNS, row, strict=True)) for row in live.waiting_rows(picture)}
    assert waits[str(waiting)]["GPUS"] == "2"
    status = gpuq.run("status").stdout.splitlines()
    header = status[0].split()
    assert header[4:6] == ["GPUS", "ON"]
    assert next(line.split() for line in status if line.split()[0] == str(pair))[4] == "2"


def test_a_running_jobs_runtime_and_time_left_leave_out_its_time_suspended() -> None:
    """Started 200 s ago, 50 s of them suspended, under a limit of 3 minutes: it ran 2m30s and has 30 s left
    (the limit does not run while a job is suspended); top and the dashboard said 3m20s and 0 s."""
    spec = JobSpec(command=("train.py",), cwd="/", time_limit=180)
    record = JobRecord(1, spec, 0, "me", JobState.RUNNING, 0.0, gpus=(0,), started_at=100.0, suspended_for=50.0)
    picture = live.Picture(300.0, [], [record], [], {}, paused=False)
    (row,) = live.running_rows(picture)
    assert row[-2:] == ("2m30s", "30.0s")


def test_status_formats_runtime_column_leaves_out_time_suspended_as_status_does() -> None:
    """`gpuq status --format id,runtime` counted a job's time suspended as runtime, while `gpuq status`, top
    and the dashboard left it out: started 200 s ago, 50 s of them suspended, it ran 2m30s."""
    from gpuq_scheduler.launcher.views import columns

    spec = JobSpec(command=("train.py",), cwd="/", time_limit=180)
    record = JobRecord(1, spec, 0, "me", JobState.RUNNING, 0.0, gpus=(0,), started_at=100.0, suspended_for=50.0)
    assert columns.table([record], ("id", "runtime"), now=300.0).splitlines() == ["ID  RUNTIME", "1   2m30s"]
