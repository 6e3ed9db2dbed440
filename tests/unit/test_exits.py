"""The shim's exit file: one typed definition both ends use, and a field gpuq does not know is an error."""

from __future__ import annotations

import json

import pytest

from gpuq_scheduler.launcher.supervisor.exits import BadExitFile, ExitFile, Stop
from tests.conftest import REPORT, Gpuq

ENDED = ExitFile(
    7,
    1700000000.5,
    started=True,
    exit_code=None,
    signal=15,
    reason=Stop.CANCEL,
    contained={"outlived": 2, "peak_ram": 1 << 30},
    next=8,
)


def test_an_exit_file_reads_back_as_written() -> None:
    for written in (ENDED, ExitFile(9, 1.0, started=False, dropped=True), ExitFile(3, 2.0, True, spawn_error="x: no")):
        assert ExitFile.from_json(json.loads(json.dumps(written.to_json()))) == written


@pytest.mark.parametrize(
    "change, words",
    [
        ({"surprise": 1}, "unknown fields ['surprise']"),
        ({"next": ...}, "missing fields ['next']"),
        ({"reason": "hibernate"}, "an ending gpuq does not know: 'hibernate'"),
        ({"started": 1}, "its started is 1"),
        ({"exit_code": True}, "its exit_code is True"),
        ({"contained": []}, "its contained is []"),
    ],
)
def test_an_unknown_missing_or_mistyped_field_is_an_error_not_a_default(change: dict[str, object], words: str) -> None:
    data = {**ENDED.to_json(), **change}
    data = {k: v for k, v in data.items() if v is not ...}
    with pytest.raises(BadExitFile) as raised:
        ExitFile.from_json(data)
    assert words in str(raised.value)


@pytest.mark.slow  # a real daemon
def test_a_job_whose_exit_file_gpuq_cannot_read_is_lost_and_says_why(gpuq: Gpuq) -> None:
    job_id = gpuq.submit(str(REPORT), str(gpuq.cwd / "seen.jsonl"), "0.5")
    gpuq.wait_state(job_id, "running")
    gpuq.kill_daemon()
    gpuq.wait_exit_file(job_id)
    exit_file = gpuq.home / "run" / f"{job_id}.exit"
    exit_file.write_text(json.dumps({**json.loads(exit_file.read_text()), "surprise": 1}))
    gpuq.run("daemon", "start")
    record = gpuq.wait_state(job_id, "lost")
    assert "exit file is not one gpuq reads: unknown fields ['surprise']" in record["reason"], record
