"""Packing that needs no guess and cannot hurt a neighbour, on the fake inventory: --mem auto learns each
kind of job's memory, and every job that shares a GPU is fenced at its share (fake MPS, or the
cooperative PyTorch cap). The jobs are tests/fixtures/fake_cuda.py, which holds memory where gpuq's fake
NVML sees it and meets its fence as a CUDA program would."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq_scheduler.launcher.policy import memory
from gpuq_scheduler.launcher.policy.placement import Policy
from tests.conftest import Gpuq, fake_cuda_queue, wait_for

GiB = 1 << 30


def _client(tmp_path: Path, **extra: str) -> Gpuq:
    return fake_cuda_queue(tmp_path, "2x80GiB", GPUQ_RETRY_BACKOFF="0.2", GPUQ_AUTO_SETTLE="1", **extra)


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[Gpuq]:
    client = _client(tmp_path / "mps", GPUQ_FAKE_MPS="1")
    yield client
    client.cleanup()


@pytest.fixture
def cooperative(tmp_path: Path) -> Iterator[Gpuq]:
    client = _client(tmp_path / "cooperative")
    yield client
    client.cleanup()


def _ended(gpuq: Gpuq, ids: list[int], timeout: float = 90) -> list[dict[str, Any]]:
    done = ("succeeded", "failed", "cancelled", "timeout", "lost")
    return [gpuq.wait_state(job_id, *done, timeout=timeout) for job_id in ids]


def _overlapped(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"] and set(a["gpus"]) & set(b["gpus"]))


def test_a_liar_dies_at_its_share_under_mps_and_its_neighbours_finish(mps: Gpuq) -> None:
    honest = [mps.submit("--mem", "4G", "fake_cuda.py", "3", "3") for _ in range(3)]
    liar = mps.submit("--mem", "4G", "fake_cuda.py", "20", "3")
    running = mps.wait_state(honest[0], "running")
    gpu_dirs = wait_for(lambda: list((mps.home / "mps").glob("GPU-*/*/pipe")), 10, "an MPS control daemon to start")
    assert gpu_dirs  # gpuq started one for the GPU its packed jobs share
    records = _ended(mps, [*honest, liar])
    assert [r["state"] for r in records[:3]] == ["succeeded"] * 3
    assert records[3]["state"] == "failed"
    assert records[3]["reason"] == "CUDA out of memory at its 4.0G share (--mem 4.0G) (exit code 1)"
    log = Path(records[0]["log"]).read_text()
    assert "fence: 5368709120" in log  # its share plus the 1 GiB placement adds for its CUDA context
    assert running["gpus"]
    wait_for(lambda: not list((mps.home / "mps").glob("GPU-*")), 10, "gpuq to quit the idle control daemon")
    report = mps.run("report").stdout
    assert "1 job(s) stopped at their fence" in report  # the morning report counts it, per user and array


def test_with_the_fence_turned_off_a_liar_takes_what_it_wants(tmp_path: Path) -> None:
    """GPUQ_FENCE=none: nothing stops the liar (on real GPUs its neighbours then die, bench/gpu_fence.py), and a
    job that does run out of memory is not said to have met a fence it never had."""
    client = _client(tmp_path, GPUQ_FAKE_MPS="1", GPUQ_FENCE="none", FAKE_CUDA_TOTAL=str(8 * GiB))
    try:
        liar = client.submit("--mem", "4G", "fake_cuda.py", "6", "1")
        (first,) = _ended(client, [liar])  # alone: beside a liar past its share, the greedy one is its victim
        greedy = client.submit("--mem", "4G", "fake_cuda.py", "9", "1")
        (second,) = _ended(client, [greedy])
        assert first["state"] == "succeeded"  # 6 GiB on its 4 GiB share
        assert second["reason"] == "CUDA out of memory (exit code 1)"  # more than the whole (8 GiB) GPU
        rows = __import__("json").loads(client.run("gpus", "--json").stdout)
        assert [row["fence"] for row in rows] == ["none", "none"]
        assert not (client.home / "mps").exists()
    finally:
        client.cleanup()


def test_without_mps_the_fence_is_pytorchs_cap_and_the_liar_still_dies_at_its_share(cooperative: Gpuq) -> None:
    honest = cooperative.submit("--mem", "4G", "fake_cuda.py", "3", "2")
    liar = cooperative.submit("--mem", "4G", "fake_cuda.py", "20", "2")
    first, second = _ended(cooperative, [honest, liar])
    assert first["state"] == "succeeded"
    assert second["reason"] == "CUDA out of memory at its 4.0G share (--mem 4.0G) (exit code 1)"
    assert "fence: 4831838208" in Path(first["log"]).read_text()  # 4 GiB of 80 as a fraction, and its context
    assert not (cooperative.home / "mps").exists()  # no MPS without a driver that has it
    # The liar's log ends saying that its fence stopped it, as a cancel or a time limit says so (issue 27).
    said = wait_for(lambda: "gpuq: job" in (text := Path(second["log"]).read_text()) and text, 10, "gpuq's line")
    last = said.splitlines()[-1]
    assert last.startswith(f"gpuq: job {liar} stopped at ") and last.endswith(f": {second['reason']}"), said
    assert "gpuq: job" not in Path(first["log"]).read_text()


def test_gpuq_gpus_says_which_fence_each_gpu_has(mps: Gpuq, cooperative: Gpuq) -> None:
    for client, fence in ((mps, "mps"), (cooperative, "cooperative")):
        _ended(client, [client.submit("--gpus", "0", "true")])
        rows = __import__("json").loads(client.run("gpus", "--json").stdout)
        assert [row["fence"] for row in rows] == [fence, fence]
        assert "FENCE" in client.run("gpus").stdout


@pytest.fixture
def probing(tmp_path: Path) -> Iterator[Gpuq]:
    """A queue whose first run of a kind probes (GPUQ_AUTO_FIRST=probe) instead of starting on a first share."""
    client = _client(tmp_path / "probing", GPUQ_FAKE_MPS="1", GPUQ_AUTO_FIRST="probe")
    yield client
    client.cleanup()


def test_mem_auto_runs_one_probe_then_packs_the_array_at_its_learned_peak(probing: Gpuq) -> None:
    mps = probing
    array = int(
        __import__("json").loads(
            mps.run("submit", "--json", "--mem", "auto", "--array", "0-5", "fake_cuda.py", "3", "4").stdout
        )["id"]
    )
    members = list(range(array + 1, array + 7))
    probe = mps.wait_state(members[0], "running")
    assert probe["mem_per_gpu"] is None and probe["mem_from"] == "a probe on a whole GPU: no earlier run of its kind"
    # The others wait for its peak: that they were pending at this moment held only until it settled (1 s), on
    # a quick enough machine; that each was placed at the learned share (below) is the event itself.
    records = _ended(mps, members)
    assert all(r["state"] == "succeeded" for r in records)
    # Once it settled, the probe held only its learned share: its GPU took packed members beside it.
    assert records[0]["mem_from"].startswith(f"a probe; since it settled, 4.2G learned from job {members[0]}")
    learned = records[1:]
    prefix = f"4.2G learned from job {members[0]} (running): peak 3.5G"
    assert [r["mem_from"] for r in learned] == [prefix] * 5
    share = memory.reservation(int(3.5 * GiB)) - Policy().overhead  # NVML's peak includes the context
    assert [r["mem_per_gpu"] for r in learned] == [share] * 5
    assert any(_overlapped(a, b) for i, a in enumerate(learned) for b in learned[i + 1 :])  # packed on a GPU
    shown = mps.run("show", str(members[1])).stdout
    assert "--mem auto: 4.2G learned from job" in shown


def test_an_auto_job_that_outgrows_its_share_comes_back_with_twice_and_its_kind_learns(
    mps: Gpuq, tmp_path: Path
) -> None:
    first = mps.submit("--name", "grower", "--mem", "auto", "fake_cuda.py", "2", "3")
    (probe,) = _ended(mps, [first])
    assert probe["state"] == "succeeded" and probe["peak_mem"] == int(2.5 * (1 << 30))
    # Each attempt grows at once; the one that fits holds its 4.0G until its peak was sampled (it once grew
    # halfway through 3 s, and a loaded machine's samples could miss its last 1.5 s: the kind learned 2.5G).
    grow, done = tmp_path / "grow", tmp_path / "done"
    grow.touch()
    grower = mps.submit(
        "--name",
        "grower",
        "--mem",
        "auto",
        "fake_cuda.py",
        "2",
        "0",
        "--grow-to",
        "3.5",
        "--grow-when",
        str(grow),
        "--end-when",
        str(done),
    )
    wait_for(
        lambda: (job := mps.job(grower))["attempt"] == 2 and (job["peak_mem"] or 0) >= 4 * GiB,
        120,
        "its second attempt's 4.0G to be sampled",
    )
    done.touch()
    (record,) = _ended(mps, [grower])
    assert record["state"] == "succeeded" and record["attempt"] == 2
    events = mps.home.joinpath("events.jsonl").read_text().splitlines()
    assert [e for e in events if "CUDA out of memory at its 2.0G share (--mem auto)" in e] != [], events
    assert record["mem_from"].startswith("4.0G learned: twice its share after job")
    after = mps.submit("--name", "grower", "--mem", "auto", "fake_cuda.py", "1", "1")
    (third,) = _ended(mps, [after])
    assert third["mem_from"] == f"4.8G learned from job {grower}: peak 4.0G"


def test_like_learns_from_the_job_it_names(mps: Gpuq) -> None:
    model = mps.submit("fake_cuda.py", "5", "3")  # a whole GPU, no --mem: its peak is recorded all the same
    _ended(mps, [model])
    copy = mps.submit("--like", str(model), "fake_cuda.py", "5", "1")
    (record,) = _ended(mps, [copy])
    assert record["state"] == "succeeded"
    assert record["mem_from"] == f"6.6G learned from job {model}: peak 5.5G"


def test_mem_auto_is_refused_for_cpu_jobs_and_like_for_unknown_jobs(mps: Gpuq) -> None:
    cpu = mps.run("submit", "--gpus", "0", "--mem", "auto", "true", check=False)
    assert cpu.returncode == 2 and "--mem auto" in cpu.stderr and len(cpu.stderr.splitlines()) == 1
    unknown = mps.run("submit", "--like", "999", "true", check=False)
    assert unknown.returncode == 2 and "--like 999" in unknown.stderr
    assert mps.status() == []


def test_an_array_without_mem_keeps_whole_gpus(mps: Gpuq) -> None:
    """auto is not the default for arrays (docs/packing.md): a member without --mem has a GPU to itself."""
    array = mps.submit("--array", "0-1", "fake_cuda.py", "1", "1")
    records = _ended(mps, [array + 1, array + 2])
    assert all(r["mem_per_gpu"] is None and not r["mem_from"] for r in records)


def test_control_daemons_left_by_a_killed_daemon_are_quit_once_their_jobs_end(mps: Gpuq) -> None:
    job = mps.submit("--mem", "4G", "fake_cuda.py", "1", "4")
    mps.wait_state(job, "running")
    wait_for(lambda: list((mps.home / "mps").glob("GPU-*")), 10, "an MPS control daemon to start")
    mps.kill_daemon()
    mps.wait_exit_file(job)  # the job ends while no daemon runs
    mps.run("daemon", "start")
    (record,) = _ended(mps, [job])
    assert record["state"] == "succeeded"
    wait_for(lambda: not list((mps.home / "mps").glob("GPU-*")), 10, "the new daemon to quit the old control daemon")


def _fake_mps_server(pipe_root: Path) -> subprocess.Popen[bytes]:
    """A process named as NVIDIA's MPS server, with the pipe directory a control daemon under ``pipe_root``
    gives its server (the real one cannot run without a GPU)."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_root / "GPU-fake-0000" / str(os.getuid()) / "pipe")}
    return subprocess.Popen(["bash", "-c", "exec -a nvidia-cuda-mps-server sleep 60"], env=env)


def test_gpuqs_own_mps_servers_are_not_counted_as_outside_use(mps: Gpuq) -> None:
    """Measured on an H100: the MPS server of gpuq's fence holds 66 MiB, which `gpuq gpus` and `gpuq top`
    first showed as a teammate's. A server of another control daemon still counts as outside use."""
    from gpuq_scheduler.launcher.gpus.mps import server_pids

    ours, theirs = _fake_mps_server(mps.home / "mps"), _fake_mps_server(mps.home.parent / "elsewhere")
    try:
        wait_for(lambda: Path(f"/proc/{ours.pid}/cmdline").read_bytes().startswith(b"nvidia-cuda-mps-server"), 10)
        wait_for(lambda: Path(f"/proc/{theirs.pid}/cmdline").read_bytes().startswith(b"nvidia-cuda-mps-server"), 10)
        assert server_pids(mps.home / "mps", [ours.pid, theirs.pid, os.getpid()]) == {ours.pid}
        usage = Path(mps.env["GPUQ_FAKE_USAGE"])
        for server in (ours, theirs):
            (usage / f"{server.pid}.json").write_text(json.dumps({"0": 66 << 20}))
        rows = json.loads(mps.run("gpus", "--json").stdout)
        assert rows[0]["used_outside_gpuq"] == 66 << 20  # theirs only
    finally:
        for server in (ours, theirs):
            server.kill()
            server.wait()
