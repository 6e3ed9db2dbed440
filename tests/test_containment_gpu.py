"""Containment and host limits on a lent GPU host (cgroup2 with the cpu and memory controllers), run by the
lead: ``.venv/bin/python -m pytest -q -m gpu tests/test_containment_gpu.py`` as root.

--ram held by the kernel and named as the reason; --cpus held by cpu.max; a detached grandchild that holds
GPU memory ended with its job. Skipped where NVML finds no GPU; where the controllers are not delegated the
limit tests fail with the containment gpuq recorded, which says why.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Gpuq, make_env, nvml_gpu_count, wait_for
from tests.test_containment import alive

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["spawned", "cloned"])
def queue(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Gpuq]:
    """A queue on the host's GPUs whose jobs are started as the C library spawns them where it can (glibc
    2.39+), or (``cloned``, as on older hosts) cloned into their cgroups (launcher.supervisor.intocgroup)."""
    if not nvml_gpu_count():
        pytest.skip("no NVIDIA GPU here (NVML found none); runs on a lent GPU host")
    home, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    extra = {"GPUQ_SPAWN": "clone"} if request.param == "cloned" else {}
    client = Gpuq(home, make_env(home, fake=None, **extra), work)
    first = client.submit("--gpus", "0", "true")
    client.wait_state(first, "succeeded")  # the daemon records its containment
    yield client
    client.cleanup()


def _containment(queue: Gpuq) -> dict[str, object]:
    return dict(json.loads((queue.home / "gpus.json").read_text())["containment"])


def _needs(queue: Gpuq, controller: str) -> None:
    found = _containment(queue)
    if controller not in found["controllers"]:  # type: ignore[operator]
        pytest.fail(f"the {controller} controller is not delegated to gpuq here: {found['text']}")


def _script(queue: Gpuq, name: str, body: str) -> str:
    (queue.cwd / name).write_text(body)
    return name


def test_a_job_past_its_ram_limit_ends_out_of_host_memory_with_that_reason(queue: Gpuq) -> None:
    _needs(queue, "memory")
    hog = _script(queue, "hog.py", "chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))\n")
    job = queue.submit("--gpus", "0", "--ram", "256M", hog)
    record = queue.wait_state(job, "failed", "succeeded", timeout=120)
    assert record["state"] == "failed" and record["reason"].startswith("out of host memory at its 256.0M limit"), record
    assert queue.job(job)["peak_ram"] > 200 << 20  # its cgroup's memory.peak, in `gpuq show`


def test_a_job_given_half_a_cpu_gets_half_a_cpu(queue: Gpuq) -> None:
    _needs(queue, "cpu")
    busy = _script(
        queue,
        "busy.py",
        (
            "import os, threading, time\n"
            "mount = next(l.split()[1] for l in open('/proc/self/mounts') if l.split()[2] == 'cgroup2')\n"
            "group = next(l[3:].strip() for l in open('/proc/self/cgroup') if l.startswith('0::'))\n"
            "print('cpu.max', open(mount + group + '/cpu.max').read().strip())\n"
            "def spin():\n"
            "    end = time.monotonic() + 3\n"
            "    while time.monotonic() < end:\n"
            "        pass\n"
            "threads = [threading.Thread(target=spin) for _ in range(2)]\n"
            "wall = time.monotonic()\n"
            "[t.start() for t in threads]; [t.join() for t in threads]\n"
            "print('ratio', sum(os.times()[:2]) / (time.monotonic() - wall))\n"
        ),
    )
    job = queue.submit("--gpus", "0", "--cpus", "0.5", busy)
    record = queue.wait_state(job, "succeeded", "failed", timeout=120)
    out = dict(line.split(" ", 1) for line in Path(record["log"]).read_text().splitlines() if " " in line)
    assert record["state"] == "succeeded" and out["cpu.max"] == "50000 100000", out
    assert float(out["ratio"]) < 0.7, out  # two spinning threads, held to half a CPU (not two)


def test_a_detached_grandchild_holding_gpu_memory_ends_with_its_job(queue: Gpuq) -> None:
    import pynvml

    _script(
        queue,
        "grandchild.py",
        (
            "import os, time, torch\n"
            "held = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n"
            "torch.cuda.synchronize()\n"
            "open('grandchild.pid', 'w').write(str(os.getpid()))\n"
            "time.sleep(600)\n"
        ),
    )
    leave = _script(
        queue,
        "leave.sh",
        (
            "#!/bin/sh\n"
            f"setsid env -u CUDA_VISIBLE_DEVICES {sys.executable} grandchild.py > /dev/null 2>&1 < /dev/null &\n"
            "while [ ! -s grandchild.pid ]; do sleep 0.1; done\n"
        ),
    )
    (queue.cwd / leave).chmod(0o755)
    count = nvml_gpu_count()
    if count > 1:  # the grandchild, without CUDA_VISIBLE_DEVICES, takes GPU 0: let that be the job's own
        queue.wait_state(queue.submit("--gpus", "0", "true"), "succeeded")  # the daemon is up
        queue.run("drain", *(str(i) for i in range(1, count)))
    job = queue.submit("--gpus", "1", f"./{leave}")
    record = queue.wait_state(job, "succeeded", "failed", timeout=180)
    pid = int((queue.cwd / "grandchild.pid").read_text())
    try:
        assert record["state"] == "succeeded", record
        assert record["reason"] == "1 process outlived the job and was ended", record
        wait_for(lambda: not alive(pid), 15, "the grandchild to end")

        def onnvml_gpu_count() -> set[int]:
            pynvml.nvmlInit()
            try:
                handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
                return {p.pid for h in handles for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
            finally:
                pynvml.nvmlShutdown()

        wait_for(lambda: pid not in onnvml_gpu_count(), 15, "its GPU memory to be freed")
    finally:
        if alive(pid):
            os.kill(pid, 9)
