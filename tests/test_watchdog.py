"""The GPU watchdog on the fake inventory, with real processes and a real daemon: a packed job that leaves
its fence and takes more than its share is stopped with the blame on it while its honest neighbours finish;
a job that points itself at a GPU it was not given is stopped; a process left on a GPU after its job ended
is ended and its job's record says so; and with a rule set to "warn" the watchdog only says it.

The jobs are tests/fixtures/fake_cuda.py, which holds memory where the fake NVML lists it per process, on
the GPU its own CUDA_VISIBLE_DEVICES names, as CUDA would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq_scheduler.launcher.daemon.attribution import MARKER, queue_key
from tests.conftest import Gpuq, fake_cuda_queue, wait_for

DONE = ("succeeded", "failed", "cancelled", "timeout", "lost")
# A liar of the kind: it drops every fence variable gpuq gave it, then takes 22 GiB.
LIAR = (
    "exec env -u CUDA_MPS_PIPE_DIRECTORY -u CUDA_MPS_PINNED_DEVICE_MEM_LIMIT -u PYTORCH_CUDA_ALLOC_CONF "
    "python fake_cuda.py 22 60\n"
)
# A job that points itself at the GPU it was not given (of two), as a launcher with its own idea would.
ELSEWHERE = "export CUDA_VISIBLE_DEVICES=$((1 - GPUQ_GPUS)); exec python fake_cuda.py 2 60\n"


def _queue(tmp_path: Path, gpus: str = "2x80GiB", **extra: str) -> Gpuq:
    client = fake_cuda_queue(tmp_path, gpus, **extra)
    (client.cwd / "liar.sh").write_text(LIAR)
    (client.cwd / "elsewhere.sh").write_text(ELSEWHERE)
    return client


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[Gpuq]:
    client = _queue(tmp_path, "1x80GiB", GPUQ_FAKE_MPS="1")  # one GPU: the liar and its neighbours share it
    yield client
    client.cleanup()


def _events(gpuq: Gpuq, kind: str = "watchdog") -> list[dict[str, Any]]:
    path = gpuq.home / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [event for event in map(json.loads, lines) if event.get("event") == kind]


def test_a_packed_liar_that_drops_its_fence_is_stopped_and_its_honest_neighbours_succeed(mps: Gpuq) -> None:
    honest = [mps.submit("--mem", "4G", "fake_cuda.py", "3", "8") for _ in range(3)]
    liar = mps.submit("--mem", "4G", "sh", "liar.sh")
    stopped = mps.wait_state(liar, *DONE, timeout=60)
    assert stopped["reason"] == "stopped by the watchdog: held 22.5 GiB on GPU 0 against its 4.0G share"
    assert (stopped["state"], stopped["cause"]) == ("failed", "watchdog")
    records = [mps.wait_state(job, *DONE, timeout=60) for job in honest]
    assert [r["state"] for r in records] == ["succeeded"] * 3
    [event] = _events(mps)
    assert (event["job"], event["rule"], event["action"], event["gpu"]) == (liar, "past-share", "stop", 0)


def test_a_job_that_points_itself_at_a_gpu_it_was_not_given_is_stopped(tmp_path: Path) -> None:
    client = _queue(tmp_path)
    try:
        neighbour = client.submit("--gpus", "1", "fake_cuda.py", "1", "6")
        intruder = client.submit("--gpus", "1", "sh", "elsewhere.sh")
        stopped = client.wait_state(intruder, *DONE, timeout=60)
        other = 1 - stopped["gpus"][0]
        assert stopped["reason"] == f"stopped by the watchdog: used GPU {other}, which it was not given"
        assert (stopped["state"], stopped["cause"]) == ("failed", "watchdog")
        assert client.wait_state(neighbour, *DONE, timeout=60)["state"] == "succeeded"
        assert [e["rule"] for e in _events(client)] == ["other-gpu"]
    finally:
        client.cleanup()


def test_with_warn_the_watchdog_says_it_and_stops_nothing(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[watchdog]\npast_share = "warn"\nother_gpu = "warn"\n')
    client = _queue(tmp_path / "q", GPUQ_CONFIG=str(config))
    (client.cwd / "liar.sh").write_text(LIAR.replace(" 22 60", " 22 5"))
    (client.cwd / "elsewhere.sh").write_text(ELSEWHERE.replace(" 2 60", " 2 5"))
    try:
        liar = client.submit("--mem", "4G", "sh", "liar.sh")
        intruder = client.submit("--gpus", "1", "sh", "elsewhere.sh")
        assert client.wait_state(liar, *DONE, timeout=60)["state"] == "succeeded"
        assert client.wait_state(intruder, *DONE, timeout=60)["state"] == "succeeded"
        said = {(e["job"], e["rule"], e["action"]) for e in _events(client)}
        assert said == {(liar, "past-share", "warn"), (intruder, "other-gpu", "warn")}
        assert len(_events(client)) == 2  # once each, not at every sample
        log = (client.home / "daemon.log").read_text()
        assert "against its 4.0G share (watchdog.past_share = warn: not stopped)" in log
    finally:
        client.cleanup()


def test_a_process_left_on_a_gpu_after_its_job_ended_is_ended_and_said_so(tmp_path: Path) -> None:
    """A grandchild that escaped its job (here: started by the test with the job's marker, as one that left
    its session would carry it) still holds GPU memory after the job succeeded: the watchdog ends it."""
    client = _queue(tmp_path)
    try:
        job = client.submit("fake_cuda.py", "0.1", "0.1")
        assert client.wait_state(job, *DONE)["state"] == "succeeded"
        env = {**client.env, MARKER: f"{queue_key(client.home)}/{job}", "CUDA_VISIBLE_DEVICES": "1"}
        stray = subprocess.Popen([sys.executable, "fake_cuda.py", "2", "120"], cwd=client.cwd, env=env)
        try:
            wait_for(lambda: stray.poll() is not None, 30, "the watchdog to end the stray process")
        finally:
            if stray.poll() is None:
                stray.kill()
                stray.wait()
        assert stray.returncode == -9
        reason = client.job(job)["reason"]
        assert reason == f"process {stray.pid} was still on GPU 1 after the job ended and was ended by the watchdog"
        assert client.job(job)["state"] == "succeeded"  # what it did before stays what it did
        [event] = _events(client)
        assert (event["job"], event["rule"], event["pids"]) == (job, "leftover", [stray.pid])
    finally:
        client.cleanup()


def test_a_process_that_left_its_jobs_process_tree_still_counts_as_the_jobs(tmp_path: Path) -> None:
    """A grandchild that left its job's session and process tree (here: started by the test with the job's
    marker) holds memory on the job's GPU: the daemon counts it as the job's (its peak), not a teammate's,
    and the watchdog leaves it alone while it keeps within what the job was given."""
    client = _queue(tmp_path)
    try:
        job = client.submit("--gpus", "1", "fake_cuda.py", "0.5", "120")
        running = client.wait_state(job, "running")
        env = {
            **client.env,
            MARKER: f"{queue_key(client.home)}/{job}",
            "CUDA_VISIBLE_DEVICES": str(running["gpus"][0]),
        }
        stray = subprocess.Popen([sys.executable, "fake_cuda.py", "3", "120"], cwd=client.cwd, env=env)
        try:
            wait_for(lambda: (client.job(job)["peak_mem"] or 0) >= 3.5 * (1 << 30), 30, "its peak to count it")
            assert stray.poll() is None and client.job(job)["state"] == "running"
        finally:
            stray.kill()
            stray.wait()
        assert _events(client) == []
    finally:
        client.cleanup()


def test_a_process_of_no_job_is_never_touched(tmp_path: Path) -> None:
    """A teammate's program on a GPU with a job's marker of another queue, or none at all: left alone."""
    client = _queue(tmp_path)
    try:
        job = client.submit("fake_cuda.py", "0.1", "0.1")
        assert client.wait_state(job, *DONE)["state"] == "succeeded"
        others = [
            {**client.env, "CUDA_VISIBLE_DEVICES": "0"},
            {**client.env, MARKER: f"{queue_key(tmp_path / 'another queue')}/{job}", "CUDA_VISIBLE_DEVICES": "1"},
        ]
        strays = [subprocess.Popen([sys.executable, "fake_cuda.py", "1", "120"], cwd=client.cwd, env=e) for e in others]
        try:
            # A job that starts after them sees the watchdog run over them for several samples.
            later = client.submit("--mem", "4G", "fake_cuda.py", "0.1", "6")
            assert client.wait_state(later, *DONE)["state"] == "succeeded"
            assert all(stray.poll() is None for stray in strays)
        finally:
            for stray in strays:
                stray.kill()
                stray.wait()
        assert _events(client) == []
    finally:
        client.cleanup()


def test_an_unknown_watchdog_setting_is_refused_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[watchdog]\npast_share = "kill"\n')
    client = _queue(tmp_path / "q", GPUQ_CONFIG=str(config))
    result = client.run("daemon", "start", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f'gpuq: {config}: watchdog.past_share must be "stop" or "warn", not \'kill\''
    ]
    assert client.daemon_pid() is None  # nothing started


def test_the_watchdog_reads_the_energy_counters_only_while_a_job_holds_a_gpu(tmp_path: Path) -> None:
    """NVML takes ~3 ms of CPU per GPU to read one on an H200: an idle box never pays it, and the daemon's pass
    (placement) never does; the watchdog, after the pass's starts, does while a job holds a GPU."""
    import os

    from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Launch
    from gpuq_scheduler.jobs.outcome import JobState
    from gpuq_scheduler.jobs.store.statedir import StateDir
    from gpuq_scheduler.launcher.daemon.lives import Running
    from gpuq_scheduler.launcher.daemon.scheduler import Scheduler
    from gpuq_scheduler.launcher.daemon.watching.sight import Readings
    from gpuq_scheduler.launcher.gpus.fake import FakeGpus
    from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot

    asked: list[tuple[bool, bool]] = []

    class Asked(FakeGpus):  # the fake inventory, each snapshot's request written down
        def snapshot(self, *, energy: bool = False, process_utilization: bool = False) -> list[GpuSnapshot]:
            asked.append((energy, process_utilization))
            return super().snapshot(energy=energy, process_utilization=process_utilization)

    state = StateDir(tmp_path / "home")
    state.ensure()
    scheduler = Scheduler(state, Asked("1x80GiB"))
    try:
        plain = scheduler.snapshot()  # the pass's
        with scheduler.table.batch():
            scheduler.watch.check(scheduler.lives, scheduler.table, scheduler, 100.0, Readings(scheduler.source, plain))
        assert asked == [(False, False)]
        spec = JobSpec(command=("true",), cwd="/tmp", env={}, gpus=1)
        record = JobRecord(
            id=1,
            spec=spec,
            uid=os.getuid(),
            user="me",
            state=JobState.RUNNING,
            submitted_at=0.0,
            started_at=0.0,
            gpus=(0,),
            log="",
        )
        launch = Launch(shim_pid=0, shim_start=None, boot_id=scheduler.boot_id, port=None)
        scheduler.lives.add(record)
        scheduler.lives.start(Running(record, launch))
        for now in (101.0, 103.0, 103.5):  # within 2 s of the last check; due; within 2 s again
            with scheduler.table.batch():
                scheduler.watch.check(
                    scheduler.lives, scheduler.table, scheduler, now, Readings(scheduler.source, plain)
                )
        assert asked == [(False, False), (True, False)]
    finally:
        scheduler.lives.end(1)
        scheduler.close()
