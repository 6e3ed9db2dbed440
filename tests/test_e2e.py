# One module past 400 lines on purpose: one walk of the real CLI and daemon per user-visible command.
"""End to end: the real CLI, a real daemon, real job processes, fake GPUs."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil

from gpuq_scheduler.jobs.store import schema
from gpuq_scheduler.launcher.daemon.outcomes import tail_reason
from gpuq_scheduler.launcher.policy.placement import Policy
from tests.conftest import REPORT, Gpuq, read_reports, wait_for


def test_jobs_see_exactly_their_gpus_and_run_in_their_cwd(gpuq: Gpuq) -> None:
    report = gpuq.cwd / "seen.jsonl"
    single = gpuq.submit("--gpus", "1", str(REPORT), str(report), "0.2")
    double = gpuq.submit("--gpus", "2", "--mode", "dataparallel", str(REPORT), str(report), "0.2")
    packed = gpuq.submit("--gpus", "1", "--mem", "10G", str(REPORT), str(report), "0.2")
    cpu = gpuq.submit("--gpus", "0", str(REPORT), str(report), "0.1")
    assert gpuq.run("wait", str(single), str(double), str(packed), str(cpu)).returncode == 0

    seen = {line["job"]: line for line in read_reports(report)}
    assert set(seen) == {single, double, packed, cpu}
    for job_id, count in ((single, 1), (double, 2), (packed, 1)):
        record = gpuq.job(job_id)
        assert seen[job_id]["cvd"] == ",".join(map(str, record["gpus"]))
        assert len(record["gpus"]) == count and len(record["gpu_uuids"]) == count
        assert seen[job_id]["order"] == "PCI_BUS_ID"
    assert seen[cpu]["cvd"] == ""
    assert seen[packed]["mem"] == str(10 << 30)
    assert all(line["cwd"] == str(gpuq.cwd) for line in seen.values())


def test_status_json_has_the_documented_fields(gpuq: Gpuq) -> None:
    job_id = gpuq.submit("--name", "tiny", "--gpus", "1", "--mem", "1G", "true")
    gpuq.run("wait", str(job_id))
    (record,) = gpuq.status()
    for key in (
        "id",
        "name",
        "user",
        "state",
        "command",
        "gpus",
        "gpu_uuids",
        "mem_per_gpu",
        "submitted_at",
        "started_at",
        "ended_at",
        "exit_code",
        "signal",
        "reason",
        "log",
    ):
        assert key in record
    assert record["name"] == "tiny" and record["state"] == "succeeded" and record["exit_code"] == 0
    assert record["mem_per_gpu"] == 1 << 30
    assert record["submitted_at"] <= record["started_at"] <= record["ended_at"]
    assert "env" not in record  # environments may hold secrets


def test_submit_wait_exits_with_the_jobs_exit_code_and_records_the_failure(gpuq: Gpuq) -> None:
    result = gpuq.run("submit", "--wait", str(REPORT), str(gpuq.cwd / "r.jsonl"), "0", "3", check=False)
    assert result.returncode == 3
    (record,) = gpuq.status()
    assert record["state"] == "failed" and record["exit_code"] == 3
    # It ends as `gpuq wait` does, with how the job ended and why, last on stderr.
    assert result.stderr.splitlines()[-1] == f"gpuq: 1 failed: job {record['id']} failed: exit code 3"


def test_environment_and_env_overrides_are_captured_at_submit_time(gpuq: Gpuq) -> None:
    gpuq.env["MY_SETTING"] = "from submit time"
    out = gpuq.cwd / "env.txt"
    job_id = gpuq.submit("--env", "EXTRA=x=y", "sh", "-c", f'echo "$MY_SETTING|$EXTRA" > "{out}"')
    gpuq.run("wait", str(job_id))
    assert out.read_text().strip() == "from submit time|x=y"


def test_python_script_runs_with_the_submitters_python(gpuq: Gpuq) -> None:
    script = gpuq.cwd / "which.py"
    script.write_text("import sys\nprint(sys.executable)\n")
    job_id = gpuq.submit("--gpus", "0", "which.py")
    gpuq.run("wait", str(job_id))
    record = gpuq.job(job_id)
    logged = Path(record["log"]).read_text().strip()
    assert os.path.realpath(logged) == os.path.realpath(sys.executable)


def test_cancel_stops_a_running_job_and_a_pending_one(gpuq: Gpuq) -> None:
    running = gpuq.submit("--gpus", "4", "sleep", "60")
    pending = gpuq.submit("--gpus", "4", "sleep", "60")
    gpuq.wait_state(running, "running")
    gpuq.run("cancel", str(running), str(pending))
    ended = gpuq.wait_state(running, "cancelled")
    assert ended["reason"].startswith("cancelled by ") and ended["signal"] == 15
    assert gpuq.wait_state(pending, "cancelled")["started_at"] is None
    assert gpuq.run("wait", str(running), check=False).returncode == 1


def test_time_limit_terminates_the_job_with_a_timeout_outcome(gpuq: Gpuq) -> None:
    job_id = gpuq.submit("--time", "1s", "sleep", "30")
    record = gpuq.wait_state(job_id, "timeout", timeout=30)
    assert "time limit" in record["reason"]
    assert record["signal"] == 15  # ended by the limit's SIGTERM, not by its own end


def test_sigterm_ignoring_job_is_killed_after_the_grace_period(gpuq: Gpuq) -> None:
    script = gpuq.cwd / "stubborn.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n")
    job_id = gpuq.submit("--gpus", "0", "--time", "1s", "stubborn.py")
    record = gpuq.wait_state(job_id, "timeout", timeout=30)
    assert record["signal"] == 9


def test_cuda_oom_in_the_log_becomes_the_reason(gpuq: Gpuq) -> None:
    script = gpuq.cwd / "oom.py"
    script.write_text(
        "raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.3 GiB total capacity)')\n"
    )
    job_id = gpuq.submit("oom.py")
    record = gpuq.wait_state(job_id, "failed")
    assert record["reason"] == "CUDA out of memory (exit code 1)"


def test_a_usage_error_is_the_reason_not_exit_code_2(gpuq: Gpuq) -> None:
    """Issue 39, friction 5: a job refused by its own argument parser failed with "exit code 2" alone."""
    (gpuq.cwd / "train.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--seed')\nparser.parse_args()\n"
    )
    (gpuq.cwd / "cli.py").write_text(
        "import click\n@click.command()\n@click.option('--seed', type=int)\ndef main(seed): pass\nmain()\n"
    )
    job_id = gpuq.submit("--gpus", "0", "train.py", "--sed", "4")
    record = gpuq.wait_state(job_id, "failed")
    assert record["reason"] == "train.py: error: unrecognized arguments: --sed 4 (exit code 2)"
    job_id = gpuq.submit("--gpus", "0", "cli.py", "--seed", "x")
    record = gpuq.wait_state(job_id, "failed")
    assert record["reason"] == "Error: Invalid value for '--seed': 'x' is not a valid integer. (exit code 2)"


def test_usage_errors_of_typer_and_of_other_exit_codes() -> None:
    """typer with rich boxes its error, maybe wrapped; an "error:" line of a job that did not exit 2 is its own."""
    boxed = (
        "Usage: main.py [OPTIONS]\nTry 'main.py --help' for help.\n\u256d\u2500 Error \u2500\u2500\u2500\u256e\n"
        "\u2502 No such option: --sed Did you mean    \u2502\n\u2502 --seed?   \u2502\n\u2570\u2500\u2500\u2500\u256f\n"
    ).encode()
    assert tail_reason(boxed, 2) == "Error: No such option: --sed Did you mean --seed?"
    argparse = b"usage: t.py [-h]\nt.py: error: the following arguments are required: --data\n"
    assert tail_reason(argparse, 2) == "t.py: error: the following arguments are required: --data"
    assert tail_reason(argparse, 1) == ""
    assert tail_reason(b"Traceback (most recent call last):\nValueError: bad lr\n", 2) == "ValueError: bad lr"


def test_missing_program_at_launch_time_fails_to_spawn(gpuq: Gpuq) -> None:
    program = gpuq.cwd / "vanishing"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    blocker = gpuq.submit("--gpus", "4", "sleep", "1")
    job_id = gpuq.submit("--gpus", "4", "./vanishing")
    program.unlink()
    record = gpuq.wait_state(job_id, "failed", timeout=30)
    assert record["reason"].startswith("could not start")
    assert gpuq.job(blocker)["state"] == "succeeded"


def test_logs_prints_the_job_output_and_follows_until_it_ends(gpuq: Gpuq) -> None:
    job_id = gpuq.submit("--gpus", "0", "sh", "-c", "echo one; sleep 0.5; echo two >&2")
    followed = gpuq.run("logs", "-f", str(job_id))
    assert followed.stdout.split() == ["one", "two"]


def test_gpus_command_shows_reservations_and_holders(gpuq: Gpuq) -> None:
    job_id = gpuq.submit("--gpus", "1", "--mem", "20G", "sleep", "30")
    gpuq.wait_state(job_id, "running")
    rows = json.loads(gpuq.run("gpus", "--json").stdout)
    assert len(rows) == 4
    (held,) = [row for row in rows if row["jobs"]]
    reserved = (20 << 30) + Policy().overhead  # what it asked for plus room for its CUDA context
    assert held["jobs"] == [job_id] and held["reserved_by_gpuq"] == reserved
    assert held["free"] == held["total"] - reserved
    gpuq.run("cancel", str(job_id))


def test_external_memory_use_is_respected(tmp_path: Path, gpuq: Gpuq) -> None:
    inventory = tmp_path / "gpus.json"
    inventory.write_text(json.dumps({"gpus": [{"total": "80GiB", "used": "70GiB"}, {"total": "80GiB"}]}))
    gpuq.env["GPUQ_FAKE_GPUS"] = str(inventory)
    report = gpuq.cwd / "r.jsonl"
    ids = [gpuq.submit("--mem", "20G", str(REPORT), str(report), "0.3") for _ in range(3)]
    gpuq.run("wait", *map(str, ids))
    assert {line["cvd"] for line in read_reports(report)} == {"1"}  # GPU 0 has only 10 GiB left


def test_lost_gpu_gets_nothing_new_and_the_queue_goes_on(tmp_path: Path, gpuq: Gpuq) -> None:
    inventory = tmp_path / "gpus.json"
    inventory.write_text(json.dumps([{"total": "80GiB", "lost": True}, {"total": "80GiB"}]))
    gpuq.env["GPUQ_FAKE_GPUS"] = str(inventory)
    report = gpuq.cwd / "r.jsonl"
    ids = [gpuq.submit("--gpus", "1", str(REPORT), str(report), "0.1") for _ in range(3)]
    gpuq.run("wait", *map(str, ids))
    assert {line["cvd"] for line in read_reports(report)} == {"1"}
    states = {row["index"]: row["state"] for row in json.loads(gpuq.run("gpus", "--json").stdout)}
    assert states[0].startswith("lost") and states[1] == "ok"


def test_torchrun_mode_starts_one_process_per_gpu_on_a_port_gpuq_chose(gpuq: Gpuq) -> None:
    script = gpuq.cwd / "ranks.py"
    script.write_text(
        "import os\n"
        "e = os.environ\n"
        "line = f\"rank {e['RANK']} of {e['WORLD_SIZE']} port {e['MASTER_PORT']} cvd {e['CUDA_VISIBLE_DEVICES']}\\n\"\n"
        "os.write(1, line.encode())  # one write: two ranks share the log, and print() may write piecemeal\n"
    )
    jobs = [gpuq.submit("--gpus", "2", "--mode", "torchrun", "ranks.py") for _ in range(2)]
    assert gpuq.run("wait", *map(str, jobs), timeout=180).returncode == 0
    ports = set()
    for job_id in jobs:
        record = gpuq.job(job_id)
        text = Path(record["log"]).read_text()
        lines = [line.split() for line in text.splitlines() if line.startswith("rank")]
        assert sorted(line[1] for line in lines) == ["0", "1"], text
        assert {line[7] for line in lines} == {",".join(map(str, record["gpus"]))}
        ports |= {line[5] for line in lines}
    assert len(ports) == 2


def test_a_failed_torchrun_job_reports_the_failing_ranks_own_error_not_child_failed_error(gpuq: Gpuq) -> None:
    """torchrun ends a failed run's log with its own ChildFailedError; the reason must be the rank's error."""
    script = gpuq.cwd / "diverges.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "rank = dist.get_rank()\n"
        "dist.barrier()\n"
        "if rank == 1:\n"
        "    raise RuntimeError(f'loss is NaN at step 7 on rank {rank}')\n"
        "dist.barrier()  # rank 0 then fails too, of the lost peer: not the cause\n"
    )
    job = gpuq.submit("--gpus", "2", "--mode", "torchrun", "diverges.py")
    record = gpuq.wait_state(job, "failed", "succeeded", timeout=180)
    log = Path(record["log"]).read_text()
    assert record["state"] == "failed" and "ChildFailedError" in log, log
    assert record["reason"] == "rank 1: RuntimeError: loss is NaN at step 7 on rank 1 (exit code 1)", log


TORCHRUN_SUMMARY = b"""torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_12:50:45
  host      : localhost
  rank      : 3 (local_rank: 3)
  exitcode  : %s (pid: 21331)
  error_file: %s
  traceback : %s
============================================================
"""


def test_a_torchrun_rank_without_its_own_traceback_is_named_with_how_it_ended() -> None:
    """Older torch prints no "[rankN]: " prefix, a rank killed by a signal prints nothing, and with @record
    the error is in torchrun's summary itself: each still names the rank, never ChildFailedError."""
    no_prefix = b"Traceback (most recent call last):\nValueError: from some rank\n" + TORCHRUN_SUMMARY % (
        b"-9",
        b"<N/A>",
        b"Signal 9 (SIGKILL) received by PID 21331",
    )
    assert tail_reason(no_prefix) == "rank 3 failed first (exit code -9)"
    recorded = TORCHRUN_SUMMARY % (b"1", b"/tmp/error.json", b"Traceback (most recent call last):\n    KeyError: 'lr'")
    assert tail_reason(recorded) == "rank 3: KeyError: 'lr'"
    # CUDA out of memory reads as None: the daemon works out which kind (within its share, past it, a victim).
    assert tail_reason(b"[rank3]: torch.OutOfMemoryError: CUDA out of memory.\n" + recorded) is None


def test_status_shows_why_a_job_waits(gpuq: Gpuq) -> None:
    blocker = gpuq.submit("--gpus", "4", "sleep", "30")
    gpuq.wait_state(blocker, "running")
    waiting = gpuq.submit("--gpus", "2", "--mem", "40G", "true")
    record = wait_for(lambda: (r := gpuq.job(waiting))["reason"] and r, 10, "a waiting reason")
    assert record["state"] == "pending" and "waiting for 2 GPUs with 40.0G free each" in record["reason"]
    gpuq.run("cancel", str(blocker), str(waiting))


def test_daemon_start_stop_status(gpuq: Gpuq) -> None:
    assert gpuq.daemon_pid() is None
    gpuq.run("daemon", "start")
    pid = gpuq.daemon_pid()
    assert pid
    gpuq.run("daemon", "start")  # idempotent
    assert gpuq.daemon_pid() == pid
    assert "stopped" in gpuq.run("daemon", "stop").stdout
    assert gpuq.daemon_pid() is None


def _processes_of(home: Path) -> list[psutil.Process]:
    """The live processes whose environment names ``home`` as their queue (daemons, clients, shims)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("GPUQ_HOME") == str(home) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def test_clients_that_all_find_no_daemon_start_exactly_one(gpuq: Gpuq) -> None:
    """Regression (CI, 2026-11-24): two submits that both found no daemon listening started two; when the
    first was stopped while the second was still importing, the second took the lock and served on, and
    `daemon stop` waited on it until its timeout. The starting client now hands its lock to the daemon."""
    command = [sys.executable, "-m", gpuq.entry, "submit", "--gpus", "0", "true"]
    clients = [subprocess.Popen(command, env=gpuq.env, cwd=gpuq.cwd, stdout=subprocess.DEVNULL) for _ in range(6)]
    assert [c.wait(60) for c in clients] == [0] * 6
    gpuq.run("daemon", "stop")
    # A second daemon, still importing when the first stopped, would take the lock and serve on: wait until
    # every process started for this queue has exited, then look.
    wait_for(lambda: not _processes_of(gpuq.home), 30, "every daemon of this queue to exit")
    assert gpuq.daemon_pid() is None
    log = (gpuq.home / "daemon.log").read_text()
    assert "another daemon already serves" not in log and log.count(" serving ") <= 1


def test_a_daemon_stopped_while_it_starts_stops(gpuq: Gpuq) -> None:
    gpuq.submit("--gpus", "0", "true")  # starts a daemon, which is still importing now
    gpuq.run("daemon", "stop")
    assert gpuq.daemon_pid() is None
    gpuq.run("daemon", "start")
    assert gpuq.daemon_pid()


def test_jobs_keep_running_while_the_daemon_is_stopped(gpuq: Gpuq) -> None:
    report = gpuq.cwd / "r.jsonl"
    job_id = gpuq.submit(str(REPORT), str(report), "1.5")
    gpuq.wait_state(job_id, "running")
    gpuq.run("daemon", "stop")
    gpuq.wait_exit_file(job_id)
    assert read_reports(report)  # it finished with no daemon around
    gpuq.run("daemon", "start")
    assert gpuq.wait_state(job_id, "succeeded")["exit_code"] == 0


def test_every_transition_lands_in_the_event_journal(gpuq: Gpuq) -> None:
    done = gpuq.submit("--gpus", "1", "true")
    failed = gpuq.submit("--gpus", "0", "false")
    gpuq.run("wait", str(done), str(failed), check=False)
    events = [json.loads(line) for line in (gpuq.home / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e.get("job") == done] == ["submitted", "started", "succeeded"]
    assert [e["event"] for e in events if e.get("job") == failed] == ["submitted", "started", "failed"]
    started = next(e for e in events if e.get("job") == done and e["event"] == "started")
    assert started["gpus"] == gpuq.job(done)["gpus"]
    stamps = [e["t"] for e in events if e.get("job") == done]
    assert stamps == sorted(stamps)


def test_python_api_runs_scripts_with_the_callers_interpreter_not_paths(gpuq: Gpuq) -> None:
    """Regression: `.venv/bin/python examples/ensemble.py` without an activated venv ran its members
    with PATH's python3, which had no torch."""
    script = gpuq.cwd / "which.py"
    script.write_text("import sys\nprint(sys.executable)\n")
    gpuq.env.pop("VIRTUAL_ENV", None)
    gpuq.env["PATH"] = "/usr/bin:/bin"  # a python3 here is not the caller's
    code = "from gpuq_scheduler import submit, wait\n(r,) = wait([submit(['which.py'], gpus=0)])\nprint(r.log)\n"
    out = subprocess.run([sys.executable, "-c", code], env=gpuq.env, cwd=gpuq.cwd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    logged = Path(out.stdout.strip()).read_text().strip()
    assert os.path.realpath(logged) == os.path.realpath(sys.executable)


def test_an_upgraded_daemon_migrates_a_version_1_table_with_a_job_running(gpuq: Gpuq) -> None:
    """The upgrade users make: jobs ran (one still runs) under a daemon of table version 1; `gpuq status`
    of the new version lists them before any new daemon ran, and the new daemon migrates the table, adopts
    the running job and sees it end."""
    done = gpuq.submit("--name", "first", "true")
    gpuq.run("wait", str(done))
    report = gpuq.cwd / "r.jsonl"
    running = gpuq.submit("--mem", "2G", str(REPORT), str(report), "2")
    gpuq.wait_state(running, "running")
    before = gpuq.run("status", "--all").stdout
    gpuq.run("daemon", "stop")
    db = sqlite3.connect(gpuq.home / "jobs.db", isolation_level=None)
    for column in [*(c for c, _, _ in schema.LISTED), *(c for c, _ in [*schema.CAUSED, *schema.SUSPENSION])]:
        db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
    db.execute("PRAGMA user_version=1")
    db.close()
    # The same jobs, but with no daemon running, the one that ran is "unknown": it may have ended meanwhile.
    stopped = before.replace(" running ", " unknown ")
    assert _without_runtimes(gpuq.run("status", "--all").stdout) == _without_runtimes(stopped)
    gpuq.run("daemon", "start")
    assert gpuq.wait_state(running, "succeeded")["exit_code"] == 0
    db = sqlite3.connect(gpuq.home / "jobs.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.TABLE_VERSION
    assert db.execute("SELECT name, want_gpus, mem_per_gpu FROM jobs ORDER BY id").fetchall() == [
        ("first", 1, None),
        ("", 1, 2 << 30),
    ]
    db.close()
    lines = gpuq.run("status", "--all").stdout.splitlines()
    assert lines[1].split()[:4] == [str(done), "first", lines[1].split()[2], "succeeded"]
    assert lines[2].split()[1:2] == ["report.py"] and "2.0G" in lines[2] and "succeeded" in lines[2]


def _without_runtimes(table: str) -> list[list[str]]:
    return [line.split()[:6] for line in table.splitlines()]
