"""`#GPUQ` lines at the top of a script (``jobs.directives``), as Slurm's `#SBATCH`: on a real daemon with fake
GPUs, through the quick `gpuq submit` and click's alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Gpuq, wait_for

SCRIPT = """#!/usr/bin/env python
# Trains the small model: a comment before the directives, and among them.
#GPUQ --gpus 2 --name 'small run'   # two GPUs
#
#GPUQ --env GREETING=hello --time 1h
import os
#GPUQ --gpus 3
print(os.environ["GREETING"], os.environ["CUDA_VISIBLE_DEVICES"])
"""
ENTRIES = ["gpuq_scheduler.launcher.cli.entry", "gpuq_scheduler.launcher.cli.app"]  # quick, and click's


@pytest.mark.parametrize("entry", ENTRIES, ids=["quick", "click"])
def test_directives_in_the_script_set_its_options_and_the_command_line_wins(gpuq: Gpuq, entry: str) -> None:
    gpuq.entry = entry
    (gpuq.cwd / "train.py").write_text(SCRIPT)
    job_id = gpuq.submit("train.py", "--seed", "1")
    job = gpuq.wait_state(job_id, "succeeded")
    # The lines before the first line of code count; the one after it is the code's business.
    assert len(job["gpus"]) == 2
    assert job["name"] == "small run" and job["time_limit"] == 3600.0
    assert Path(job["log"]).read_text().split()[0] == "hello"
    shown = gpuq.run("show", str(job_id)).stdout
    assert "from the script   --gpus 2 --name 'small run' --env GREETING=hello --time 1h (its #GPUQ lines)" in shown
    job_id = gpuq.submit("--gpus", "1", "python", "-u", "train.py", "--env", "GREETING=hi")
    job = gpuq.wait_state(job_id, "succeeded")
    assert len(job["gpus"]) == 1 and Path(job["log"]).read_text().split()[0] == "hi"  # the command line's
    assert job["name"] == "small run"
    assert "from the script   --name 'small run' --time 1h" in gpuq.run("show", str(job_id)).stdout


BAD = [
    ("#GPUQ --gpu 2\n", "train.py line 1: #GPUQ --gpu 2: --gpu is not an option of gpuq submit"),
    ("#!/bin/sh\n# hi\n#GPUQ --mem 20\n", "train.py line 3: #GPUQ --mem 20: --mem: cannot read size '20'"),
    ("#GPUQ --gpus two\n", "train.py line 1: #GPUQ --gpus two: --gpus: 'two' is not a whole number"),
    ("#GPUQ --cwd /tmp\n", "train.py line 1: #GPUQ --cwd /tmp: --cwd stays on the command line"),
    ("#GPUQ --name 'open\n", "train.py line 1: #GPUQ --name 'open: No closing quotation; quote as a shell would"),
    ("#GPUQ --time\n", "train.py line 1: #GPUQ --time: --time needs a value"),
]


@pytest.mark.parametrize(("head", "says"), BAD, ids=[says.split(": ", 2)[-1][:30] for _, says in BAD])
def test_a_bad_directive_is_one_line_naming_the_script_and_its_line(gpuq: Gpuq, head: str, says: str) -> None:
    (gpuq.cwd / "train.py").write_text(head + "print('never run')\n")
    gpuq.run("daemon", "start")
    wait_for(lambda: (gpuq.home / "gpus.json").exists(), 10, "the daemon's first tick")
    errors = []
    for entry in ENTRIES:
        gpuq.entry = entry
        result = gpuq.run("submit", "train.py", check=False)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.startswith(f"gpuq: {says}") and len(result.stderr.splitlines()) == 1, result.stderr
        errors.append(result.stderr)
    assert errors[0] == errors[1]
    assert json.loads(gpuq.run("status", "--all", "--json").stdout) == []
