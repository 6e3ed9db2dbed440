"""Whatever lands in the spool, the daemon keeps going: bad files are set aside with a note, never run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.conftest import REPORT, Gpuq, read_reports, wait_for


def test_corrupt_and_foreign_spool_files_are_set_aside_and_the_queue_goes_on(gpuq: Gpuq) -> None:
    gpuq.run("daemon", "stop")  # let the junk pile up before the daemon sees it
    first = gpuq.submit("--gpus", "0", "true")
    gpuq.run("daemon", "stop")
    spool = gpuq.home / "spool"
    (spool / "submit-000000000999.json").write_text("{not json")
    (spool / "submit-000000000998.json").write_bytes(b"\x00\xff" * 100)
    (spool / "submit-000000000997.json").write_text(json.dumps({"schema": 1, "kind": "submit", "id": 997}))
    (spool / "submit-000000000996.json").write_text(
        json.dumps({"schema": 1, "kind": "submit", "id": 996, "submitted_at": 0, "spec": {"command": "rm -rf /"}})
    )
    (spool / "cancel-abc.json").write_text(json.dumps({"schema": 1, "kind": "cancel", "ids": "all"}))
    (spool / "random.txt").write_text("hello")
    (spool / "a-directory").mkdir()
    os.mkfifo(spool / "a-fifo")
    os.symlink("/etc/passwd", spool / "submit-000000000995.json")
    os.link(gpuq.home / "next_id", spool / "submit-000000000994.json")
    with (spool / "huge.json").open("wb") as huge:
        huge.truncate(9 << 20)

    report = gpuq.cwd / "r.jsonl"
    second = gpuq.submit("--gpus", "1", str(REPORT), str(report), "0")
    assert gpuq.run("wait", str(first), str(second)).returncode == 0
    assert [line["job"] for line in read_reports(report)] == [second]
    wait_for(lambda: sorted(p.name for p in spool.iterdir()) == ["rejected"], 10, "an empty spool")
    notes = sorted(p.name for p in (spool / "rejected").iterdir() if p.name.endswith(".why"))
    assert len(notes) == 11
    why = " ".join(p.read_text() for p in (spool / "rejected").glob("*.why"))
    for phrase in ("is not JSON", "symbolic link", "hard links", "not a regular file", "bytes, more than"):
        assert phrase in why
    assert gpuq.daemon_pid() is not None
    assert {job["id"] for job in gpuq.status()} == {first, second}
    assert "11 request file(s) could not be read" in gpuq.run("status").stderr


def test_a_request_ingested_before_a_crash_is_not_run_twice(gpuq: Gpuq) -> None:
    report = gpuq.cwd / "r.jsonl"
    job_id = gpuq.submit("--gpus", "1", str(REPORT), str(report), "0")
    gpuq.run("wait", str(job_id))
    request = gpuq.home / "spool" / f"submit-{job_id:012d}.json"
    spec = gpuq.job(job_id)
    request.write_text(
        json.dumps(
            {
                "schema": 1,
                "kind": "submit",
                "id": job_id,
                "submitted_at": spec["submitted_at"],
                "spec": {"command": spec["command"], "cwd": spec["cwd"], "gpus": 1},
            }
        )
    )  # the state a kill -9 between commit and unlink leaves behind
    gpuq.submit("true")
    gpuq.run("wait")
    assert len(read_reports(report)) == 1


def test_every_control_action_the_spool_accepts_has_one_handler_in_the_daemon() -> None:
    """An action the spool lets through with no handler of its own would once have run as "update" or
    "unpause" (the `else` branches): now the daemon raises, and this names the missing one first."""
    from gpuq_scheduler.jobs.store.actions import Action
    from gpuq_scheduler.launcher.daemon.requests import JOB_ACTIONS, QUEUE_ACTIONS, RUNNING_ACTIONS

    tables = (set(JOB_ACTIONS), set(QUEUE_ACTIONS), set(RUNNING_ACTIONS))
    assert sum(map(len, tables)) == len(set().union(*tables))  # each action in one table only
    assert set().union(*tables) == set(Action)


def test_a_control_request_reads_as_its_action_and_an_unknown_action_is_set_aside(tmp_path: Path) -> None:
    """The action a client writes (outbox.write_control) reads back as the same Action, not as a string each
    end spells; a word that is no Action is a bad request, whatever it asks."""
    from gpuq_scheduler.jobs.store import outbox, spool
    from gpuq_scheduler.jobs.store.actions import Action
    from gpuq_scheduler.jobs.store.statedir import StateDir

    state = StateDir(tmp_path / "state dir")
    state.ensure()
    for action in (Action.HOLD, Action.DRAIN, Action.SUSPEND):
        request = spool.read_request(outbox.write_control(state, action, [3]))
        assert isinstance(request, spool.ControlRequest) and request.action is action and request.ids == (3,)
    planted = tmp_path / "state dir" / "spool" / "control-planted.json"
    planted.write_text(json.dumps({"schema": 1, "kind": "control", "action": "explode", "ids": [3], "values": {}}))
    bad = spool.read_request(planted)
    assert isinstance(bad, spool.BadRequest) and bad.reason == "asks for an unknown action 'explode'"
