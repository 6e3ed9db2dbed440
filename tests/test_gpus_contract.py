"""One contract for every GPU source: the fake inventory here, real NVML on a lent GPU machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.launcher.gpus.fake import FakeGpus
from gpuq_scheduler.launcher.gpus.nvml import NvmlGpus
from gpuq_scheduler.launcher.gpus.snapshot import GpuSource
from gpuq_scheduler.launcher.gpus.sources import open_source


def _nvml_gpus() -> int:
    source = NvmlGpus()
    try:
        return len(source.snapshot())
    finally:
        source.close()


@pytest.fixture(params=["fake-spec", "fake-json", pytest.param("nvml", marks=pytest.mark.gpu)])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GpuSource]:
    if request.param == "fake-spec":
        made: GpuSource = FakeGpus("2x24GiB,2x48GiB")
    elif request.param == "fake-json":
        path = tmp_path / "gpus.json"
        path.write_text(
            json.dumps({"gpus": [{"name": "A", "total": "80GiB", "used": "10GiB", "util": 35}, {"total": 1 << 30}]})
        )
        made = FakeGpus(str(path))
    else:
        if not _nvml_gpus():
            pytest.skip("no NVIDIA GPU here (NVML found none); runs on a lent GPU machine")
        made = NvmlGpus()
    yield made
    made.close()


def test_snapshot_contract(source: GpuSource) -> None:
    snapshot = source.snapshot()
    assert snapshot, "a source with GPUs reports them"
    assert [gpu.index for gpu in snapshot] == list(range(len(snapshot)))
    assert len({gpu.uuid for gpu in snapshot}) == len(snapshot)
    for gpu in snapshot:
        assert gpu.uuid.startswith("GPU-") and gpu.name
        assert gpu.total > 0 and 0 <= gpu.used <= gpu.total
        assert gpu.processes is None or all(pid > 0 and used >= 0 for pid, used in gpu.processes.items())
        assert not gpu.lost and gpu.error == ""
        assert gpu.utilization is None or 0 <= gpu.utilization <= 100  # percent, as NVML reports it
        assert gpu.process_utilization is None or all(0 <= u <= 100 for u in gpu.process_utilization.values())
    assert source.snapshot() == snapshot or [g.uuid for g in source.snapshot()] == [g.uuid for g in snapshot]


def test_energy_and_each_process_share_are_read_only_when_asked(source: GpuSource) -> None:
    """NVML is slow to answer both on some GPUs (3 ms of CPU each per H200): every daemon pass reads without."""
    assert all(gpu.energy is None and gpu.process_utilization is None for gpu in source.snapshot())
    metered = source.snapshot(energy=True)
    assert all(gpu.energy is not None and gpu.energy >= 0 and gpu.process_utilization is None for gpu in metered)
    assert all(gpu.energy is None for gpu in source.snapshot(process_utilization=True))


def test_distance_contract(source: GpuSource) -> None:
    count = len(source.snapshot())
    for a in range(count):
        for b in range(count):
            distance = source.distance(a, b)
            assert distance is None or distance >= 0


def test_fake_inventory_is_reread_so_a_teammate_can_fill_a_gpu(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([{"total": "80GiB"}, {"total": "80GiB"}]))
    source = open_source({"GPUQ_FAKE_GPUS": str(path)})
    assert [gpu.used for gpu in source.snapshot()] == [0, 0]
    path.write_text(json.dumps([{"total": "80GiB", "used": "70GiB"}, {"total": "80GiB", "lost": True}]))
    first, second = source.snapshot()
    assert first.used == 70 << 30 and not first.lost
    assert second.lost and "lost" in second.error


@pytest.mark.parametrize("spec", ["4x", "x80G", "4x80", "0x80GiB,", "lots"])
def test_bad_fake_spec_names_the_variable(spec: str) -> None:
    with pytest.raises(BadInput, match="GPUQ_FAKE_GPUS"):
        FakeGpus(spec)


def test_bad_fake_json_names_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    for body in ("{", "[1, 2]", '{"gpus": [{"name": "no total"}]}', '[{"total": "eighty"}]'):
        path.write_text(body)
        with pytest.raises(BadInput, match="GPUQ_FAKE_GPUS"):
            FakeGpus(str(path))


def test_an_nvml_error_on_one_gpu_marks_only_that_gpu_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML errors cannot happen on a machine without a driver, so the driver's answers are played here
    through the real pynvml module (its error classes and messages): GPU 1 has fallen off the bus."""
    import types

    import pynvml

    def memory(handle: int) -> types.SimpleNamespace:
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return types.SimpleNamespace(total=80 << 30, used=1 << 30)

    calls = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}",
        "nvmlDeviceGetName": lambda h: b"NVIDIA H200",
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [],
    }
    for name, call in calls.items():
        monkeypatch.setattr(pynvml, name, call)
    source = NvmlGpus()
    first, second = source.snapshot()
    assert not first.lost and first.total == 80 << 30 and first.name == "NVIDIA H200"
    assert second.lost and second.error == "NVML: GPU is lost" and second.uuid == "GPU-1"
    source.close()


def test_nvml_is_asked_for_what_never_changes_once_and_for_the_dear_fields_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver's answers played through the real pynvml module, each call counted: a GPU's handle, UUID
    and name once, and the link between two GPUs; its energy counter and per-process shares only in the
    snapshots that ask for them."""
    import collections
    import types

    import pynvml

    asked: collections.Counter[str] = collections.Counter()

    def counted(name: str, answer: object) -> object:
        def call(*args: object) -> object:
            asked[name] += 1
            return answer(*args) if callable(answer) else answer

        return call

    answers = {
        "nvmlInit": None,
        "nvmlShutdown": None,
        "nvmlDeviceGetCount": 2,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}",
        "nvmlDeviceGetName": b"NVIDIA H200",
        "nvmlDeviceGetMemoryInfo": types.SimpleNamespace(total=80, used=1),
        "nvmlDeviceGetComputeRunningProcesses": [],
        "nvmlDeviceGetUtilizationRates": types.SimpleNamespace(gpu=0),
        "nvmlDeviceGetTotalEnergyConsumption": 5000,
        "nvmlDeviceGetProcessUtilization": [],
        "nvmlDeviceGetP2PStatus": pynvml.NVML_P2P_STATUS_OK,
    }
    for name, answer in answers.items():
        monkeypatch.setattr(pynvml, name, counted(name, answer))
    source = NvmlGpus()
    for _ in range(3):
        assert [gpu.uuid for gpu in source.snapshot()] == ["GPU-0", "GPU-1"]
    assert asked["nvmlDeviceGetTotalEnergyConsumption"] == asked["nvmlDeviceGetProcessUtilization"] == 0
    assert asked["nvmlDeviceGetMemoryInfo"] == 6
    assert [gpu.energy for gpu in source.snapshot(energy=True)] == [5000, 5000]
    assert source.snapshot(process_utilization=True)[0].process_utilization == {}
    assert asked["nvmlDeviceGetTotalEnergyConsumption"] == asked["nvmlDeviceGetProcessUtilization"] == 2
    assert asked["nvmlDeviceGetUUID"] == asked["nvmlDeviceGetName"] == 2
    assert [source.distance(0, 1) for _ in range(3)] == [0, 0, 0]  # NVLink, asked once
    assert asked["nvmlDeviceGetP2PStatus"] == 1
    source.close()


def test_a_fake_gpus_utilisation_is_a_whole_percent(tmp_path: Path) -> None:
    from gpuq_scheduler.jobs.errors import BadInput

    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"gpus": [{"total": "80GiB", "util": 35}, {"total": "80GiB"}]}))
    assert [g.utilization for g in FakeGpus(str(path)).snapshot()] == [35, None]
    path.write_text(json.dumps({"gpus": [{"total": "80GiB", "util": 120}]}))
    with pytest.raises(BadInput, match="GPU 0's util must be a whole percent from 0 to 100"):
        FakeGpus(str(path)).snapshot()
