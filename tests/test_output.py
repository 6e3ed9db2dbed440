"""`--output PATTERN` (Slurm's -o): a copy of each job's log where its user asked, opened as that user."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from gpuq_scheduler.jobs.accounts import Account
from gpuq_scheduler.jobs.naming import output_path
from gpuq_scheduler.launcher.supervisor.processes import open_as
from tests.conftest import Gpuq


def test_output_names_each_jobs_file_as_slurm_does_and_logs_still_has_it(gpuq: Gpuq) -> None:
    (gpuq.cwd / "out").mkdir()
    job_id = gpuq.submit("--gpus", "0", "--name", "hello", "--output", "out/%x_%j.log", "echo", "hi")
    done = json.loads(
        gpuq.run(
            "submit",
            "--json",
            "--gpus",
            "0",
            "--array",
            "0-2",
            "--output",
            "out/%A_%a.out",
            "sh",
            "-c",
            "echo member {index}",
        ).stdout
    )
    gpuq.run("wait")
    assert (gpuq.cwd / "out" / f"hello_{job_id}.log").read_text() == "hi\n"
    for index, member in enumerate(done["jobs"]):
        assert (gpuq.cwd / "out" / f"{done['id']}_{index}.out").read_text() == f"member {index}\n"
        assert gpuq.run("logs", str(member)).stdout == f"member {index}\n"  # `gpuq logs` still finds it
    assert f"output            {gpuq.cwd}/out/hello_{job_id}.log" in gpuq.run("show", str(job_id)).stdout


def test_an_output_that_cannot_be_written_is_said_in_the_log_and_the_job_runs(gpuq: Gpuq) -> None:
    # A device or a FIFO could stall the shim that copies the output: only a regular file is written.
    for target, why in (("/dev/null", "not a regular file"), (f"{gpuq.cwd}/no dir/x", "No such file or directory")):
        job_id = gpuq.submit("--gpus", "0", "--output", target, "echo", "still ran")
        gpuq.wait_state(job_id, "succeeded")
        log = gpuq.run("logs", str(job_id)).stdout
        assert log == f"gpuq: --output {target}: {why}; the output is in `gpuq logs` only\nstill ran\n"


def test_a_bad_output_pattern_is_refused(gpuq: Gpuq) -> None:
    (gpuq.cwd / "results").mkdir()  # `train.py --output results`: the job's own option, most likely
    result = gpuq.run("submit", "echo", "--output", "results", check=False)
    assert result.returncode == 2 and result.stderr == (
        "gpuq: --output results: is a directory; name a file (out/%j.log), or if --output is echo's own, give it "
        "after --\n"
    )
    result = gpuq.run("submit", "--output", "x_%q.log", "true", check=False)
    assert result.returncode == 2
    assert (
        result.stderr == "gpuq: --output 'x_%q.log': %q is not one of %j (job id), %A (array id), %a (array "
        "index), %x (job name), %% (a %)\n"
    )


def test_the_pattern_is_filled_per_job() -> None:
    assert output_path("%A_%a-%j.%x%%", "/w", 7, 5, 1, "seed 1/2") == "/w/5_1-7.seed 1_2%"
    assert output_path("/abs/%A_%a.out", "/w", 7, None, None, "n") == "/abs/7_.out"


@pytest.mark.skipif(os.geteuid() != 0, reason="opening as another user needs root, as a shared queue's shim is")
def test_a_shared_queues_shim_opens_the_output_as_the_jobs_user_never_as_root() -> None:
    """Root never writes through a path a user chose: a link to a root-only file, or a directory only root may
    write, is opened with the user's rights (here nobody's), and refused as the user would be."""
    entry = pwd.getpwnam("nobody")
    nobody = Account(entry.pw_uid, "nobody", entry.pw_gid, (entry.pw_gid,))
    base = Path(tempfile.mkdtemp(prefix="gpuq output "))  # under /tmp: nobody may pass through, as to a home
    try:
        base.chmod(0o755)
        secret = base / "root only"
        secret.write_text("root's\n")
        secret.chmod(0o644)  # readable, as most of root's files are: only writing is refused
        (base / "link").symlink_to(secret)
        assert open_as(str(base / "link"), nobody) == "Permission denied"
        assert open_as(str(base / "new.log"), nobody) == "Permission denied"  # root's directory
        assert secret.read_text() == "root's\n" and not (base / "new.log").exists()
        theirs = base / "theirs"
        theirs.mkdir()
        os.chown(theirs, nobody.uid, nobody.gid)
        fd = open_as(str(theirs / "job.log"), nobody)
        assert isinstance(fd, int)
        os.write(fd, b"x")
        os.close(fd)
        assert (theirs / "job.log").stat().st_uid == nobody.uid
    finally:
        shutil.rmtree(base)
