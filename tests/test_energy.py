"""What a job cost the GPUs: GPU-hours and GPU energy per job, in `gpuq show`, the report, /api/jobs and
/metrics. The split of a GPU's energy between the jobs on it is pure (``launcher.policy.energy``); the rest
runs real jobs on the fake inventory, whose GPUs draw a steady 100 W (``gpus.fake.FAKE_WATTS``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq_scheduler.launcher.gpus.fake import FAKE_WATTS
from gpuq_scheduler.launcher.policy.energy import split
from tests.conftest import Gpuq, fake_cuda_queue, wait_for
from tests.test_serve import Served

GiB = 1 << 30
DONE = ("succeeded", "failed", "cancelled", "timeout", "lost")


def test_a_job_alone_on_its_gpu_is_charged_all_of_its_energy() -> None:
    assert split(300.0, {7: 10 * GiB}) == {7: 300.0}


def test_packed_jobs_share_a_gpus_energy_as_they_share_its_memory() -> None:
    assert split(400.0, {1: GiB, 2: 3 * GiB}) == {1: 100.0, 2: 300.0}


def test_use_outside_gpuq_takes_its_part_charged_to_nobody() -> None:
    assert split(400.0, {1: GiB}, outside=3 * GiB) == {1: 100.0}


def test_jobs_that_hold_no_memory_yet_share_equally() -> None:
    assert split(90.0, {1: 0, 2: 0, 3: 0}) == {1: 30.0, 2: 30.0, 3: 30.0}


def test_nothing_is_charged_without_energy_or_without_jobs() -> None:
    assert split(0.0, {1: GiB}) == {} and split(-5.0, {1: GiB}) == {} and split(100.0, {}) == {}


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Gpuq]:
    client = fake_cuda_queue(tmp_path, "1x80GiB")
    yield client
    client.cleanup()


def test_packed_jobs_are_charged_their_gpu_hours_and_their_part_of_the_energy(queue: Gpuq) -> None:
    small = queue.submit("--mem", "4G", "fake_cuda.py", "1", "6")
    large = queue.submit("--mem", "8G", "fake_cuda.py", "6", "6")
    records = [queue.wait_state(job, *DONE) for job in (small, large)]
    assert [r["state"] for r in records] == ["succeeded", "succeeded"]
    for record in records:
        assert record["gpu_hours"] == pytest.approx((record["ended_at"] - record["started_at"]) / 3600)
        assert record["gpu_energy_j"] > 0
    assert records[1]["gpu_energy_j"] > records[0]["gpu_energy_j"]  # 6.5 GiB held beside 1.5 GiB
    # Never more than the GPU drew from one sampling interval (2 s) before the first start to the last end.
    span = max(r["ended_at"] for r in records) - min(r["started_at"] for r in records) + 2.5
    assert sum(r["gpu_energy_j"] for r in records) <= FAKE_WATTS * span
    shown = queue.run("show", str(large)).stdout
    assert "gpu hours" in shown and "gpu energy" in shown
    line = next(text for text in shown.splitlines() if text.startswith("gpu energy"))
    assert line.split()[-1] in ("J", "kJ")
    report = queue.run("report").stdout
    assert "USER" in report and "GPU ENERGY" in report


def test_api_jobs_and_metrics_show_what_jobs_cost(queue: Gpuq) -> None:
    done = queue.submit("--mem", "4G", "fake_cuda.py", "1", "3")
    assert queue.wait_state(done, *DONE)["state"] == "succeeded"
    running = queue.submit("--mem", "4G", "fake_cuda.py", "1", "120")
    queue.wait_state(running, "running")
    server = Served(queue)
    try:

        def charged() -> dict[str, object] | None:
            jobs = server.json("/api/jobs")["running"]
            return jobs[0] if jobs and (jobs[0]["gpu_energy_j"] or 0) > 0 else None

        now = wait_for(charged, 30, "the running job to be charged energy")
        assert now["id"] == running and now["gpu_hours"] > 0
        queue.run("cancel", str(running))
        records = [queue.wait_state(job, *DONE) for job in (done, running)]
        found = server.metrics()
        me = (("user", records[0]["user"]),)
        assert found[("gpuq_gpu_energy_joules_total", me)] == pytest.approx(sum(r["gpu_energy_j"] for r in records))
        assert found[("gpuq_gpu_hours_total", me)] == pytest.approx(sum(r["gpu_hours"] for r in records))
    finally:
        server.close()
    assert json.loads(queue.run("show", "--json", str(done)).stdout)["gpu_energy_j"] == records[0]["gpu_energy_j"]
