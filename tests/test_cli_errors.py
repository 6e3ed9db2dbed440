"""Bad input: one clear line, exit code 2, and nothing written to the queue."""

from __future__ import annotations

import pytest

from tests.conftest import REPORT, Gpuq, wait_for


def _spooled(gpuq: Gpuq) -> list[str]:
    spool = gpuq.home / "spool"
    return sorted(p.name for p in spool.iterdir() if p.is_file()) if spool.is_dir() else []


BAD_SUBMITS = [
    (["--gpus", "-1", "true"], "--gpus must be 0 or more"),
    (["--preempt-signal", "KILL", "true"], "--preempt-signal 'KILL': name one a job can catch: USR1, USR2"),
    (["--gpus", "5", "true"], "more GPUs than this machine has (4)"),
    (["--mem", "20", "true"], "write a number and a unit"),
    (["--mem", "20Q", "true"], "unknown size unit"),
    (["--mem", "100G", "true"], "no GPU here has that much (the largest has 80.0G); ask for at most 80.0G"),
    (["--gpus", "0", "--mem", "1G", "true"], "cannot ask for it"),
    (["--time", "soon", "true"], "cannot read duration"),
    (["--time", "0s", "true"], "must be more than zero"),
    (["--mode", "magic", "true"], "'magic' is not one of"),
    (["--mode", "torchrun", "true"], "runs a Python script"),
    (["--env", "NOEQUALS", "true"], "write it as KEY=VALUE"),
    (["--cwd", "/no/such/dir", "true"], "no such directory"),
    (["missing_script.py"], "no such script: missing_script.py"),
    (["no-such-program-anywhere"], "command not found: no-such-program-anywhere"),
    (["./not-here.sh"], "is not an executable file"),
    (["--gpus", "many", "true"], "'many' is not a valid integer"),
    ([], "Missing argument 'COMMAND"),
    (["--priority", "2000000", "true"], "give a number from -1000000 to 1000000"),
    (["--retries", "-1", "true"], "--retries must be 0 or more"),
    (["--mode", "torchrun", "--gpus", "0", str(REPORT)], "give it --gpus 1 or more"),
    (["--array", "5-1", "true"], "ranges go from a smaller to a larger index"),
    (["--array", "0-3%0", "true"], "the part after % is how many run at once"),
    (["--env", "=x", "true"], "write it as KEY=VALUE"),
    (["--cwd", "/etc/hostname", "true"], "is a file"),
    (["--json=yes", "true"], "does not take a value"),
    (["-", "x"], "command not found: -;"),
    (["\x1b[31mred-alert"], "command not found: red-alert;"),  # escapes are a terminal's, as click.echo has it
    # Input that once reached the daemon and failed every pass for everyone (issue 25): refused up front.
    (["--gpus", "0", "--array", "0-1%99999999999999999999", "true"], "how many run at once, a number from 1 to"),
    (["--array", "", "true"], "write indices like 0-49"),  # once queued a plain job
    (["--array", "0-20000", "true"], "at most 10000 members"),
    (["--time", "999999999999999h", "true"], "longer than any time limit can be"),  # once killed the supervisor
    (["--time", "400d", "true"], "is more than a year; give at most 8784h"),
    (["--retries", "99999999999999999999", "true"], "give a number from 0 to 100"),
    (["--gpus", "\u0663", "true"], "is not a valid integer (write it with the digits 0-9)"),  # Arabic-Indic 3
    (["--priority", "\u0663", "true"], "is not a valid integer"),
    (["--time", "\u0663h", "true"], "cannot read duration"),
    (["--mem", "\u0663G", "true"], "cannot read size"),
    (["--array", "\u0660-\u0663", "true"], "write indices like 0-49"),
    (["--name", "\udcff\udcfe", "true"], "--name holds bytes that are not UTF-8 text"),  # $'\xff\xfe' from a shell
    (["--env", "K=\udcff", "true"], "the environment variable K holds bytes that are not UTF-8"),
    (["true", "\udcff"], "argument 1 of the command holds bytes that are not UTF-8"),
    # Issue 39, friction 3: a placeholder an array does not fill reached each member as text.
    (["--array", "0-3", "echo", "{idx}"], "{idx} in the command is no placeholder of this array; it fills {index}"),
    (["--array", "0-3", "echo", "{Index}"], "did you mean {index}? (names are case-sensitive)"),
    (["--array", "0-1", "--name", "s{i}", "echo", "{index}"], "{i} in --name is no placeholder of this array"),
    (["--array", "lr=1,2", "echo", "{LR}"], "{LR} in the command is no placeholder of this array; did you mean {lr}?"),
    (["--array", "seed=7-0", "echo", "{seed}"], "the range 7-0 goes down; write it from the smaller number, like 0-7"),
    # Issue 39, friction 9: a typo of gpuq's option after the command went to the job; a quoted command
    # was "command not found".
    (
        ["echo", "--gpu", "2"],
        "--gpu is no option of gpuq's: did you mean --gpus? If --gpu is echo's own, give it "
        "after --, as in `echo -- --gpu ...`",
    ),
    (["echo", "x", "--prio=3"], "--prio is no option of gpuq's: did you mean --priority?"),
    (
        ["echo 1 --lr 2", "--gpus", "0"],
        "no program named 'echo 1 --lr 2': the whole command is one quoted word; unquote it: echo 1 --lr 2",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD_SUBMITS, ids=[" ".join(a) or "no-command" for a, _ in BAD_SUBMITS])
def test_bad_submit_is_one_line_exit_2_and_records_nothing(gpuq: Gpuq, args: list[str], message: str) -> None:
    gpuq.run("daemon", "start")  # so the GPU inventory is known, as on any machine that has run a job
    wait_for(lambda: (gpuq.home / "gpus.json").exists(), 10, "the daemon's first tick")
    counter = gpuq.home / "next_id"
    before = counter.read_text() if counter.exists() else None
    result = gpuq.run("submit", *args, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuq: ") and message in lines[0], result.stderr
    assert _spooled(gpuq) == []
    assert gpuq.status() == []
    assert (counter.read_text() if counter.exists() else None) == before  # no id was used up


def test_mem_that_fewer_gpus_than_asked_have_says_how_many_do(gpuq: Gpuq) -> None:
    gpuq.env["GPUQ_FAKE_GPUS"] = "2x24GiB,2x48GiB"
    gpuq.run("daemon", "start")
    wait_for(lambda: (gpuq.home / "gpus.json").exists(), 10, "the daemon's first tick")
    result = gpuq.run("submit", "--gpus", "3", "--mem", "40G", "true", check=False)
    assert result.returncode == 2
    assert result.stderr == (
        "gpuq: --mem 40.0G on each of 3 GPUs: only 2 here have that much (the largest has 48.0G); "
        "ask for less memory or at most 2 GPUs\n"
    )
    assert _spooled(gpuq) == [] and gpuq.status() == []


@pytest.mark.parametrize("command", [["show", "999"], ["logs", "999"], ["cancel", "999"], ["wait", "999"]])
def test_unknown_job_id_is_one_line_exit_2(gpuq: Gpuq, command: list[str]) -> None:
    gpuq.submit("true")
    result = gpuq.run(*command, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == "gpuq: no job 999 in this queue; `gpuq status --all` lists the known ids"
    assert not [name for name in _spooled(gpuq) if name.startswith("cancel-")]


def test_non_numeric_job_id_is_a_usage_error(gpuq: Gpuq) -> None:
    result = gpuq.run("show", "seventeen", check=False)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_unusable_state_directory_says_what_to_do(gpuq: Gpuq) -> None:
    gpuq.env["GPUQ_HOME"] = "/etc/hostname/gpuq"  # under a regular file: cannot be created, even by root
    result = gpuq.run("submit", "true", check=False)
    assert result.returncode == 2
    assert "set GPUQ_HOME to a directory you can write" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_fake_inventory_is_one_line(gpuq: Gpuq) -> None:
    gpuq.env["GPUQ_FAKE_GPUS"] = "lots"
    result = gpuq.run("submit", "true", check=False)
    assert result.returncode == 2 and "GPUQ_FAKE_GPUS" in result.stderr
    assert _spooled(gpuq) == []


def test_debug_shows_the_traceback(gpuq: Gpuq) -> None:
    result = gpuq.run("--debug", "show", "999", check=False)
    assert result.returncode != 0 and "Traceback" in result.stderr
