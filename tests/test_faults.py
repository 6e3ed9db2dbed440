"""Faults from outside gpuq: a teammate fills a GPU, a GPU falls off the bus, the machine restarts, a job
floods its log, the disk fills up. The queue notices, says so, and keeps going on what still works."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.supervisor import processes
from gpuq_scheduler.launcher.views import doctor
from tests.conftest import REPORT, Gpuq, make_env, read_reports, wait_for

GiB = 1 << 30
FOUR_GPUS: list[dict[str, Any]] = [{"name": "Fake GPU", "total": "80GiB"} for _ in range(4)]
Inventory = Callable[[list[dict[str, Any]]], None]


@pytest.fixture
def inventory(gpuq: Gpuq) -> Inventory:
    """The fake GPU inventory as a JSON file the daemon re-reads at every look; call it to change the GPUs."""
    path = gpuq.cwd.parent / "fake gpus.json"

    def write(gpus: list[dict[str, Any]]) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"gpus": gpus}))
        os.replace(tmp, path)  # the daemon never reads half a file

    write(FOUR_GPUS)
    gpuq.env["GPUQ_FAKE_GPUS"] = str(path)
    return write


def records(gpuq: Gpuq) -> dict[int, JobRecord]:
    return {r.id: r for r in Queue(StateDir(gpuq.home)).records()}


def wait_running(gpuq: Gpuq, job_ids: list[int]) -> dict[int, JobRecord]:
    def all_running() -> dict[int, JobRecord] | None:
        now = records(gpuq)
        return now if all(now[j].state is JobState.RUNNING for j in job_ids) else None

    found: dict[int, JobRecord] = wait_for(all_running, 30, f"jobs {job_ids} running")
    return found


def gpu_rows(gpuq: Gpuq) -> list[dict[str, Any]]:
    return list(json.loads(gpuq.run("gpus", "--json").stdout))


def changed(gpus: list[dict[str, Any]], index: int, **fields: Any) -> list[dict[str, Any]]:
    return [{**gpu, **fields} if i == index else dict(gpu) for i, gpu in enumerate(gpus)]


# -- GPU faults ------------------------------------------------------------------------------------------


def test_a_gpu_filled_from_outside_gpuq_gets_no_new_job_while_the_queue_goes_on(
    gpuq: Gpuq, inventory: Inventory
) -> None:
    report = gpuq.cwd / "seen.jsonl"
    early = [gpuq.submit("--gpus", "1", str(REPORT), str(report), "1.5") for _ in range(4)]
    full = wait_running(gpuq, early)[early[0]].gpus[0]
    inventory(changed(FOUR_GPUS, full, used="80GiB"))  # a teammate's notebook takes all of it, mid-run

    late = [gpuq.submit("--gpus", "1", "--mem", "4G", str(REPORT), str(report), "0.1") for _ in range(6)]
    late += [gpuq.submit("--gpus", "1", str(REPORT), str(report), "0.1") for _ in range(3)]
    late.append(gpuq.submit("--gpus", "2", "--mode", "dataparallel", str(REPORT), str(report), "0.1"))
    assert gpuq.run("wait", *map(str, early + late), timeout=120).returncode == 0

    final = records(gpuq)
    assert all(final[j].state is JobState.SUCCEEDED for j in early + late)  # the job already there ran on
    assert [j for j in late if full in final[j].gpus] == []
    seen = {line["job"]: line["cvd"] for line in read_reports(report)}
    assert all(seen[j] == ",".join(map(str, final[j].gpus)) for j in late)
    assert gpu_rows(gpuq)[full]["free"] == 0


def test_memory_a_teammate_uses_counts_as_outside_gpuq_so_no_whole_gpu_job_goes_there(
    gpuq: Gpuq, inventory: Inventory
) -> None:
    inventory(changed(FOUR_GPUS, 1, used="30GiB"))
    report = gpuq.cwd / "seen.jsonl"
    whole = [gpuq.submit("--gpus", "1", str(REPORT), str(report), "0.3") for _ in range(4)]
    packed = gpuq.submit("--gpus", "1", "--mem", "40G", str(REPORT), str(report), "1")
    assert gpuq.run("wait", *map(str, [*whole, packed]), timeout=60).returncode == 0
    final = records(gpuq)
    assert [j for j in whole if 1 in final[j].gpus] == []  # "under 1 GiB of outside use" (docs/architecture.md)
    assert gpu_rows(gpuq)[1]["used_outside_gpuq"] == 30 * GiB


def test_a_lost_gpu_gets_no_new_job_shows_as_lost_and_the_queue_goes_on(gpuq: Gpuq, inventory: Inventory) -> None:
    holder = gpuq.submit("--gpus", "1", "sleep", "300")
    lost = wait_running(gpuq, [holder])[holder].gpus[0]
    inventory(changed(FOUR_GPUS, lost, lost=True))
    wait_for(lambda: gpu_rows(gpuq)[lost]["state"].startswith("lost: "), 60, "gpuq gpus to show the GPU lost")

    report = gpuq.cwd / "seen.jsonl"
    late = [gpuq.submit("--gpus", "1", "--mem", "4G", str(REPORT), str(report), "0.1") for _ in range(6)]
    late += [gpuq.submit("--gpus", "1", str(REPORT), str(report), "0.1") for _ in range(3)]
    late.append(gpuq.submit("--gpus", "3", str(REPORT), str(report), "0.1"))
    assert gpuq.run("wait", *map(str, late), timeout=120).returncode == 0
    final = records(gpuq)
    assert [j for j in late if lost in final[j].gpus] == []
    assert all(final[j].state is JobState.SUCCEEDED for j in late)
    assert {line["job"] for line in read_reports(report)} == set(late)
    rows = gpu_rows(gpuq)
    assert rows[lost]["state"].startswith("lost: ") and all(r["state"] == "ok" for r in rows if r["index"] != lost)


def test_a_job_on_a_gpu_that_is_lost_is_stopped_and_recorded_as_lost(gpuq: Gpuq, inventory: Inventory) -> None:
    job = gpuq.submit("--gpus", "1", "sleep", "300")
    gpu = wait_running(gpuq, [job])[job].gpus[0]
    pid = json.loads(wait_for(lambda: _read(gpuq.home / "run" / f"{job}.pid"), 60, "the job's pid file"))
    inventory(changed(FOUR_GPUS, gpu, lost=True))
    ended = wait_for(lambda: (r := records(gpuq)[job]).state.finished and r, 15, "the job to be stopped")
    assert ended.state is JobState.LOST
    assert f"GPU {gpu}" in ended.reason and "lost" in ended.reason
    assert not processes.is_alive(pid["pid"], pid["start"])


def _read(path: Path) -> str | None:
    try:
        return path.read_text() or None
    except FileNotFoundError:
        return None


# -- a reboot ---------------------------------------------------------------------------------------------


def test_jobs_running_when_the_machine_restarted_are_lost_and_their_gpus_go_to_the_next_job(gpuq: Gpuq) -> None:
    report = gpuq.cwd / "seen.jsonl"
    before = gpuq.submit("--gpus", "4", "sleep", "300")
    after = gpuq.submit("--gpus", "4", str(REPORT), str(report), "0")
    wait_running(gpuq, [before])
    job = json.loads(wait_for(lambda: _read(gpuq.home / "run" / f"{before}.pid"), 60, "the job's pid file"))
    gpuq.run("daemon", "stop")
    db = sqlite3.connect(gpuq.home / "jobs.db")
    try:
        shim_pid, shim_start = db.execute("SELECT shim_pid, shim_start FROM jobs WHERE id=?", (before,)).fetchone()
        with db:  # what a reboot looks like to the next daemon: the job was started under another boot id
            db.execute("UPDATE jobs SET boot_id='a-boot-before-this-one' WHERE id=?", (before,))
    finally:
        db.close()
    try:
        gpuq.run("daemon", "start")
        lost = gpuq.wait_state(before, "lost")
        assert lost["reason"] == "the machine restarted while it ran"
        done = gpuq.wait_state(after, "succeeded", "failed")
        assert done["state"] == "succeeded" and done["gpus"] == [0, 1, 2, 3]
        assert [line["cvd"] for line in read_reports(report)] == ["0,1,2,3"]
        assert [p for p in doctor.check(StateDir(gpuq.home)) if p.severity == "error"] == []
    finally:  # no reboot really happened: the "lost" job and its supervisor still run, so stop them here
        if processes.is_alive(job["pid"], job["start"]):
            os.killpg(job["pid"], signal.SIGKILL)
        if processes.is_alive(shim_pid, shim_start):
            os.kill(shim_pid, signal.SIGKILL)


# -- a job that floods its log ----------------------------------------------------------------------------

LIMIT = 1 << 20
MARKER = f"gpuq: log limit of {LIMIT} bytes reached; further output discarded\n".encode()


def test_a_job_that_floods_its_log_is_cut_at_the_limit_and_still_succeeds(gpuq: Gpuq) -> None:
    gpuq.env["GPUQ_LOG_LIMIT"] = str(LIMIT)  # read by the daemon this submit starts, inherited by its shims
    (gpuq.cwd / "flood.py").write_text(
        "import sys\nline = 'x' * 99 + '\\n'\nfor _ in range(50_000):\n    sys.stdout.write(line)\n"
        "sys.stderr.write('the end\\n')\n"
    )  # 5 MB, five times the limit
    job = gpuq.submit("--gpus", "0", "flood.py")
    assert gpuq.run("wait", str(job)).returncode == 0
    record = gpuq.job(job)
    log = Path(record["log"]).read_bytes()
    assert record["state"] == "succeeded"
    assert log.endswith(MARKER) and len(log) <= LIMIT + 1 + len(MARKER)
    assert log[:LIMIT] == (b"x" * 99 + b"\n") * (LIMIT // 100) + b"x" * (LIMIT % 100)


def test_output_written_just_before_the_job_ends_is_kept_even_when_a_child_holds_its_output_open(gpuq: Gpuq) -> None:
    escaped = gpuq.cwd / "escaped.pid"
    script = f"sleep 300 & setsid sh -c 'echo $$ > \"{escaped}\"; exec sleep 300' & printf 'last words'"
    job = gpuq.submit("--gpus", "0", "sh", "-c", script)
    try:
        assert gpuq.run("wait", str(job), timeout=60).returncode == 0
        assert Path(gpuq.job(job)["log"]).read_bytes() == b"last words"
    finally:  # the process that left the job's process group is not gpuq's to stop: stop it here
        with contextlib.suppress(AssertionError, ValueError, ProcessLookupError):
            os.kill(int(wait_for(lambda: _read(escaped), 60, "the escaped process's pid")), signal.SIGKILL)


# -- a full disk ------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk_gpuq(tmp_path: Path) -> Iterator[Gpuq]:
    """gpuq with its state directory on a 1 MiB tmpfs of its own, which a test can fill."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "small disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    work = tmp_path / "work dir"
    work.mkdir()
    home = disk / "state dir"
    client = Gpuq(home, make_env(home), work)
    try:
        yield client
    finally:
        client.cleanup()
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(path: Path) -> None:
    """Write to ``path`` until the file system holding it has no room left."""
    with path.open("wb", buffering=0) as out:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    out.write(b"\0" * size)
            except OSError as err:
                assert err.errno == errno.ENOSPC, err


def test_submit_on_a_full_disk_says_so_in_one_line_and_corrupts_nothing(small_disk_gpuq: Gpuq) -> None:
    gpuq = small_disk_gpuq
    first = gpuq.submit("--gpus", "0", "true")
    assert gpuq.run("wait", str(first)).returncode == 0
    filler = gpuq.home / "filler"
    fill(filler)

    result = gpuq.run("submit", "--gpus", "0", "true", check=False)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuq: ") and "no space left" in lines[0], result.stderr
    assert sorted(p.name for p in (gpuq.home / "spool").iterdir()) == ["rejected"]  # no request, no temp file
    assert gpuq.job(first)["state"] == "succeeded"
    assert [job["id"] for job in gpuq.status()] == [first]

    filler.unlink()
    second = gpuq.submit("--gpus", "0", "true")
    assert gpuq.run("wait", str(second)).returncode == 0
    assert gpuq.job(second)["state"] == "succeeded"
    assert [p for p in doctor.check(StateDir(gpuq.home)) if p.severity == "error"] == []
