"""Issue #39's frictions 4, 6 and 9 on real daemons with fake GPUs: a daemon that is not there is said, a
message names the right thing, and the status table leaves nothing out (suspended members, retries, the
time a job spent suspended, which queue this is)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.views.tables import Progress
from tests.conftest import FIXTURES, Gpuq, fake_cuda_queue, make_env, wait_for


def _row(out: str, job_id: int) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.split()[:1] == [str(job_id)])


# -- friction 4: a daemon that is not there is said ----------------------------------------------------


def test_a_killed_daemon_is_said_first_and_the_jobs_it_saw_running_are_unknown(gpuq: Gpuq) -> None:
    """After kill -9 of a personal queue's daemon, `gpuq status` showed an ended job as running and said
    nothing; `gpuq wait` started a daemon in silence."""
    flag = gpuq.cwd / "go"
    job = gpuq.submit("sh", "-c", f"while [ ! -e '{flag}' ]; do sleep 0.05; done")
    gpuq.wait_state(job, "running")
    assert gpuq.run("status").stderr.splitlines()[0] == f"personal queue in {gpuq.home}"
    gpuq.kill_daemon()
    flag.touch()
    gpuq.wait_exit_file(job)  # it ended; no daemon saw it end

    status = gpuq.run("status")
    first = status.stderr.splitlines()[0]
    assert first.startswith(f"personal queue in {gpuq.home}: its daemon is not running")
    assert first.endswith("(`gpuq daemon start`)")
    assert _row(status.stdout, job)[3] == "unknown"  # not "running": it may have ended (it has)
    shown = gpuq.run("show", str(job))
    assert shown.stderr.splitlines()[0] == first
    assert re.search(r"^state\s+unknown \(running when the daemon last saw it", shown.stdout, re.M)
    assert gpuq.daemon_pid() is None  # readers never start it

    waited = gpuq.run("wait", str(job))
    assert f"the daemon of the queue in {gpuq.home} was not running; started it" in waited.stderr
    assert waited.stderr.strip().endswith("gpuq: 1 succeeded")
    assert gpuq.daemon_pid() is not None
    status = gpuq.run("status")
    assert status.stderr.splitlines()[0] == f"personal queue in {gpuq.home}"
    assert _row(status.stdout, job)[3] == "succeeded"


def test_a_shared_queues_daemon_that_is_down_is_said_once_by_a_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shared-queue branch of `gpuq wait` (``outbox.keep_daemon``, which `wait` calls at each poll), on a
    real state directory owned by another uid (a shared queue's root); the end-to-end shared queue is
    test_shared*.py's. Said once, and nothing started: its admin starts it."""
    if os.geteuid() != 0:
        pytest.skip("makes a directory owned by another user: needs root, as CI runs")
    state = StateDir(tmp_path / "shared queue")
    state.ensure()
    os.chown(state.root, 4242, 4242)
    said = False
    for _ in range(3):
        said = outbox.keep_daemon(state, said)
    assert said
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"the daemon of the shared queue in {state.root} is not running; still waiting" in err
    assert not (state.root / "daemon.pid").exists()


def test_status_names_a_shared_queue_and_who_starts_its_daemon(tmp_path: Path) -> None:
    """``daemon_health.queue_line`` for a shared queue (a state directory another uid owns) whose daemon is down: its
    admin starts it, not `gpuq daemon start`. The end-to-end shared queue is test_shared*.py's."""
    from gpuq_scheduler.launcher.views import daemon_health

    if os.geteuid() != 0:
        pytest.skip("makes a directory owned by another user: needs root, as CI runs")
    state = StateDir(tmp_path / "shared queue")
    state.ensure()
    os.chown(state.root, 4242, 4242)
    assert daemon_health.daemon_down(state)
    said = daemon_health.queue_line(state, down=True)
    assert said.startswith(f"shared queue in {state.root}: its daemon is not running")
    assert said.endswith("(ask its admin: `sudo systemctl start gpuq`)")
    assert daemon_health.queue_line(state, down=False) == f"shared queue in {state.root}"


# -- friction 6: the right noun -------------------------------------------------------------------------


def test_resume_of_an_ended_job_says_it_ended_not_undrain_a_gpu(gpuq: Gpuq) -> None:
    """`gpuq resume 1` on an ended job 1 said "to place jobs on GPU(s) 1 again, type `gpuq undrain 1`"."""
    done = gpuq.submit("true")
    gpuq.run("wait", str(done))
    for action, words in (("resume", "can only resume a suspended one"), ("suspend", "can only suspend a running one")):
        refused = gpuq.run(action, str(done), check=False)
        assert (refused.returncode, refused.stdout) == (2, "")
        assert refused.stderr == f"gpuq: job {done} has ended (succeeded); `gpuq {action}` {words}\n"
    unknown = gpuq.run("resume", "3", check=False)  # no job 3, and GPU 3 is a GPU here: the old spelling
    assert unknown.returncode == 2 and "type `gpuq undrain 3`" in unknown.stderr


# -- friction 9 ---------------------------------------------------------------------------------------------


def test_status_counts_suspended_members_and_runtime_stops_while_suspended(tmp_path: Path) -> None:
    """The array's line said "1 running" for an array of 2 with one suspended, and a suspended job's
    runtime went on growing."""
    queue = fake_cuda_queue(tmp_path, "2x80GiB", GPUQ_FAKE_HOST_MEMORY="256GiB")
    shutil.copy(FIXTURES / "fake_counter.py", queue.cwd / "fake_counter.py")
    try:
        array = json.loads(
            queue.run(
                "submit",
                "--json",
                "--array",
                "0-1",
                "fake_counter.py",
                "10",
                str(queue.cwd / "counts{index}"),
                "100000",
            ).stdout
        )
        first, second = array["jobs"]
        for job in (first, second):
            queue.wait_state(job, "running")
        wait_for(lambda: queue.job(first)["peak_mem"], 30, "the job's memory to be seen")
        queue.run("suspend", str(first))
        queue.wait_state(first, "suspended")
        folded = _row(queue.run("status").stdout, array["id"])
        assert " ".join(folded[4:8]) == "1 running, 1 suspended", folded
        frozen = _row(queue.run("status", "--expand").stdout, first)[7]
        seen = time.monotonic()
        wait_for(lambda: time.monotonic() > seen + 2.5, 30, "time to pass while it is suspended")
        assert _row(queue.run("status", "--expand").stdout, first)[7] == frozen  # not a second more
        assert re.search(rf"^runtime\s+{re.escape(frozen)}$", queue.run("show", str(first)).stdout, re.M)
    finally:
        queue.cleanup()


def test_status_says_a_job_needed_retries(tmp_path: Path) -> None:
    home = tmp_path / "state"
    queue = Gpuq(home, make_env(home, GPUQ_RETRY_BACKOFF="0"), tmp_path)
    marker = tmp_path / "tried once"
    try:
        fails_once = f"[ -e '{marker}' ] || {{ touch '{marker}'; exit 3; }}"
        job = queue.submit("--gpus", "0", "--retries", "2", "sh", "-c", fails_once)
        queue.wait_state(job, "succeeded")
        assert _row(queue.run("status").stdout, job)[-3:] == ["0", "(attempt", "2)"]
    finally:
        queue.cleanup()


def test_the_hold_of_a_failing_array_names_the_array_to_release(one_gpu: Gpuq) -> None:
    """It said `gpuq release ARRAY_ID`, literally."""
    array = json.loads(one_gpu.run("submit", "--json", "--array", "0-5", "sh", "-c", "exit 3").stdout)["id"]
    held = wait_for(lambda: next((j for j in one_gpu.status() if j["held"]), None), 60, "a member to be held")
    assert held["reason"].endswith(f"fix the cause, then `gpuq release {array}`"), held["reason"]
    assert f"gpuq release {array}`" in one_gpu.run("status").stdout


def test_first_in_line_says_the_jobs_ahead_that_wait_on_their_own_limits(gpuq: Gpuq) -> None:
    """A 3-GPU job behind two throttled array members (listed above it) was "first in line"."""
    array = json.loads(gpuq.run("submit", "--json", "--array", "0-3%2", "sleep", "300").stdout)
    big = gpuq.submit("--gpus", "3", "true")
    why = wait_for(lambda: gpuq.job(big)["reason"], 30, "the big job's reason")
    assert why.endswith("- first in line for GPUs; 2 ahead wait on their own limits"), why
    gpuq.run("cancel", str(array["id"]))
    gpuq.wait_state(big, "succeeded")


def test_daemon_status_says_which_queue(gpuq: Gpuq) -> None:
    assert gpuq.run("daemon", "status").stdout == f"no daemon running for the personal queue in {gpuq.home}\n"
    gpuq.run("daemon", "start")
    said = json.loads(gpuq.run("daemon", "status", "--json").stdout)
    assert (said["running"], said["queue"], said["home"]) == (True, "personal", str(gpuq.home))
    assert gpuq.run("daemon", "status").stdout.endswith(f"for the personal queue in {gpuq.home}\n")


def test_the_wait_progress_line_clears_what_a_longer_one_left() -> None:
    """`gpuq wait`'s progress line is redrawn with a carriage return: a shorter line (an ETA gone) left the
    longer one's end on the terminal."""
    out = io.StringIO()
    progress = Progress(out)
    spec = JobSpec(command=("true",), cwd="/")
    records = [JobRecord(i, spec, 0, "me", JobState.PENDING, 0.0) for i in (1, 2)]
    progress(records)
    progress([records[0], JobRecord(2, spec, 0, "me", JobState.SUCCEEDED, 0.0)])
    progress([records[0], JobRecord(2, spec, 0, "me", JobState.SUSPENDED, 0.0)])
    drawn = out.getvalue().split("\r")[1:]
    assert len(drawn) == 3 and all(line.endswith("\x1b[K") for line in drawn)
    assert "0 running, 1 suspended, 1 pending" in drawn[2]  # a suspended job is not pending


def test_tops_log_view_shows_a_redrawn_line_as_a_terminal_leaves_it() -> None:
    """A progress bar redrawn with carriage returns showed what its longer drawings left behind."""
    from gpuq_scheduler.launcher.views.top import as_shown  # textual: the top extra

    text = "epoch 1 loss 0.912345678\repoch 2\r\nloading 10%\rloading 100%\x1b[K\nplain"
    assert as_shown(text) == "epoch 2\nloading 100%\nplain"
