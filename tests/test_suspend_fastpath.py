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

import pytest

from tests.conftest import counted, fake_cuda_queue, wait_for

FIXTURES = Path(__file__).parent / "fixtures"
GiB = 1 << 30


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
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count and be seen")
        for round_ in (1, 2):  # asked again at the second suspend: a refusal is not kept as an answer
            queue.run("suspend", str(job))
            queue.wait_state(job, "suspended", timeout=60)
            event = wait_for(lambda n=round_: len(found := queue.events(job, "suspended")) == n and found[-1], 30, "it")
            assert (event["path"], event["fallback"], event["detail"]) == ("driver", fallback, detail)
            stopped = counted(counts)
            queue.run("resume", str(job))
            queue.wait_state(job, "running")
            at = len(stopped)
            wait_for(lambda at=at: len(counted(counts)) > at + 5, 30, "the job to count on")
            assert counted(counts)[: len(stopped) + 5] == list(range(1, len(stopped) + 6))
        said = {
            "not-applicable": "last by the driver's checkpoint (the fast path does not apply: the process has "
            "not imported torch)",
            "not-asked": "last by the driver's checkpoint (no process of the job answers the fast path's request)",
        }[fallback]
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
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.25"},  # the cooperative fence's
            "per_process_memory_fraction:0.25,expandable_segments:True",
        ),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, None),  # the job chose: kept (no fast path)
    ],
)
def test_a_preemptible_job_is_given_the_handler_and_expandable_segments_unless_it_chose(
    tmp_path: Path, given: dict[str, str], conf: str | None
) -> None:
    """What ``fastpath.prepare`` adds to a --preemptible job's environment, and that the sitecustomize it
    writes installs the handler in a real Python process, then still runs the job's own sitecustomize."""
    from gpuq_scheduler.jobs.fastsuspend import SUSPEND_SIGNAL
    from gpuq_scheduler.launcher.daemon.suspension import fastpath

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
    assert done.stderr == ""
    # A job with no sitecustomize of its own: it once printed "Error in sitecustomize ... KeyError" (Python 3.11).
    alone = {**os.environ, **given, **fastpath.prepare(str(tmp_path / "run" / "8.fast"), given, None)}
    bare = subprocess.run([sys.executable, "-c", "print('ran')"], env=alone, capture_output=True, text=True, check=True)
    assert (bare.stdout, bare.stderr) == ("ran\n", "")
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


@pytest.mark.parametrize(("outside", "path"), [([], "fast-context-kept"), (["2"], "fast")])
def test_kill_9_of_the_daemon_while_a_job_is_suspended_on_the_fast_path_loses_nothing_and_its_fast_dir_goes_at_its_end(
    tmp_path: Path, outside: list[str], path: str
) -> None:
    """#40: a --preemptible fake CUDA job that allocates as PyTorch would takes the fast path (its handler moves
    all but its context out, jobs/fastmove_fake.py): its context alone is kept on its GPU, the job frozen; with
    2 GiB outside PyTorch, the fake driver's checkpoint takes that and the context. The daemon is killed with
    kill -9 while it is suspended. The next daemon keeps its fast directory (its resume asks the job through
    it) but removes a stale one of a job that is no more, resumes it, and the job counts on from where it
    stopped, holding all it held. Its fast directory goes once it ends."""
    queue = fake_cuda_queue(tmp_path, "1x80GiB", GPUQ_FAKE_HOST_MEMORY="256GiB")
    shutil.copy(FIXTURES / "fake_counter.py", queue.cwd / "fake_counter.py")
    counts, usage = queue.cwd / "counts", tmp_path / "usage"
    fast = queue.home / "run"
    try:
        job = queue.submit("--preemptible", "fake_counter.py", "60", str(counts), "1000000", "torch", *outside)
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count and be seen")
        pid = json.loads((fast / f"{job}.pid").read_text())["pid"]
        whole = json.loads((usage / f"{pid}.json").read_text())
        queue.run("suspend", str(job))
        queue.wait_state(job, "suspended", timeout=60)
        event = wait_for(lambda: (found := queue.events(job, "suspended")) and found[-1], 30, "the suspended event")
        left = (512 << 20) + (2 * GiB if outside else 0)
        assert (event["path"], event["fallback"], event["fast_bytes"]) == (path, None, 60 * GiB + (512 << 20) - left)
        # what the fast path left: on its GPU still (its context alone), or taken by the fake driver's checkpoint
        assert json.loads((usage / f"{pid}.{'host' if outside else 'json'}").read_text()) == {"0": left}
        stopped = counted(counts)
        stale = fast / "999.fast"
        stale.mkdir()
        (stale / "1.released").write_text('{"ok": true}')
        queue.kill_daemon()
        queue.run("daemon", "start")
        wait_for(lambda: not stale.exists(), 30, "the stale fast directory to go")
        assert (fast / f"{job}.fast" / f"{pid}.released").exists()
        assert queue.job(job)["state"] == "suspended" and counted(counts) == stopped
        queue.run("resume", str(job))
        queue.wait_state(job, "running", timeout=60)
        wait_for(lambda: len(counted(counts)) > len(stopped) + 5, 30, "the job to count on")
        assert counted(counts)[: len(stopped) + 5] == list(range(1, len(stopped) + 6))
        assert json.loads((usage / f"{pid}.json").read_text()) == whole
        restored = json.loads((fast / f"{job}.fast" / f"{pid}.restored").read_text())
        assert restored["bytes"] == 60 * GiB + (512 << 20) - left
        queue.run("cancel", str(job))
        queue.wait_state(job, "cancelled")
        wait_for(lambda: not (fast / f"{job}.fast").exists(), 30, "its fast directory to go with it")
    finally:
        queue.cleanup()


@pytest.mark.parametrize(
    ("copy", "pool", "available", "left", "said"),
    [
        (30 * GiB, 0, 40 * GiB, None, ""),
        (30 * GiB, 0, 31 * GiB, None, "its 30.0 GiB of GPU state would not fit in the host's 31.0 GiB of available"),
        (30 * GiB, 29 * GiB, 4 * GiB, None, ""),  # its pool holds most of it already
        (
            30 * GiB,
            0,
            100 * GiB,
            8 * GiB,
            "its 30.0 GiB of GPU state would not fit in the 8.0 GiB left under its --ram",
        ),
        (30 * GiB, 24 * GiB, 100 * GiB, 8 * GiB, ""),
    ],
)
def test_a_suspend_is_refused_where_host_memory_or_the_jobs_ram_limit_cannot_hold_its_copy(
    copy: int, pool: int, available: int, left: int | None, said: str
) -> None:
    from gpuq_scheduler.launcher.policy.hostroom import refusal

    found = refusal(copy, pool, available, 2 * GiB, left)
    assert found.startswith(said) and bool(found) == bool(said)


def test_a_jobs_room_under_its_ram_is_its_cgroups_limit_less_what_it_holds_that_cannot_be_reclaimed(
    tmp_path: Path,
) -> None:
    from gpuq_scheduler.launcher.daemon.suspension.hostmem import room

    cgroup = tmp_path / "job-7"
    cgroup.mkdir()
    (cgroup / "memory.current").write_text(f"{2 * GiB}\n")
    (cgroup / "memory.stat").write_text(f"anon {GiB}\nfile {GiB}\nactive_file {GiB // 2}\ninactive_file {GiB // 2}\n")
    (cgroup / "memory.max").write_text("max\n")
    assert room(str(cgroup)) is None and room(None) is None
    (cgroup / "memory.max").write_text(f"{4 * GiB}\n")
    assert room(str(cgroup)) == 3 * GiB  # its page cache is given back first
    assert room(str(tmp_path / "no memory controller")) is None


def test_a_pool_a_job_claims_counts_only_as_far_as_it_holds_memory(tmp_path: Path) -> None:
    """The daemon's host check and the helper's budget leave out a job's pool (pinned already), as far as its
    process really holds memory: its word alone buys no room."""
    from gpuq_scheduler.launcher.daemon.suspension.fastpath import pool_of
    from gpuq_scheduler.launcher.daemon.suspension.hostmem import resident

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; b = bytearray(64 << 20); print(1, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline()
        (tmp_path / f"{holder.pid}.pool").write_text(json.dumps({"bytes": 10 * GiB}))
        held = resident(holder.pid)
        assert 64 << 20 <= pool_of(str(tmp_path), [holder.pid]) <= held < GiB
        (tmp_path / f"{holder.pid}.pool").write_text(json.dumps({"bytes": 1 << 20}))
        assert pool_of(str(tmp_path), [holder.pid]) == 1 << 20
        assert pool_of(None, [holder.pid]) == 0
    finally:
        holder.kill()
        holder.wait()


def test_a_suspend_whose_copy_no_longer_fits_in_host_memory_is_refused_by_its_helper_and_the_job_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suspend helper itself, on a real fake CUDA job with gpuq's real handler: where host memory shrank
    since the daemon's check (taken by something else), nothing is done (the job is not asked, not locked,
    not frozen: the driver's checkpoint would need the same memory, bench/cgroup_checkpoint_probe.py), and
    the result says why; with room again, the fast path."""
    from gpuq_scheduler.launcher.daemon.suspension import fastpath, suspender
    from gpuq_scheduler.launcher.gpus.checkpoint import CudaState, FakeCheckpoint

    usage, fast, counts = tmp_path / "usage", tmp_path / "run" / "7.fast", tmp_path / "counts"
    usage.mkdir()
    env = {**os.environ, "GPUQ_FAKE_USAGE": str(usage), "CUDA_VISIBLE_DEVICES": "0"}
    env.update(fastpath.prepare(str(fast), env, None))
    job = subprocess.Popen(
        [sys.executable, str(FIXTURES / "fake_counter.py"), "30", str(counts), "1000000", "torch"], env=env
    )
    cuda = FakeCheckpoint(usage)
    try:
        ready = lambda: cuda.state(job.pid) is not None and fastpath.catches(job.pid, fastpath.SUSPEND_SIGNAL)  # noqa: E731
        wait_for(ready, 30, "the job to hold its memory with gpuq's handler")
        whole = cuda.held(job.pid)
        monkeypatch.setenv("GPUQ_FAKE_HOST_MEMORY", "31GiB")
        result = suspender.suspend(cuda, None, job.pid, str(fast), whole, fake=True)
        assert (result["ok"], result["undone"]) == (False, True)
        assert result["why"].startswith("its 30.5 GiB of GPU state would not fit in the host's 31.0 GiB")
        assert not (fast / f"{job.pid}.released").exists() and cuda.state(job.pid) is CudaState.RUNNING
        at = len(counted(counts))
        wait_for(lambda: len(counted(counts)) > at + 5, 30, "the job to count on")  # never stopped
        monkeypatch.setenv("GPUQ_FAKE_HOST_MEMORY", "64GiB")
        result = suspender.suspend(cuda, None, job.pid, str(fast), whole, fake=True)
        assert result["ok"] and (result["path"]["path"], result["path"]["fallback"]) == ("fast", None)
        assert json.loads((usage / f"{job.pid}.host").read_text()) == {"0": 512 << 20}
        assert suspender.resume(cuda, None, job.pid, str(fast))["ok"]
        assert cuda.held(job.pid) == whole and job.poll() is None
    finally:
        job.kill()
        job.wait()
