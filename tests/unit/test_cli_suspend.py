"""The quick `gpuq suspend` / `gpuq resume` (launcher.cli.suspend) against click's: same requests, same
output, same errors, and the daemon woken by each request.

Each command runs in a fresh process, as users run it. The table is written by hand (``_queue``): jobs in
every state the commands look at, an array, a job packed under the MPS fence, one still in the spool. No
daemon runs: the test holds the wake FIFO open for reading, so a request's wake-up lands there, and its
requests stay in the spool to be read back. One test at the end runs a real daemon.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq_scheduler.jobs.errors import NotPermitted
from gpuq_scheduler.jobs.model import ArrayInfo, JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome, Step
from gpuq_scheduler.jobs.store import outbox, suspend_requests
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.jobs.submission import inventory_json
from gpuq_scheduler.launcher.cli import suspend as cli_suspend
from tests.conftest import FIXTURES, fake_cuda_queue, make_env, wait_for
from tests.unit.test_cli_submit import CLICK, HEAVY, QUICK, Run
from tests.unit.test_cli_submit import Queue as Runner

GiB = 1 << 30
COUNTER = FIXTURES / "fake_counter.py"
ME, NOBODY = os.getuid(), 65534


class Suspends(Runner):
    """The hand-made queue, the FIFO's reading end, and the requests and wake-ups a command left."""

    def __init__(self, tmp: Path, home: Path, fifo: int) -> None:
        super().__init__(tmp, make_env(home), home)
        self.fifo = fifo

    def controls(self) -> list[dict[str, Any]]:
        """The control requests written since the last look (and gone from the spool now)."""
        found = []
        for path in sorted((self.home / "spool").glob("control-*.json")):
            found.append(json.loads(path.read_text()))
            path.unlink()
        return found

    def wakeups(self) -> bytes:
        try:
            return os.read(self.fifo, 4096)
        except BlockingIOError:
            return b""


def _spec(**fields: Any) -> JobSpec:
    return JobSpec(command=("/bin/job",), cwd="/", **fields)


def _queue(home: Path) -> StateDir:
    """Jobs 1 running (GPU 0), 2 suspended (from GPU 1), 3 pending; array 4 of 5 running (GPU 2) and 6
    pending; 7 packed with --mem on GPU 3, whose fence is MPS; 8 succeeded; 9 someone else's, running
    (GPU 1); 10 submitted and still in the spool. Four GPUs, so that `resume 0`..`resume 3` may be GPUs."""
    state = StateDir(home)
    state.ensure()
    table = JobTable(state.db, create=True)
    mine = {1: _spec(), 2: _spec(), 3: _spec(), 7: _spec(mem_per_gpu=10 * GiB), 8: _spec()}
    records = [JobRecord(i, spec, ME, "me", JobState.PENDING, float(i)) for i, spec in mine.items()]
    records += [JobRecord(9, _spec(), NOBODY, "nobody", JobState.PENDING, 9.0)]
    records += [JobRecord(i, _spec(), ME, "me", JobState.PENDING, 4.0, array_id=4, array_index=i - 5) for i in (5, 6)]
    table.insert_pending(records, [ArrayInfo(4, ME, "me", "sweep", 2, None)])
    for job_id, gpu in ((1, 0), (2, 1), (5, 2), (7, 3), (8, 0), (9, 1)):
        table.mark_running(job_id, [gpu], [f"GPU-{gpu}"], 10.0, Launch(1, 1.0, "boot"))
    assert table.mark_step(2, Step.SUSPENDING)
    table.mark_suspended(2, 4 * GiB, 20.0)
    table.finish(8, Outcome.succeeded(), 30.0)
    table.close()
    outbox.write_submit(state, 10, _spec().to_json(), 40.0)
    (home / "next_id").write_text("11\n")
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-{i}",
            "name": "fake",
            "total": 80 * GiB,
            "lost": False,
            "fence": "mps" if i == 3 else "none",
        }
        for i in range(4)
    ]
    (home / "gpus.json").write_bytes(inventory_json(gpus))
    return state


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Suspends]:
    home = tmp_path / "state dir 'quoted'"
    _queue(home)
    reader = os.open(home / "wake.fifo", os.O_RDONLY | os.O_NONBLOCK)  # "the daemon": wake-ups land here
    try:
        yield Suspends(tmp_path, home, reader)
    finally:
        os.close(reader)


# -- both ways alike ------------------------------------------------------------------------------------

# What each plain command does here (both ways): the jobs it asks for, or the error it prints.
PLAIN = [
    (["suspend", "1"], [1], ""),
    (["suspend", "1", "1", "01"], [1], ""),
    (["suspend", "9"], [9], ""),  # someone else's: we run as root, an admin
    (["suspend", "4"], [5], ""),  # an array: its running members
    (["suspend", "4", "5"], [5], ""),  # a member named twice over (as itself and in its array): asked once
    (["suspend", "4", "6"], None, "job 6 is pending; `gpuq suspend` can only suspend a running one"),
    (["suspend", "3"], None, "job 3 is pending; `gpuq suspend` can only suspend a running one"),
    (["suspend", "1", "2"], None, "job 2 is suspended; `gpuq suspend` can only suspend a running one"),
    (["suspend", "8"], None, "job 8 has ended (succeeded); `gpuq suspend` can only suspend a running one"),
    (["suspend", "7"], None, "job 7 runs as a client of an MPS server"),
    (["suspend", "10"], None, "job 10 is pending; `gpuq suspend` can only suspend a running one"),  # spooled
    (["suspend", "999"], None, "no job 999 in this queue"),
    (["suspend", "0"], None, "no job 0 in this queue"),
    (["suspend", "99999999999999999999"], None, "no job 99999999999999999999 in this queue"),
    (["resume", "2"], [2], ""),
    (["resume", "2", "4"], [2], ""),  # the array has none suspended: nothing to say of it
    (["resume", "4"], None, "no suspended job among 4; nothing to resume"),
    (["resume", "1"], None, "job 1 is running; `gpuq resume` can only resume a suspended one"),  # a job first
    (["resume", "8"], None, "job 8 has ended (succeeded); `gpuq resume` can only resume a suspended one"),
    (["resume", "0"], None, "type `gpuq undrain 0`"),  # the old spelling: no job 0, and GPU 0 is a GPU here
    (["resume", "9"], None, "job 9 is running; `gpuq resume` can only resume a suspended one"),
    (["resume", "999"], None, "no job 999 in this queue"),
]


@pytest.mark.parametrize(("args", "asked", "says"), PLAIN, ids=[" ".join(a) for a, _, _ in PLAIN])
def test_quick_and_click_ask_the_same_print_the_same_and_wake_the_daemon(
    queue: Suspends, args: list[str], asked: list[int] | None, says: str
) -> None:
    assert cli_suspend.parse(args[1:]) is not None  # each of these is the quick path's
    seen = {}
    for entry in (QUICK, CLICK):
        run = queue.gpuq(entry, *args)
        assert ("click" in run.modules) is (entry == CLICK)  # the quick path took it, click was not asked
        seen[entry] = (run.returncode, run.stdout, run.stderr, queue.controls(), queue.wakeups())
    assert seen[QUICK] == seen[CLICK]
    code, out, err, controls, woken = seen[QUICK]
    if asked is None:
        assert (code, out, controls, woken) == (2, "", [], b"")  # nothing asked, nobody woken
        assert err.startswith("gpuq: ") and err.count("\n") == 1 and says in err, err
        return
    verb = "suspending" if args[0] == "suspend" else "resuming"
    assert (code, err) == (0, "") and out == "".join(f"{verb} job {i}\n" for i in asked)
    assert controls == [{"schema": 1, "kind": "control", "action": args[0], "ids": asked, "values": {}}]
    assert woken == b"!"  # the daemon is woken by the request, not left to its next poll


FALLBACKS = [
    ["suspend"],
    ["resume"],
    ["suspend", "--help"],
    ["resume", "-h"],
    ["suspend", "x"],
    ["suspend", "-1"],
    ["suspend", "1", "--json"],
    ["suspend", "\u0663"],
    ["suspend", " 1"],
    ["suspend", "--", "1"],
    ["--debug", "suspend", "1"],
]


@pytest.mark.parametrize("args", FALLBACKS, ids=[" ".join(a) for a in FALLBACKS])
def test_what_the_quick_path_does_not_handle_goes_to_click(queue: Suspends, args: list[str]) -> None:
    run = queue.gpuq(QUICK, *args)
    assert "click" in run.modules
    state = (run.returncode, run.stdout, run.stderr, queue.controls(), queue.wakeups())
    clicked = queue.gpuq(CLICK, *args)
    assert (clicked.returncode, clicked.stdout, clicked.stderr, queue.controls(), queue.wakeups()) == state
    if run.returncode:
        assert run.stdout == "" and len(run.stderr.splitlines()) == 1 and state[3:] == ([], b"")


def test_shell_completion_goes_to_click(queue: Suspends) -> None:
    queue.env = {**queue.env, "_GPUQ_COMPLETE": "bash_complete", "COMP_WORDS": "gpuq suspend 1", "COMP_CWORD": "2"}
    run = queue.gpuq(QUICK, "suspend", "1")
    assert run.returncode == 0 and "click" in run.modules and queue.controls() == []


# -- what a quick suspend loads ---------------------------------------------------------------------------


def test_a_quick_suspend_and_resume_load_no_heavy_module(queue: Suspends) -> None:
    """Without site and from the package laid out as it installs (as tests/unit/test_cli_submit.py's quick submit):
    sqlite3 (with collections, which it imports itself) is the one heavy module, to read the table."""
    runs = ((["suspend", "1", "4"], "suspending job 5\nsuspending job 1\n"), (["resume", "2"], "resuming job 2\n"))
    for args, out in runs:
        run = queue.gpuq(QUICK, *args, bare=True)
        assert (run.returncode, run.stdout, run.stderr) == (0, out, "")
        assert sorted(run.modules & set(HEAVY)) == ["collections", "sqlite3"]
        assert "gpuq_scheduler.launcher.cli.suspend" in run.modules
    assert sorted(c["ids"] for c in queue.controls()) == [[2], [5, 1]]  # named by random tokens


# -- the table read straight and the queue's resolve agree ------------------------------------------------

ID_LISTS = [
    [1],
    [2],
    [3],
    [4],
    [5],
    [6],
    [7],
    [8],
    [9],
    [1, 2, 3],
    [4, 5],
    [5, 4],
    [4, 6, 1],
    [9, 4, 9],
    [10],
    [1, 10],
    [999],
    [0],
    [2**70],
    [4, 999],
]


def test_the_table_read_straight_names_the_jobs_resolve_names(tmp_path: Path) -> None:
    state = _queue(tmp_path / "state")
    queue = Queue(state)
    for ids in ID_LISTS:
        plain = all(i in range(1, 10) for i in ids)  # in the table, as a job or an array
        read = suspend_requests.in_table(state, ids)
        assert (read is not None) is plain, ids
        if read is not None:
            assert read == [suspend_requests.Named.of(r) for r in queue.resolve(ids)], ids


def test_the_table_read_straight_leaves_the_unusual_to_resolve(tmp_path: Path) -> None:
    state = _queue(tmp_path / "state")
    (tmp_path / "state" / "clusters.db").write_bytes(b"")  # jobs sent to clusters: readers() looks there too
    assert suspend_requests.in_table(state, [1]) is None
    (tmp_path / "state" / "clusters.db").unlink()
    assert suspend_requests.in_table(state, [1]) is not None
    (tmp_path / "state" / "jobs.db").write_bytes(b"not a table")
    assert suspend_requests.in_table(state, [1]) is None  # resolve says what is wrong, in the readers' words


def test_another_users_job_is_refused_in_one_line_and_nothing_is_asked(tmp_path: Path) -> None:
    state = _queue(tmp_path / "state")

    def resolve(ids: list[int]) -> list[JobRecord]:
        return Queue(state).resolve(ids)

    for ids, owner in (([1], "me"), ([9], "nobody"), ([4], "me")):
        with pytest.raises(NotPermitted) as refused:
            suspend_requests.ask(state, Action.SUSPEND, ids, resolve=resolve, uid=NOBODY + 1)
        assert str(refused.value).endswith(f"only {owner} or an admin can suspend it")
    assert not list((tmp_path / "state" / "spool").glob("control-*"))
    asked = suspend_requests.ask(state, Action.SUSPEND, [9], resolve=resolve, uid=NOBODY)
    assert asked == suspend_requests.in_table(state, [9])


# -- with a real daemon -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_quick_suspend_and_resume_are_carried_out_by_a_real_daemon(tmp_path: Path) -> None:
    queue = fake_cuda_queue(tmp_path, "1x80GiB", GPUQ_FAKE_HOST_MEMORY="256GiB", GPUQ_FAKE_CHECKPOINT_SECONDS="0")
    shutil.copy(COUNTER, queue.cwd / "fake_counter.py")
    (tmp_path / "driver").mkdir()
    runner = Runner(tmp_path / "driver", queue.env, queue.home)  # runs the commands as test_cli_submit's do
    try:
        counts = queue.cwd / "counts"
        job = queue.submit("fake_counter.py", "4", str(counts), "100000")
        wait_for(lambda: counts.exists() and queue.job(job)["peak_mem"], 30, "the job to count and be seen")
        for action, verb, state in (("suspend", "suspending", "suspended"), ("resume", "resuming", "running")):
            run: Run = runner.gpuq(QUICK, action, str(job))
            assert (run.returncode, run.stdout, run.stderr) == (0, f"{verb} job {job}\n", "")
            assert "click" not in run.modules
            queue.wait_state(job, state)
        assert queue.job(job)["suspended_for"] > 0
        queue.run("cancel", str(job))
        queue.wait_state(job, "cancelled")
    finally:
        queue.cleanup()
