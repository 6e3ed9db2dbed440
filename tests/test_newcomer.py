"""A newcomer's first hour (issue 27): the card's own commands do what they say, with a real daemon on
fake GPUs, and nothing that did not run is recorded as succeeded."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Gpuq

SHOW_ARGV = "import os, sys; print(sys.argv, os.environ.get('CUDA_VISIBLE_DEVICES'))\n"


def _log(gpuq: Gpuq, job_id: int) -> str:
    return Path(gpuq.job(job_id)["log"]).read_text()


def test_the_headline_submit_gives_the_job_two_gpus_and_only_its_own_argv(gpuq: Gpuq) -> None:
    (gpuq.cwd / "train.py").write_text(SHOW_ARGV)
    first = int(gpuq.run("submit", "train.py", "--gpus", "2").stdout.split()[-1])
    second = gpuq.submit("train.py", "--gpus", "2", "--", "--lr", "0.1", "--gpus", "4")
    for job_id in (first, second):
        gpuq.wait_state(job_id, "succeeded")
    assert _log(gpuq, first) == "['train.py'] 0,1\n"
    assert _log(gpuq, second).startswith("['train.py', '--lr', '0.1', '--gpus', '4'] ")
    assert gpuq.job(second)["gpus_requested"] == 2


def test_gpuq_run_takes_its_options_after_the_command_too(gpuq: Gpuq) -> None:
    done = gpuq.run("run", "sh", "-c", 'echo "seen $CUDA_VISIBLE_DEVICES $0"', "--gpus", "2", "--", "arg")
    assert "seen 0,1 arg\n" in done.stdout


def test_a_python_job_is_named_after_its_script_and_status_shows_gpu_indices_apart_from_counts(gpuq: Gpuq) -> None:
    """`gpuq submit python train.py` was named `python`; GPUS showed `0` for a job on GPU 0."""
    (gpuq.cwd / "train.py").write_text("import time; time.sleep(60)\n")
    job_id = gpuq.submit("--gpus", "1", "python", "train.py")
    cpu_id = gpuq.submit("--gpus", "0", "sleep", "60")
    gpuq.wait_state(job_id, "running")
    gpuq.wait_state(cpu_id, "running")
    assert gpuq.job(job_id)["name"] == "train.py"
    rows = [line.split() for line in gpuq.run("status").stdout.splitlines()]
    header = rows[0]
    assert header[:6] == ["ID", "NAME", "USER", "STATE", "GPUS", "ON"]
    by_id = {row[0]: dict(zip(header, row, strict=False)) for row in rows[1:]}
    assert (by_id[str(job_id)]["NAME"], by_id[str(job_id)]["GPUS"], by_id[str(job_id)]["ON"]) == ("train.py", "1", "0")
    assert (by_id[str(cpu_id)]["GPUS"], by_id[str(cpu_id)]["ON"]) == ("0", "-")
