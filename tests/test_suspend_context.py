"""A whole-GPU job whose fast release left only its CUDA context keeps it on its GPU (#40, "or nothing, where
nothing is left"), with real daemons and real job processes on the fake inventory: a --preemptible job that
allocates as PyTorch would (jobs/fastmove_fake.py) moves all but its context out, is frozen, and neither the
driver's lock nor its checkpoint (the fake's) touch it; at resume it is thawed and its memory copied back.
A job that leaves more (memory PyTorch does not hold), or whose GPU's outside use leaves no room for its
context, takes the driver's checkpoint of what is left as before. What it keeps counts as used while it is
suspended: a job that would need that memory waits. kill -9 of the daemon meanwhile: tests/test_suspend_fastpath.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Gpuq, counted, fake_cuda_queue, wait_for

FIXTURES = Path(__file__).parent / "fixtures"
GiB = 1 << 30
CONTEXT = 512 << 20  # what a fake CUDA process holds for its context (tests/fixtures/fake_cuda.py)


def _counter(queue: Gpuq, counts: Path, *torch: str) -> tuple[int, int]:
    """A whole-GPU --preemptible counting job of 60 GiB (``torch``: fake_counter's, what it holds outside
    PyTorch), seen counting; its id and its process."""
    shutil.copy(FIXTURES / "fake_counter.py", queue.cwd / "fake_counter.py")
    job = queue.submit("--preemptible", "fake_counter.py", "60", str(counts), "1000000", "torch", *torch)
    wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count and be seen")
    return job, int(json.loads((queue.home / "run" / f"{job}.pid").read_text())["pid"])


def _outside(usage: Path, size: int) -> subprocess.Popen[bytes]:
    """A live process outside gpuq that the fake NVML sees holding ``size`` bytes of GPU 0."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (usage / f"{holder.pid}.json").write_text(json.dumps({"0": size}))
    return holder


@pytest.mark.parametrize(
    ("outside_torch", "outside_gpu", "path", "left"),
    [
        ([], 0, "fast-context-kept", CONTEXT),  # its context alone: kept, the driver never asked
        (["2"], 0, "fast", CONTEXT + 2 * GiB),  # 2 GiB PyTorch does not hold: the driver's checkpoint takes it
        ([], 3 * GiB // 4, "fast", CONTEXT),  # its context beside 0.75 GiB of outside use: past the 1 GiB
    ],
)
def test_the_driver_checkpoint_is_skipped_only_where_what_the_fast_path_left_fits_the_room_a_whole_gpu_job_tolerates(
    tmp_path: Path, outside_torch: list[str], outside_gpu: int, path: str, left: int
) -> None:
    queue = fake_cuda_queue(tmp_path, "1x80GiB", GPUQ_FAKE_HOST_MEMORY="256GiB")
    usage, counts = tmp_path / "usage", queue.cwd / "counts"
    holder = _outside(usage, outside_gpu) if outside_gpu else None
    try:
        job, pid = _counter(queue, counts, *outside_torch)
        whole = json.loads((usage / f"{pid}.json").read_text())
        queue.run("suspend", str(job))
        queue.wait_state(job, "suspended", timeout=60)
        event = wait_for(lambda: (found := queue.events(job, "suspended")) and found[-1], 30, "the suspended event")
        assert (event["path"], event["fallback"], event["fast_bytes"]) == (path, None, 60 * GiB + CONTEXT - left)
        moved = 60 * GiB + CONTEXT - left  # in host memory: the fast path's copy, and the driver's of the rest
        assert event["bytes"] == (moved if path == "fast-context-kept" else 60 * GiB + CONTEXT)
        if path == "fast-context-kept":  # on its GPU still, never locked nor checkpointed by the (fake) driver
            assert json.loads((usage / f"{pid}.json").read_text()) == {"0": left}
            assert not (usage / f"{pid}.host").exists() and not (usage / f"{pid}.locked").exists()
            assert "its context kept on the GPU (no driver's checkpoint)" in queue.run("show", str(job)).stdout
            assert event["steps"]["lock"] < 1 and "left" in event["steps"]
        else:  # the driver's checkpoint took what was left
            assert json.loads((usage / f"{pid}.host").read_text()) == {"0": left}
        stopped = counted(counts)
        queue.run("resume", str(job))
        queue.wait_state(job, "running", timeout=60)
        wait_for(lambda: len(counted(counts)) > len(stopped) + 5, 30, "the job to count on")
        assert counted(counts)[: len(stopped) + 5] == list(range(1, len(stopped) + 6))
        assert json.loads((usage / f"{pid}.json").read_text()) == whole
        assert (json.loads(queue.run("show", "--json", str(job)).stdout)["last_suspend_path"]) == path
        queue.run("cancel", str(job))
        queue.wait_state(job, "cancelled")
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        queue.cleanup()


@pytest.mark.parametrize("kept", [True, False])
def test_a_kept_context_counts_as_used_so_a_job_that_needs_its_memory_waits_until_it_is_gone(
    tmp_path: Path, kept: bool
) -> None:
    """One 80 GiB GPU: a --mem 78.5G job needs all of it but the margin (0.5 GiB) and its overhead (1 GiB).
    Beside a suspended job's kept context (0.5 GiB) it waits, and starts once that job is cancelled; beside a
    job the driver's checkpoint emptied (it holds 2 GiB outside PyTorch) it starts at once."""
    queue = fake_cuda_queue(tmp_path, "1x80GiB", GPUQ_FAKE_HOST_MEMORY="256GiB")
    counts = queue.cwd / "counts"
    try:
        job, _ = _counter(queue, counts, *([] if kept else ["2"]))
        queue.run("suspend", str(job))
        queue.wait_state(job, "suspended", timeout=60)
        event = wait_for(lambda: (found := queue.events(job, "suspended")) and found[-1], 30, "the suspended event")
        assert event["path"] == ("fast-context-kept" if kept else "fast")
        big = queue.submit("--mem", "78.5G", "fake_cuda.py", "1", "600")
        if kept:
            waiting = wait_for(lambda: (shown := queue.job(big))["reason"] and shown, 30, "its reason")
            assert waiting["state"] == "pending", waiting
            assert queue.job(job)["state"] == "suspended"
            queue.run("cancel", str(job))
            queue.wait_state(job, "cancelled")
        queue.wait_state(big, "running", timeout=60)
        assert queue.job(job)["state"] == ("cancelled" if kept else "suspended")
    finally:
        queue.cleanup()
