"""The daemon's numbers from its environment (GPUQ_KILL_GRACE...): a bad one is one line naming the variable
and what it takes, exit code 2, from `gpuq daemon start` and from the daemon itself, and no daemon runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import Gpuq

BAD = [
    ("GPUQ_KILL_GRACE", "abc", "give a number of seconds from 0 to 86400"),
    ("GPUQ_KILL_GRACE", "-1", "give a number of seconds from 0 to 86400"),
    ("GPUQ_KILL_GRACE", "nan", "give a number of seconds from 0 to 86400"),
    ("GPUQ_RETRY_BACKOFF", "1e9", "give a number of seconds from 0 to 86400"),
    ("GPUQ_AUTO_MARGIN", "lots", "give a fraction such as 0.2 from 0 to 10"),
    ("GPUQ_AUTO_PROBE_MEM", "big", "cannot read size"),
    ("GPUQ_AUTO_STEADY", "soon", "give a number of seconds (or off) from 0 to 86400"),
    ("GPUQ_AUTO_FIRST", "some", "cannot read size"),
    ("GPUQ_AUTO_FIRST", "0G", "must be more than zero; or probe"),
    ("GPUQ_IDLE_LIMIT", "soon", "write it like 90s"),
]


@pytest.mark.parametrize(("name", "value", "says"), BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_a_bad_number_in_the_daemons_environment_is_one_line_naming_it_and_exit_2(
    gpuq: Gpuq, name: str, value: str, says: str
) -> None:
    gpuq.env[name] = value
    start = gpuq.run("daemon", "start", check=False)
    assert (start.returncode, start.stdout) == (2, ""), start.stderr
    assert start.stderr.startswith(f"gpuq: {name}={value!r}: ") and says in start.stderr, start.stderr
    assert len(start.stderr.splitlines()) == 1
    assert gpuq.daemon_pid() is None

    daemon = subprocess.run(
        [sys.executable, "-m", "gpuq_scheduler.launcher.daemon", "--burst"],
        env=gpuq.env,
        cwd=gpuq.cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert daemon.returncode == 2 and "Traceback" not in daemon.stderr, daemon.stderr
    (line,) = [line for line in daemon.stderr.splitlines() if "ERROR" in line]
    assert line.endswith(start.stderr.removeprefix("gpuq: ").rstrip("\n"))
    assert not (gpuq.home / "daemon.pid").exists()
