"""The fake inventory behaves like real GPUs where tests lean on it (DESIGN.md: fakes behave like the real
thing): a process that ended holds no GPU memory, even while it waits, a zombie, to be reaped.

The bug this pins: an orphaned rank killed at its job's end stayed a zombie under a parent slow to reap it;
`kill(pid, 0)` still found it, so the fake GPU counted its memory and the next job on it ran out of memory
(tests/test_preemption.py's NCCL pair, now and then under load), where a real driver had freed it at exit.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

from gpuq_scheduler.launcher.gpus.fake import FakeGpus
from tests.conftest import wait_for

GiB = 1 << 30
FIXTURE = Path(__file__).parent / "fixtures" / "fake_cuda.py"


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_a_zombie_holds_no_gpu_memory_on_a_fake_gpu(tmp_path: Path) -> None:
    usage = tmp_path / "usage"
    usage.mkdir()
    live = subprocess.Popen(["sleep", "30"])
    ended = subprocess.Popen(["true"])  # not reaped until the end of the test: a zombie meanwhile
    try:
        wait_for(lambda: _state(ended.pid) == "Z", 10, "the ended process to be a zombie")
        for process, size in ((live, 10 * GiB), (ended, 20 * GiB)):
            (usage / f"{process.pid}.json").write_text(json.dumps({"0": size}))
        empty = FakeGpus("1x80GiB").snapshot()[0].used
        assert FakeGpus("1x80GiB", str(usage)).snapshot()[0].used == empty + 10 * GiB
        spec = importlib.util.spec_from_file_location("fake_cuda", FIXTURE)
        assert spec is not None and spec.loader is not None
        fake_cuda = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fake_cuda)
        assert fake_cuda.others(usage, "0") == 10 * GiB  # what a fake CUDA program finds taken on GPU 0
    finally:
        live.kill()
        live.wait()
        ended.wait()
