"""The GPU watchdog on a lent GPU host (real NVML, real CUDA), run by the lead:

    .venv/bin/python -m pytest -q -m gpu tests/test_watchdog_gpu.py

A packed liar that drops its MPS variables (or, without MPS, PyTorch's cap) and takes 22 GiB is stopped,
named with what it held, while three honest neighbours on its GPU succeed; on a host with two GPUs or
more, a job that sets its own CUDA_VISIBLE_DEVICES to a GPU it was not given is stopped. Skipped where
NVML finds no GPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Gpuq, make_env, nvml_gpu_count

pytestmark = pytest.mark.gpu
DONE = ("succeeded", "failed", "cancelled", "timeout", "lost")
GiB = 1 << 30

HOLD = """
import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(f"holding {sys.argv[1]} GiB on {torch.cuda.get_device_name()}", flush=True)
time.sleep(float(sys.argv[2]))
"""
# Grows to GIB over a few seconds, then computes: a neighbour that is still growing is the one a liar hurts.
GROWER = """
import sys, time, torch
held = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
time.sleep(2)
held += [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(int(float(sys.argv[1]) * 4) - 4)]
x = torch.randn(2048, 2048, device="cuda")
end = time.time() + float(sys.argv[2])
while time.time() < end:
    x = (x @ x).clamp_(-1, 1)
torch.cuda.synchronize()
print(f"held {len(held) / 4:.2f} GiB", flush=True)
"""
LIAR = (
    "exec env -u CUDA_MPS_PIPE_DIRECTORY -u CUDA_MPS_PINNED_DEVICE_MEM_LIMIT -u PYTORCH_CUDA_ALLOC_CONF "
    "python hold.py 22 120\n"
)
ELSEWHERE = "export CUDA_VISIBLE_DEVICES=$((GPUQ_GPUS == 0 ? 1 : 0)); exec python hold.py 2 120\n"


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Gpuq]:
    if not nvml_gpu_count():
        pytest.skip("no NVIDIA GPU here (NVML found none); runs on a lent GPU host")
    home, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    for name, text in (("hold.py", HOLD), ("grower.py", GROWER), ("liar.sh", LIAR), ("elsewhere.sh", ELSEWHERE)):
        (work / name).write_text(text)
    client = Gpuq(home, make_env(home, fake=None, GPUQ_KILL_GRACE="5"), work)
    yield client
    client.cleanup()


def test_a_packed_liar_that_drops_its_fence_variables_is_stopped_and_its_neighbours_succeed(queue: Gpuq) -> None:
    count = nvml_gpu_count()
    queue.wait_state(queue.submit("--gpus", "0", "true"), "succeeded")  # the daemon is up
    if count > 1:
        queue.run("drain", *(str(i) for i in range(1, count)))  # everyone on GPU 0
    honest = [queue.submit("--mem", "4G", "grower.py", "3", "15") for _ in range(3)]
    liar = queue.submit("--mem", "4G", "sh", "liar.sh")
    stopped = queue.wait_state(liar, *DONE, timeout=120)
    assert (stopped["state"], stopped["cause"]) == ("failed", "watchdog")
    assert stopped["reason"].startswith("stopped by the watchdog: held ")
    assert stopped["reason"].endswith(" GiB on GPU 0 against its 4.0G share")
    records = [queue.wait_state(job, *DONE, timeout=180) for job in honest]
    assert [r["state"] for r in records] == ["succeeded"] * 3, [r["reason"] for r in records]
    assert all(r["gpus"] == [0] for r in [*records, stopped])
    events = [json.loads(line) for line in (queue.home / "events.jsonl").read_text().splitlines()]
    said = [e for e in events if e.get("event") == "watchdog"]
    assert [(e["job"], e["rule"], e["action"]) for e in said] == [(liar, "past-share", "stop")]
    assert said[0]["held"] > 20 * GiB  # what NVML listed for it: its 22 GiB and its context


def test_a_job_that_sets_its_own_cuda_visible_devices_to_a_gpu_it_was_not_given_is_stopped(queue: Gpuq) -> None:
    if nvml_gpu_count() < 2:
        pytest.skip("needs a host with two GPUs or more")
    neighbour = queue.submit("--gpus", "1", "hold.py", "2", "20")
    intruder = queue.submit("--gpus", "1", "sh", "elsewhere.sh")
    stopped = queue.wait_state(intruder, *DONE, timeout=120)
    other = 1 if stopped["gpus"] == [0] else 0
    assert stopped["reason"] == f"stopped by the watchdog: used GPU {other}, which it was not given"
    assert (stopped["state"], stopped["cause"]) == ("failed", "watchdog")
    assert queue.wait_state(neighbour, *DONE, timeout=120)["state"] == "succeeded"


def test_a_job_on_a_real_gpu_is_charged_its_gpu_hours_and_energy(queue: Gpuq) -> None:
    """NVML's total-energy counter, read at every sample: a job alone on its GPU is charged its energy."""
    job = queue.submit("--gpus", "1", "grower.py", "2", "10")
    record = queue.wait_state(job, *DONE, timeout=120)
    assert record["state"] == "succeeded", record["reason"]
    seconds = record["ended_at"] - record["started_at"]
    assert record["gpu_hours"] == pytest.approx(seconds / 3600)
    # More than nothing, less than 1 kW for its whole run and one sampling interval before it.
    assert 0 < record["gpu_energy_j"] < 1000 * (seconds + 2.5), record["gpu_energy_j"]
