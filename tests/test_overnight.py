"""The overnight features end to end: arrays, dependencies, retries, holds, drain, pause, notify, wait."""

from __future__ import annotations

import json
import os
import pty
import random
import subprocess
import sys

from tests.conftest import REPORT, Gpuq, read_reports, wait_for
from tests.test_handoff import passes_went_by


def _array(gpuq: Gpuq, *args: str) -> tuple[int, list[int]]:
    out = json.loads(gpuq.run("submit", "--json", *args).stdout)
    return out["id"], out["jobs"]


def _max_concurrent(reports: list[dict[str, object]]) -> int:
    edges = sorted([(float(r["start"]), 1) for r in reports] + [(float(r["end"]), -1) for r in reports])  # type: ignore[arg-type]
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def test_array_substitutes_index_and_throttle_holds_across_200_members(gpuq: Gpuq) -> None:
    report = gpuq.cwd / "seen.jsonl"
    array_id, members = _array(
        gpuq, "--array", "0-199%8", "--gpus", "0", "--name", "m{index}", str(REPORT), str(report), "0.05"
    )
    assert len(members) == 200 and members[0] == array_id + 1
    assert gpuq.run("wait", "--array", str(array_id), timeout=300).returncode == 0
    reports = read_reports(report)
    assert sorted(r["job"] for r in reports) == members
    assert _max_concurrent(reports) <= 8
    records = {r["id"]: r for r in gpuq.status()}
    assert records[members[7]]["name"] == "m7" and records[members[7]]["array_index"] == 7
    folded = gpuq.run("status").stdout
    assert f"{array_id}   m{{index}} [200]" in folded and "200 succeeded" in folded
    assert len(gpuq.run("status", "--expand").stdout.splitlines()) == 201


def test_index_in_the_command_and_the_environment(gpuq: Gpuq) -> None:
    out = gpuq.cwd / "idx"
    array_id, _ = _array(
        gpuq,
        "--array",
        "1,3,7",
        "--gpus",
        "0",
        "sh",
        "-c",
        f'echo "{{index}} $GPUQ_ARRAY_INDEX $GPUQ_ARRAY_ID" >> "{out}"',
    )
    gpuq.run("wait", str(array_id))
    assert sorted(out.read_text().split("\n")[:-1]) == [f"{i} {i} {array_id}" for i in (1, 3, 7)]


def test_a_range_in_a_named_sweep_is_its_values(gpuq: Gpuq) -> None:
    """Issue 39, friction 2: `--array seed=0-7` ran one job with `0-7`. A value that is no range stays one."""
    out = gpuq.cwd / "seen"
    array_id, members = _array(
        gpuq,
        "--array",
        "seed=0-7",
        "--array",
        "lr=1e-4,-1,a-b",
        "--gpus",
        "0",
        "sh",
        "-c",
        f'echo "{{seed}} {{lr}}" >> "{out}"',
    )
    assert len(members) == 24
    gpuq.run("wait", str(array_id))
    assert sorted(out.read_text().splitlines()) == sorted(f"{s} {v}" for s in range(8) for v in ("1e-4", "-1", "a-b"))
    array_id, members = _array(gpuq, "--array", "seed=0-20:5", "--gpus", "0", "echo", "{seed}")
    gpuq.run("wait", str(array_id))
    assert [gpuq.job(m)["command"][-1] for m in members] == ["0", "5", "10", "15", "20"]


def test_cancel_an_array_by_its_id(gpuq: Gpuq) -> None:
    array_id, members = _array(gpuq, "--array", "0-5%2", "--gpus", "0", "sleep", "30")
    wait_for(lambda: sum(r["state"] == "running" for r in gpuq.status()) == 2, 20, "two members running")
    gpuq.run("cancel", str(array_id))
    states = wait_for(
        lambda: (s := {r["id"]: r["state"] for r in gpuq.status()}) and all(v == "cancelled" for v in s.values()) and s,
        30,
        "all cancelled",
    )
    assert set(states) == set(members)


def test_after_waits_for_success_and_a_failed_dependency_is_not_run(gpuq: Gpuq) -> None:
    report = gpuq.cwd / "seen.jsonl"
    first = gpuq.submit("--gpus", "0", str(REPORT), str(report), "0.5")
    second = gpuq.submit("--gpus", "0", "--after", str(first), str(REPORT), str(report), "0")
    failing = gpuq.submit("--gpus", "0", "false")
    skipped = gpuq.submit("--gpus", "0", "--after", f"{first},{failing}", str(REPORT), str(report), "0")
    anyway = gpuq.submit("--gpus", "0", "--after", str(failing), "--after-any", str(REPORT), str(report), "0")
    gpuq.run("wait", check=False)
    seen = {r["job"]: r for r in read_reports(report)}
    assert seen[second]["start"] >= seen[first]["end"]
    assert anyway in seen and skipped not in seen
    record = gpuq.job(skipped)
    assert record["state"] == "cancelled" and record["reason"].startswith(f"not run: dependency {failing} failed")


def test_after_an_array_waits_for_all_its_members(gpuq: Gpuq) -> None:
    report = gpuq.cwd / "seen.jsonl"
    array_id, members = _array(gpuq, "--array", "0-3", "--gpus", "0", str(REPORT), str(report), "0.3")
    last = gpuq.submit("--gpus", "0", "--after", str(array_id), str(REPORT), str(report), "0")
    gpuq.run("wait", str(last))
    seen = {r["job"]: r for r in read_reports(report)}
    assert seen[last]["start"] >= max(seen[m]["end"] for m in members)


def test_after_an_array_that_has_ended(gpuq: Gpuq) -> None:
    """The daemon forgets an array once its members have all ended: a dependency on it reads the table."""
    done, _ = _array(gpuq, "--array", "0-2", "--gpus", "0", "true")
    failed, members = _array(gpuq, "--array", "0-2", "--gpus", "0", "sh", "-c", "exit {index}")
    gpuq.run("wait", check=False)
    after = gpuq.submit("--gpus", "0", "--after", str(done), "true")
    never = gpuq.submit("--gpus", "0", "--after", str(failed), "true")
    gpuq.wait_state(after, "succeeded")
    record = gpuq.wait_state(never, "cancelled")
    assert record["reason"].startswith(f"not run: dependency {members[1]} failed")


def test_retries_run_again_after_backoff_until_success(gpuq: Gpuq) -> None:
    gpuq.env["GPUQ_RETRY_BACKOFF"] = "0.2"
    counter = gpuq.cwd / "tries"
    script = gpuq.cwd / "flaky.sh"
    script.write_text(f'#!/bin/sh\necho x >> "{counter}"\n[ "$(wc -l < "{counter}")" -ge 3 ]\n')
    script.chmod(0o755)
    job_id = gpuq.submit("--gpus", "0", "--retries", "3", "./flaky.sh")
    record = gpuq.wait_state(job_id, "succeeded", timeout=60)
    assert record["attempt"] == 3 and len(counter.read_text().splitlines()) == 3
    events = [json.loads(line) for line in (gpuq.home / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e.get("job") == job_id].count("retry") == 2


def test_retries_give_up_with_the_last_failure(gpuq: Gpuq) -> None:
    gpuq.env["GPUQ_RETRY_BACKOFF"] = "0.1"
    job_id = gpuq.submit("--gpus", "0", "--retries", "2", "sh", "-c", "exit 4")
    record = gpuq.wait_state(job_id, "failed", timeout=60)
    assert record["attempt"] == 3 and record["exit_code"] == 4


def test_oom_retry_doubles_the_memory(gpuq: Gpuq) -> None:
    gpuq.env["GPUQ_RETRY_BACKOFF"] = "0.1"
    script = gpuq.cwd / "hungry.py"
    script.write_text(
        "import os, sys\n"
        "if int(os.environ['GPUQ_MEM_PER_GPU']) < 8 << 30:\n"
        "    sys.exit('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB')\n"
    )
    job_id = gpuq.submit("--mem", "5G", "--oom-retry", "hungry.py")
    record = gpuq.wait_state(job_id, "succeeded", timeout=60)
    assert record["attempt"] == 2 and record["mem_per_gpu"] == 10 << 30


def test_an_array_failing_fast_is_held_then_released(gpuq: Gpuq) -> None:
    flag = gpuq.cwd / "fixed"
    array_id, _ = _array(gpuq, "--array", "0-9%2", "--gpus", "0", "sh", "-c", f'test -e "{flag}"')
    held = wait_for(lambda: [r for r in gpuq.status() if r["held"]], 30, "the array to be held")
    assert all("the first 3 members failed" in r["reason"] for r in held)
    passes_went_by(gpuq, held[0]["id"])
    assert all(r["state"] == "pending" for r in gpuq.status() if r["held"])  # nothing more burnt
    assert "held" in gpuq.run("status").stdout
    flag.write_text("fixed")
    gpuq.run("release", str(array_id))
    gpuq.run("wait", check=False)
    states = [r["state"] for r in gpuq.status() if r["array_id"] == array_id]
    # Three failed before the hold; with two at a time, a fourth may have been running already.
    assert states.count("failed") in (3, 4) and states.count("succeeded") == 10 - states.count("failed")


def test_an_array_whose_first_wave_fails_at_once_runs_no_second_wave(gpuq: Gpuq) -> None:
    """Issue 39, friction 1: 8 members on 4 GPUs that all failed at once ran all 8 (the next wave was handed
    to their shims, or placed, before the guard had seen enough failures). Now the guard decides first."""
    started, go = gpuq.cwd / "started", gpuq.cwd / "go"
    started.mkdir()
    script = f'touch "{started}/{{index}}"; while [ ! -e "{go}" ]; do sleep 0.05; done; exit 1'
    array_id, _ = _array(gpuq, "--array", "0-7", "--gpus", "1", "sh", "-c", script)
    wait_for(lambda: len(list(started.iterdir())) == 4, 30, "the first wave of 4 to start")
    go.write_text("fail now")
    settled = wait_for(
        lambda: (s := gpuq.status()) and all(r["state"] == "failed" or r["held"] for r in s) and s,
        60,
        "every member to have failed or be held",
    )
    assert sorted(r["state"] for r in settled) == ["failed"] * 4 + ["pending"] * 4
    assert all(r["held"] and "the first 3 members failed" in r["reason"] for r in settled if r["state"] == "pending")
    assert len(list(started.iterdir())) == 4
    gpuq.run("cancel", str(array_id))


def test_hold_release_and_update_priority(gpuq: Gpuq) -> None:
    report, go = gpuq.cwd / "seen.jsonl", gpuq.cwd / "go"
    # The blocker holds every GPU until the hold and the update are in (a fixed sleep raced them on a busy machine).
    blocker = gpuq.submit("--gpus", "4", "sh", "-c", 'while [ ! -e "$1" ]; do sleep 0.02; done', "sh", str(go))
    low = gpuq.submit("--gpus", "4", str(REPORT), str(report), "0")
    high = gpuq.submit("--gpus", "4", str(REPORT), str(report), "0")
    held = gpuq.submit("--gpus", "4", str(REPORT), str(report), "0")
    gpuq.run("hold", str(held))
    gpuq.run("update", str(high), "--priority", "5")
    go.touch()
    gpuq.run("wait", str(blocker), str(low), str(high))
    assert [r["job"] for r in read_reports(report)] == [high, low]
    assert gpuq.job(held)["state"] == "pending" and gpuq.job(held)["reason"].startswith("held by")
    gpuq.run("release", str(held))
    gpuq.run("wait", str(held))
    assert [r["job"] for r in read_reports(report)] == [high, low, held]


def test_jobs_start_by_priority_then_by_id(gpuq: Gpuq) -> None:
    """One job at a time (each takes all 4 GPUs): the start order is the queue's order, highest priority first
    and equal priorities by id, however the priorities were given."""
    rng = random.Random(7)
    gpuq.run("pause")
    priorities = {gpuq.submit("--gpus", "4", "true"): rng.choice([-2, 0, 0, 3]) for _ in range(12)}
    for job_id in reversed(list(priorities)):
        if priorities[job_id]:
            gpuq.run("update", str(job_id), "--priority", str(priorities[job_id]))
    gpuq.run("unpause")
    gpuq.run("wait", *map(str, priorities))
    events = [json.loads(line) for line in (gpuq.home / "events.jsonl").read_text().splitlines()]
    started = [e["job"] for e in events if e.get("event") == "started"]
    assert started == sorted(priorities, key=lambda job_id: (-priorities[job_id], job_id))


def test_drain_a_gpu_then_undrain_it(gpuq: Gpuq) -> None:
    report = gpuq.cwd / "seen.jsonl"
    gpuq.run("drain", "0", "1", "2")
    ids = [gpuq.submit("--gpus", "1", str(REPORT), str(report), "0.1") for _ in range(3)]
    gpuq.run("wait", *map(str, ids))
    assert {r["cvd"] for r in read_reports(report)} == {"3"}
    gpuq.run("undrain", "0", "1", "2")
    ids = [gpuq.submit("--gpus", "1", str(REPORT), str(report), "1") for _ in range(4)]
    gpuq.run("wait", *map(str, ids))
    assert {r["cvd"] for r in read_reports(report)[3:]} == {"0", "1", "2", "3"}


def test_pause_starts_nothing_until_unpaused(gpuq: Gpuq) -> None:
    gpuq.run("pause")
    job_id = gpuq.submit("--gpus", "1", "true")
    record = wait_for(lambda: (r := gpuq.job(job_id))["reason"] and r, 10, "a reason")
    assert record["state"] == "pending" and "paused" in record["reason"]
    assert "`gpuq unpause`" in record["reason"], record  # the command that undoes it (`gpuq resume` is a job's now)
    gpuq.run("unpause")
    gpuq.wait_state(job_id, "succeeded")


def test_notify_runs_with_the_outcome_for_a_job_and_once_for_an_array(gpuq: Gpuq) -> None:
    out = gpuq.cwd / "notified"
    command = f'echo "$GPUQ_JOB_ID|$GPUQ_ARRAY_ID|$GPUQ_STATE|$GPUQ_EXIT_CODE|$GPUQ_ARRAY_COUNTS" >> "{out}"'
    job_id = gpuq.submit("--gpus", "0", "--notify", command, "sh", "-c", "exit 3")
    array_id, _ = _array(gpuq, "--array", "0-3", "--gpus", "0", "--notify", command, "sh", "-c", "exit {index}")
    gpuq.run("wait", check=False)
    lines = wait_for(lambda: out.exists() and len(out.read_text().splitlines()) == 2 and out.read_text(), 10, "2")
    assert f"{job_id}||failed|3|" in lines.splitlines()
    assert f"|{array_id}|failed||failed=3 succeeded=1" in lines.splitlines()


def test_wait_shows_progress_on_a_terminal_and_only_a_closing_line_elsewhere(gpuq: Gpuq) -> None:
    array_id, _ = _array(gpuq, "--array", "0-3", "--gpus", "0", "sleep", "0.3")
    quiet = gpuq.run("wait", "--array", str(array_id))
    assert quiet.stderr == "gpuq: 4 succeeded\n" and quiet.stdout == ""
    array_id, _ = _array(gpuq, "--array", "0-3", "--gpus", "0", "sh", "-c", "sleep 0.3; exit {index}")
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuq_scheduler.launcher.cli.app", "wait", "--array", str(array_id)],
        env=gpuq.env,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    assert proc.wait(timeout=60) == 1
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    text = shown.decode()
    assert "4/4 done, 3 failed" in text and "ETA" in text and "exit code" in text
    assert "gpuq: 1 succeeded, 3 failed: job " in text


def test_python_api_array_and_wait(gpuq: Gpuq) -> None:
    code = (
        "from gpuq_scheduler import array, wait\n"
        "array_id, ids = array(['sh', '-c', 'exit 0'], range(5), throttle=2, gpus=0)\n"
        "records = wait([array_id])\n"
        "print(len(ids), sorted(r.state.value for r in records) == ['succeeded'] * 5)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=gpuq.env, cwd=gpuq.cwd, capture_output=True, text=True)
    assert out.stdout.split() == ["5", "True"], out.stderr


def test_an_array_of_ten_thousand_is_one_request(gpuq: Gpuq) -> None:
    gpuq.run("pause")
    array_id, members = _array(gpuq, "--array", "0-9999", "--gpus", "1", "--mem", "1G", "true")
    assert len(members) == 10_000
    assert len(list((gpuq.home / "spool").glob("submit-*"))) <= 1  # one request file, not 10,000
    wait_for(lambda: len(gpuq.status()) == 10_000 and not list((gpuq.home / "spool").glob("submit-*")), 60, "ingest")
    gpuq.run("cancel", str(array_id))
    wait_for(lambda: all(r["state"] == "cancelled" for r in gpuq.status()), 60, "cancel of 10,000")


def test_bad_array_and_dependency_input_is_refused(gpuq: Gpuq) -> None:
    gpuq.submit("--gpus", "0", "true")
    for args, message in (
        (["--array", "5-1", "true"], "ranges go from a smaller"),
        (["--array", "0-9%0", "true"], "how many run at once"),
        (["--array", "a-b", "true"], "write indices like"),
        (["--after", "999", "true"], "no job 999"),
        (["--after", "x", "true"], "give job ids"),
        (["--after-any", "true"], "give --after IDS too"),
        (["--retries", "-1", "true"], "--retries must be 0 or more"),
    ):
        result = gpuq.run("submit", *args, check=False)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
    for args in (["hold", "999"], ["release", "999"], ["update", "999", "--priority", "1"]):
        assert gpuq.run(*args, check=False).returncode == 2
    assert gpuq.run("update", "1", check=False).returncode == 2
    assert gpuq.run("drain", "9", check=False).returncode == 2


def test_morning_report_covers_arrays_and_writes_a_standalone_page(gpuq: Gpuq) -> None:
    array_id, _ = _array(gpuq, "--array", "0-3%2", "--gpus", "1", "sh", "-c", "sleep 0.2; exit $(( {index} == 3 ))")
    gpuq.run("wait", check=False)
    page = gpuq.cwd / "night report.html"
    text = gpuq.run("report", "--since", "1h", "--html", str(page)).stdout
    assert "3 succeeded" in text and "1 failed" in text
    assert f"\n{array_id} " in text or f" {array_id} " in text
    html = page.read_text()
    assert '<svg id="timeline"' in html and html.count('class="job state-') == 4
    assert "http://" not in html and "https://" not in html  # stands alone: nothing to fetch
