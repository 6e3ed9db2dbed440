"""The first run of a --mem auto kind (issue 40), on the fake inventory with fake MPS: the others of its kind
start once the probe's peak has held still for a few seconds, not after the settle time (an hour here, so
only the early count can start them), fenced at that early peak; one that outgrows it meets its own fence
and comes back with more, its neighbours unhurt and nothing lost. The jobs are tests/fixtures/fake_cuda.py,
held at their first figure until the test opens a gate file, so no step depends on how fast a pass runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Gpuq, fake_cuda_queue

DONE = ("succeeded", "failed", "cancelled", "timeout", "lost")


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Gpuq]:
    client = fake_cuda_queue(
        tmp_path, "1x80GiB", GPUQ_FAKE_MPS="1", GPUQ_RETRY_BACKOFF="0.2", GPUQ_AUTO_SETTLE="3600"
    )  # fmt: skip
    yield client
    client.cleanup()


def _array(queue: Gpuq, size: int, *job: str) -> list[int]:
    array = queue.submit("--mem", "auto", "--array", f"0-{size - 1}", *job)
    return list(range(array + 1, array + size + 1))


def _ended(queue: Gpuq, ids: list[int]) -> list[dict[str, Any]]:
    return [queue.wait_state(job_id, *DONE, timeout=120) for job_id in ids]


def test_a_first_auto_sweep_starts_beside_its_probe_once_the_probes_peak_held_still(
    queue: Gpuq, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    members = _array(queue, 4, "fake_cuda.py", "2", "0.2", "--grow-to", "2", "--grow-when", str(gate))
    # Every member holds 2.5 GiB until the gate opens: none can end before, so all four running at once means
    # the others started beside the probe while it ran, long before its settle time (an hour).
    running = [queue.wait_state(job_id, "running", timeout=120) for job_id in members]
    assert all(r["gpus"] == [0] for r in running)  # one GPU: packed beside the probe
    gate.touch()
    records = _ended(queue, members)
    assert [r["state"] for r in records] == ["succeeded"] * 4
    assert [r["attempt"] for r in records] == [1] * 4
    (probe,) = [r for r in records if r["mem_from"].startswith("a probe; since it settled, ")]
    learned = f"3.0G learned from job {probe['id']} (running): peak 2.5G"
    assert probe["mem_from"] == f"a probe; since it settled, {learned}"
    assert sorted(r["mem_from"] for r in records if r is not probe) == [learned] * 3
    assert all(r["mem_per_gpu"] == 2 << 30 for r in records)  # 3.0G less the 1 GiB placement adds for a context


def test_a_member_that_outgrows_the_early_peak_meets_its_fence_and_comes_back_its_neighbour_unhurt(
    queue: Gpuq, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    members = _array(queue, 3, "fake_cuda.py", "1", "0.2", "--grow-to", "3", "--grow-when", str(gate))
    for job_id in members:
        queue.wait_state(job_id, "running", timeout=120)  # the probe's early peak (1.5 GiB) counted
    # Another kind of job on the same GPU (the probe held it whole until then), honest about its 4G.
    neighbour = queue.submit("--mem", "4G", "fake_cuda.py", "3", "0.2", "--grow-to", "3", "--grow-when", str(gate))
    assert queue.wait_state(neighbour, "running", timeout=120)["gpus"] == [0]
    gate.touch()  # every member now wants 3.5 GiB: the probe may (no fence), the others meet theirs (1.8 GiB)
    records = _ended(queue, [neighbour, *members])
    assert [r["state"] for r in records] == ["succeeded"] * 4  # nothing lost
    assert (records[0]["attempt"], records[0]["mem_per_gpu"]) == (1, 4 << 30)  # the neighbour never noticed
    probe, *others = records[1:]
    assert probe["attempt"] == 1 and probe["mem_from"].startswith("a probe; since it settled, ")
    assert all(r["attempt"] >= 2 for r in others)  # each met its own fence and came back with more
    assert all("held 3.50 GiB on GPU 0" in Path(r["log"]).read_text() for r in others)  # all their work done
    events = (queue.home / "events.jsonl").read_text()
    fenced = "CUDA out of memory at its 820.0M share (--mem auto)"  # 1.8G reserved, less the context's 1 GiB
    assert events.count(fenced) >= 2, events
