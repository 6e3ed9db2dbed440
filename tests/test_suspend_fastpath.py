"""The fast suspend's path choice and fallbacks (#40), with real daemons and real job processes on the fake
inventory: a --preemptible Python job gets gpuq's handler at its start (PYTHONPATH's sitecustomize, PyTorch's
expandable segments), is asked first at each suspend, and answers; where it cannot take the fast path (here:
no torch, no GPU), the driver's (fake) checkpoint takes it as before, and the ``suspended`` event says which
path ran and why. The fast path itself needs a GPU: tests/test_suspend_gpu.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Gpuq, fake_cuda_queue, wait_for

FIXTURES = Path(__file__).parent / "fixtures"
GiB = 1 << 30


def _counts(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _suspended_events(queue: Gpuq, job: int) -> list[dict[str, Any]]:
    events = queue.home / "events.jsonl"
    found = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
    return [e for e in found if e.get("job") == job and e.get("event") == "suspended"]


@pytest.mark.parametrize(
    ("more", "fallback", "detail"),
    [
        (["--preemptible"], "not-applicable", "the process has not imported torch"),
        ([], "not-asked", ""),
    ],
)
def test_a_job_the_fast_path_cannot_take_is_suspended_by_the_driver_and_the_event_says_why(
    tmp_path: Path, more: list[str], fallback: str, detail: str
) -> None:
    queue = fake_cuda_queue(tmp_path, "1x80GiB", GPUQ_FAKE_HOST_MEMORY="256GiB")
    shutil.copy(FIXTURES / "fake_counter.py", queue.cwd / "fake_counter.py")
    counts = queue.cwd / "counts"
    try:
        job = queue.submit(*more, "fake_counter.py", "60", str(counts), "100000")
        wait_for(lambda: len(_counts(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count and be seen")
        for round_ in (1, 2):  # asked again at the second suspend: a refusal is not kept as an answer
            queue.run("suspend", str(job))
            queue.wait_state(job, "suspended", timeout=60)
            event = wait_for(lambda n=round_: len(found := _suspended_events(queue, job)) == n and found[-1], 30, "it")
            assert (event["path"], event["fallback"], event["detail"]) == ("driver", fallback, detail)
            stopped = _counts(counts)
            queue.run("resume", str(job))
            queue.wait_state(job, "running")
            at = len(stopped)
            wait_for(lambda at=at: len(_counts(counts)) > at + 5, 30, "the job to count on")
            assert _counts(counts)[: len(stopped) + 5] == list(range(1, len(stopped) + 6))
        said = {"not-applicable": "last by the driver's checkpoint (the fast path does not apply: the process has "
                "not imported torch)", "not-asked": "last by the driver's checkpoint (no process of the job answers "
                "the fast path's request)"}[fallback]  # fmt: skip
        assert said in queue.run("show", str(job)).stdout
        shown = json.loads(queue.run("show", "--json", str(job)).stdout)
        assert (shown["last_suspend_path"], shown["last_suspend_fallback"]) == ("driver", fallback)
        fast = queue.home / "run" / f"{job}.fast"
        assert fast.is_dir() == bool(more)  # only a --preemptible job is given the handler
        queue.run("cancel", str(job))
        queue.wait_state(job, "cancelled")
    finally:
        queue.cleanup()


@pytest.mark.parametrize(
    ("given", "conf"),
    [
        ({}, "expandable_segments:True"),
        ({"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.25"},  # the cooperative fence's
         "per_process_memory_fraction:0.25,expandable_segments:True"),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, None),  # the job chose: kept (no fast path)
    ],
)  # fmt: skip
def test_a_preemptible_job_is_given_the_handler_and_expandable_segments_unless_it_chose(
    tmp_path: Path, given: dict[str, str], conf: str | None
) -> None:
    """What ``fastpath.prepare`` adds to a --preemptible job's environment, and that the sitecustomize it
    writes installs the handler in a real Python process, then still imports the job's own sitecustomize."""
    from gpuq_scheduler.jobs.fastsuspend import SUSPEND_SIGNAL
    from gpuq_scheduler.launcher.daemon import fastpath

    own = tmp_path / "own site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITE'] = 'loaded'\n")
    fast = str(tmp_path / "run" / "7.fast")
    added = fastpath.prepare(fast, {**given, "PYTHONPATH": str(own)}, None)
    assert added.get("PYTORCH_CUDA_ALLOC_CONF") == conf
    assert added["GPUQ_FASTSUSPEND_DIR"] == fast and added["PYTHONPATH"].split(os.pathsep)[1] == str(own)
    env = {**os.environ, **given, **added}
    probe = "import os, signal; print(os.environ.get('OWN_SITE'), signal.getsignal({}) not in (signal.SIG_DFL, None))"
    done = subprocess.run(
        [sys.executable, "-c", probe.format(int(SUSPEND_SIGNAL))], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["loaded", "True"]
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        wait_for(lambda: fastpath.catches(job.pid, SUSPEND_SIGNAL), 30, "the handler to be installed")
        released = fastpath.release([job.pid], {job.pid}, fast, 0)  # a real request, answered by the real handler
        assert (released.path.value, released.fallback, released.detail) == (
            "driver",
            fastpath.Fallback.NOT_APPLICABLE,
            "the process has not imported torch",
        )
        assert job.poll() is None  # asked, not ended
    finally:
        job.kill()
        job.wait()
