# One module past 400 lines on purpose: the quick submit against click's, option by option, in one table.
"""The quick `gpuq submit` (launcher.cli.submit) against click's: same options, same requests, same errors.

Each submit runs in a fresh process, as users run it. No daemon is started: the test holds the state
directory's wake FIFO open for reading, so the submit's wake-up finds "a daemon" and requests stay in
the spool to be read back. ``gpus.json`` is written by hand, as a daemon's first look at the GPUs would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from gpuq_scheduler.jobs.model import Mode
from gpuq_scheduler.jobs.rules import MODES
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.submission import inventory_json
from gpuq_scheduler.launcher.cli import own_jobs as click_commands
from gpuq_scheduler.launcher.cli import submit as cli_submit
from gpuq_scheduler.launcher.cli.context import NUMBER
from tests.conftest import ROOT, Gpuq, make_env
from tests.installed import installed_tree
from tests.test_cli_errors import BAD_SUBMITS

GiB = 1 << 30
QUICK = "gpuq_scheduler.launcher.cli.entry"
CLICK = "gpuq_scheduler.launcher.cli.app"
# Runs an entry point's main, then reports on stderr which modules that process loaded.
DRIVER = (
    "import sys\n"
    "main = __import__(sys.argv[1], fromlist=['main']).main\n"
    "try:\n"
    "    main(sys.argv[2:])\n"
    "finally:\n"
    "    sys.stderr.write('\\nLOADED ' + ' '.join(sorted(sys.modules)) + '\\n')\n"
)
HEAVY = (
    "click",
    "dataclasses",
    "typing",
    "inspect",
    "sqlite3",
    "subprocess",
    "pynvml",
    "psutil",
    "torch",
    "hashlib",
    "shutil",
    "pathlib",  # ~2 ms each (OpenSSL; bz2 and lzma; urllib.parse and ipaddress)
    "re",
    "enum",
    "json",
    "contextlib",
    "collections",  # 4 ms (re loads enum), 1.6 ms, 1 ms, 1 ms
    *(
        f"gpuq_scheduler.{m}"
        for m in (
            "jobs.model",
            "jobs.outcome",
            "jobs.store.spool",
            "jobs.store.queue",
            "jobs.api",
            "jobs.config",
            "launcher.cli.app",
        )
    ),
)


class Run:
    """One `gpuq ...` process: its exit code, its output, and the modules it loaded."""

    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        self.returncode = done.returncode
        self.stdout = done.stdout
        self.stderr, _, loaded = done.stderr.rpartition("\nLOADED ")
        self.modules = set(loaded.split())


class Queue:
    """A state directory with a GPU inventory and a wake FIFO held open, and a work directory."""

    def __init__(self, tmp: Path, env: dict[str, str], home: Path) -> None:
        self.home = home
        self.env = env
        self.work = tmp / "work dir"
        self.work.mkdir()
        (self.work / "train.py").write_text("print('hi')\n")
        (self.work / "sub dir").mkdir()
        (self.work / "a file").write_text("")

    def inventory(self, *totals: int) -> None:
        gpus = [
            {"index": i, "uuid": f"GPU-{i}", "name": "fake", "total": total, "lost": False}
            for i, total in enumerate(totals)
        ]
        (self.home / "gpus.json").write_bytes(inventory_json(gpus))  # as the daemon writes it

    def gpuq(self, entry: str, *args: str, bare: bool = False) -> Run:
        """``bare``: without site (-S), from the package laid out as it installs: an editable install's
        import hook, loaded by site, imports pathlib and more before gpuq runs at all."""
        python, env = [sys.executable], self.env
        if bare:
            python, env = [sys.executable, "-S"], {**self.env, "PYTHONPATH": str(installed_tree())}
        done = subprocess.run(
            [*python, "-c", DRIVER, entry, *args], env=env, cwd=self.work, capture_output=True, text=True, timeout=60
        )
        return Run(done)

    def requests(self) -> list[Path]:
        return sorted((self.home / "spool").glob("submit-*.json"))

    def counter(self) -> str:
        return (self.home / "next_id").read_text()


def _open_queue(tmp: Path, env: dict[str, str], home: Path) -> Iterator[Queue]:
    StateDir(home).ensure()
    reader = os.open(home / "wake.fifo", os.O_RDONLY | os.O_NONBLOCK)  # "the daemon": wake-ups land here
    try:
        queue = Queue(tmp, env, home)
        queue.inventory(80 * GiB, 80 * GiB, 40 * GiB, 40 * GiB)
        (home / "next_id").write_text("1\n")  # as a daemon's start leaves it
        yield queue
    finally:
        os.close(reader)


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Queue]:
    home = tmp_path / "state dir 'quoted'"
    yield from _open_queue(tmp_path, make_env(home), home)


# -- the two parsers cannot drift apart ----------------------------------------------------------------


def _kind(option: click.Option) -> str:
    if option.is_flag:
        return "flag"
    if option.multiple:
        assert option.type is click.STRING
        return "list"
    if isinstance(option.type, click.Choice):
        assert tuple(option.type.choices) == MODES
        return "mode"
    if isinstance(option.type, click.Path):
        assert not option.type.file_okay and not option.type.exists
        return "dir"
    return {NUMBER: "int", click.STRING: "str"}[option.type]


def test_the_quick_parser_has_every_option_of_clicks_submit_with_its_kind_and_default() -> None:
    options = {p.opts[0]: p for p in click_commands.submit.params if isinstance(p, click.Option)}
    assert set(options) == set(cli_submit.OPTIONS)  # both ways: no option only one of them knows
    defaults = click_commands.submit.make_context("submit", ["true"]).params
    for flag, option in options.items():
        assert option.opts == [flag] and not option.secondary_opts and option.nargs == 1, flag
        dest, kind, default = cli_submit.OPTIONS[flag]
        assert (dest, kind) == (option.name, _kind(option)), flag
        assert defaults[dest] == default, flag
    (argument,) = [p for p in click_commands.submit.params if isinstance(p, click.Argument)]
    assert (argument.name, argument.nargs, argument.required) == ("command", -1, True)
    assert click_commands.submit.context_settings["allow_interspersed_args"] is False  # what parse() mimics
    assert {"-h", "--help"} & set(cli_submit.OPTIONS) == set()  # help is click's to print
    assert tuple(mode.value for mode in Mode) == MODES


# -- the same argv writes the same request ------------------------------------------------------------

SAME = [
    ["true"],
    ["train.py", "--lr", "0.1"],
    ["--gpus", "0", "true"],
    ["--gpus", "2", "--mem", "20G", "true"],
    ["--gpus=2", "--mem=4GiB", "--json", "true"],
    ["--time", "1h30m", "true"],
    ["--time", "01:30:00", "true"],
    ["--name", "first try", "--priority", "-5", "true"],
    ["--mode", "dataparallel", "--gpus", "2", "train.py"],
    ["--mode", "torchrun", "--gpus", "2", "train.py", "--epochs", "3"],
    ["--env", "A=1", "--env", "B=x=y", "--env", "A=2", "true"],
    ["--cwd", "sub dir", "true"],
    ["--cwd", "", "true"],
    ["--retries", "2", "--oom-retry", "--notify", "echo done", "true"],
    ["--notify", "", "true"],
    ["--preemptible", "--priority", "-1", "true"],
    ["--preemptible", "--preempt-signal", "sigusr2", "true"],
    ["--array", "0-9%2", "--name", "seed{index}", "train.py", "--seed", "{index}"],
    ["--array", "1,3,7", "--json", "seed_{index}.py"],
    ["--gpus", "1", "--gpus", "3", "true"],
    ["--name", "--json", "true"],
    ["true", "--gpus", "3", "--help", "--priority", "1"],
    ["--", "ls", "-l"],
    ["--gpus", "0", "--", "--weird-name"],
    ["sh", "-c", "echo $0", "--", "x"],
    ["train.py", "--gpus", "2"],
    ["train.py", "--gpus=2", "--lr", "0.1", "--name", "t"],
    ["train.py", "--gpus", "2", "--", "--lr", "0.1", "--gpus", "4"],
    ["python", "train.py", "--gpus", "2", "--seed", "1"],
    ["sh", "-c", "echo --gpus 3 $1", "--gpus", "0", "--", "--name"],
    ["true", "-h", "--json"],
    ["--array", "lr=1e-4,1e-3%1", "echo", "{lr}", "{seed}", "--array", "seed=1,2", "--name", "s{seed}"],
    ["--array", "seed=0-20:5", "--array", "lr=-1,1e-3", "sh", "-c", "echo ${HOME} {seed} {lr}"],
    ["echo", "--model", "x", "--", "--gpu", "2"],  # not --mode's typo; after -- it is the job's on purpose
]


@pytest.mark.parametrize("args", SAME, ids=[" ".join(a) for a in SAME])
def test_quick_and_click_write_the_same_request_and_print_the_same(queue: Queue, args: list[str]) -> None:
    if args[-1] == "--weird-name":
        (queue.work / "--weird-name").write_text("#!/bin/sh\n")
        (queue.work / "--weird-name").chmod(0o755)
        queue.env = {**queue.env, "PATH": f"{queue.work}{os.pathsep}{queue.env['PATH']}"}
    written = {}
    for entry in (QUICK, CLICK):
        counter = queue.counter()
        run = queue.gpuq(entry, "submit", *args)
        assert run.returncode == 0, run.stderr
        (request,) = queue.requests()
        raw = request.read_text()
        request.unlink()
        (queue.home / "next_id").write_text(counter)  # the same id again, so the outputs can be compared
        body = json.loads(raw)
        assert list(body) == ["schema", "kind", "id", "submitted_at", "spec", *(["array"] if "array" in body else [])]
        body.pop("submitted_at")
        written[entry] = (body, list(body["spec"]), run.stdout, run.stderr)
        assert ("click" in run.modules) is (entry == CLICK)  # the quick path took it, click was not asked
    assert written[QUICK] == written[CLICK]


def test_gpuqs_options_after_the_command_are_gpuqs_and_after_a_double_dash_the_jobs(queue: Queue) -> None:
    """The headline `gpuq submit train.py --gpus 2` queued `train.py --gpus 2` on one GPU."""
    for entry in (QUICK, CLICK):
        queue.gpuq(entry, "submit", "train.py", "--gpus", "2", "--lr", "0.1", "--", "--gpus", "4", "--", "-h")
        (request,) = queue.requests()
        spec = json.loads(request.read_text())["spec"]
        request.unlink()
        assert spec["command"] == ["train.py", "--lr", "0.1", "--gpus", "4", "--", "-h"] and spec["gpus"] == 2


def test_the_split_rule() -> None:
    takes = cli_submit.TAKES_VALUE
    assert cli_submit.split(["train.py", "--gpus", "2"], takes) == (["--gpus", "2"], ["train.py"])
    assert cli_submit.split(["--", "train.py", "--gpus", "2"], takes) == ([], ["train.py", "--gpus", "2"])
    assert cli_submit.split(["--bogus", "x.py", "--help"], takes) == (["--bogus"], ["x.py", "--help"])
    assert cli_submit.split(["x.py", "--json", "--name"], takes) == (["--json", "--name"], [])  # lacks its value
    bash = ["bash", "-c", "python t.py --gpus 4"]  # one word: the shell's script is the job's
    assert cli_submit.split(bash, takes) == ([], bash)


def test_an_array_prints_its_members(queue: Queue) -> None:
    assert queue.gpuq(QUICK, "submit", "--array", "0-9%2", "echo", "{index}").stdout == (
        "submitted array 1 (10 jobs, 2-11)\n"
    )
    body = json.loads(queue.requests()[0].read_text())
    assert body["array"] == {"indices": list(range(10)), "throttle": 2}
    assert json.loads(queue.gpuq(QUICK, "submit", "--json", "--array", "4,5", "true").stdout) == {
        "id": 12,
        "jobs": [13, 14],
    }


# -- what a quick submit loads ----------------------------------------------------------------------------


@pytest.mark.parametrize("home_from", ["GPUQ_HOME", "XDG_STATE_HOME"])
def test_a_quick_submit_loads_no_heavy_module(tmp_path: Path, home_from: str) -> None:
    env = make_env(tmp_path / "state")
    if home_from == "XDG_STATE_HOME":  # the usual case: no GPUQ_HOME, no config file
        del env["GPUQ_HOME"]
        env.update(
            XDG_STATE_HOME=str(tmp_path / "xdg"),
            GPUQ_CONFIG=str(tmp_path / "no config.toml"),
            GPUQ_SYSTEM_CONFIG=str(tmp_path / "no system config.toml"),
        )
    home = Path(env.get("GPUQ_HOME") or tmp_path / "xdg" / "gpuq")
    for queue in _open_queue(tmp_path, env, home):
        for args in (
            ["--gpus", "2", "--mem", "20G", "--time", "2h", "true"],
            ["--json", "--array", "0-3%2", "--env", "A=1", "train.py", "{index}"],
        ):
            run = queue.gpuq(QUICK, "submit", *args, bare=True)
            assert run.returncode == 0, run.stderr
            assert sorted(run.modules & set(HEAVY)) == []
        assert len(queue.requests()) == 2


def test_the_gpuq_script_loads_no_heavy_module(queue: Queue) -> None:
    """The installed command itself (launcher/cli/gpuq, not a console-script wrapper, which imports re),
    without site, as in test_a_quick_submit_loads_no_heavy_module. It ends with os._exit, so what it loaded
    is read from -X importtime."""
    script = ROOT / "launcher" / "cli" / "gpuq"
    done = subprocess.run(
        [sys.executable, "-S", "-X", "importtime", str(script), "submit", "--mem", "2G", "--time", "1h", "true"],
        env={**queue.env, "PYTHONPATH": str(installed_tree())},
        cwd=queue.work,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "submitted job 1\n"
    loaded = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "gpuq_scheduler.launcher.cli.entry" in loaded
    assert sorted(loaded & set(HEAVY)) == []


def test_the_inventory_written_by_an_older_daemon_is_read_in_full(queue: Queue) -> None:
    """gpus.json without the totals first (as earlier daemons wrote it): the quick path parses it whole."""
    gpus = [{"index": 0, "uuid": "GPU-0", "name": "fake", "total": 40 * GiB, "lost": False}]
    (queue.home / "gpus.json").write_text(json.dumps({"gpus": gpus}))
    run = queue.gpuq(QUICK, "submit", "--gpus", "2", "true")
    assert run.returncode == 2
    assert "more GPUs than this machine has (1)" in run.stderr


# -- what goes to click -------------------------------------------------------------------------------------

FALLBACKS = [
    (["--help"], 0, "Usage: gpuq submit [OPTIONS] COMMAND..."),
    (["-h", "true"], 0, "Usage: gpuq submit [OPTIONS] COMMAND..."),
    (["--gpu", "2", "true"], 2, "No such option '--gpu'. (Did you mean one of: '--cpus', '--gpu-ids', '--gpus'"),
    (["--gpus", "x", "true"], 2, "'x' is not a valid integer"),
    (["--gpus"], 2, "Option '--gpus' requires an argument"),
    (["--json=yes", "true"], 2, "Option '--json' does not take a value"),
    (["--mode", "fast", "true"], 2, "'fast' is not one of"),
    (["--cwd", "a file", "true"], 2, "is a file"),
    (["--gpus", "1"], 2, "Missing argument 'COMMAND...'"),
    (["--"], 2, "Missing argument 'COMMAND...'"),
    (["--on", "lab", "true"], 2, "no cluster named 'lab'"),
    (["--after", "99", "true"], 2, "no job 99 in this queue"),
    (["--after-any", "true"], 2, "--after-any says how to read --after"),
    (["true", "--gpus"], 2, "Option '--gpus' requires an argument"),
    (["train.py", "--mode", "eval"], 2, "'torchrun'; if --mode is train.py's own, give it after --"),
]


@pytest.mark.parametrize(("args", "code", "says"), FALLBACKS, ids=[" ".join(a) for a, _, _ in FALLBACKS])
def test_what_the_quick_path_does_not_handle_goes_to_click(queue: Queue, args: list[str], code: int, says: str) -> None:
    run = queue.gpuq(QUICK, "submit", *args)
    assert "click" in run.modules
    assert run.returncode == code and says in run.stdout + run.stderr, run.stdout + run.stderr
    if code:
        assert run.stdout == "" and len(run.stderr.splitlines()) == 1
    assert queue.requests() == [] and queue.counter() == "1\n"
    clicked = queue.gpuq(CLICK, "submit", *args)
    assert (clicked.returncode, clicked.stdout, clicked.stderr) == (run.returncode, run.stdout, run.stderr)


def test_a_global_option_before_submit_goes_to_click(queue: Queue) -> None:
    run = queue.gpuq(QUICK, "--debug", "submit", "--gpus", "0", "true")
    assert run.returncode == 0 and run.stdout == "submitted job 1\n" and "click" in run.modules


def test_without_a_gpu_inventory_click_looks_at_the_gpus(queue: Queue) -> None:
    (queue.home / "gpus.json").unlink()
    run = queue.gpuq(QUICK, "submit", "--gpus", "2", "true")
    assert run.returncode == 0 and run.stdout == "submitted job 1\n"
    assert "gpuq_scheduler.launcher.gpus.sources" in run.modules
    too_many = queue.gpuq(QUICK, "submit", "--gpus", "5", "true")  # GPUQ_FAKE_GPUS=4x80GiB, seen live
    assert too_many.returncode == 2 and "more GPUs than this machine has (4)" in too_many.stderr
    assert len(queue.requests()) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="a queue owned by someone else needs root to set up")
def test_a_shared_queue_goes_to_click(queue: Queue) -> None:
    os.chown(queue.home, 65534, -1)  # nobody's queue: per-user caps are in its config, read by click's path
    (queue.home / "wake.fifo").unlink()  # and its daemon is not running: there only the daemon gives ids
    run = queue.gpuq(QUICK, "submit", "--gpus", "1", "true")
    assert run.returncode == 0 and "click" in run.modules and len(queue.requests()) == 1
    assert run.stdout == "" and "no id yet" in run.stderr  # queued, and no id printed that could prove untrue


def test_wait_and_after_go_to_click_and_work(gpuq: Gpuq) -> None:
    first = gpuq.submit("--gpus", "0", "true")
    driver = [sys.executable, "-c", DRIVER, QUICK, "submit", "--wait", "--after", str(first), "--gpus", "0", "true"]
    done = subprocess.run(driver, env=gpuq.env, cwd=gpuq.cwd, capture_output=True, text=True, timeout=120)
    run = Run(done)
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"submitted job {first + 1}\n" and "click" in run.modules
    assert gpuq.job(first + 1)["state"] == "succeeded"


# -- bad input: the same one line from both, and nothing written -----------------------------------------

BAD = [args for args, _ in BAD_SUBMITS]  # tests/test_cli_errors.py checks each message, with a daemon running


@pytest.mark.parametrize("args", BAD, ids=[" ".join(a) for a in BAD])
def test_bad_input_is_refused_in_the_same_words_by_both_and_writes_nothing(queue: Queue, args: list[str]) -> None:
    quick = queue.gpuq(QUICK, "submit", *args)
    assert ("click" in quick.modules) is (cli_submit.parse(args) is None)  # a usage error is click's to word
    clicked = queue.gpuq(CLICK, "submit", *args)
    assert quick.returncode == 2 and quick.stdout == "" and quick.stderr.startswith("gpuq: ")
    assert len(quick.stderr.splitlines()) == 1 and "\x1b" not in quick.stderr  # escapes only for a terminal
    assert (quick.returncode, quick.stdout, quick.stderr) == (clicked.returncode, clicked.stdout, clicked.stderr)
    assert queue.requests() == [] and queue.counter() == "1\n"


def test_other_commands_go_to_click(queue: Queue) -> None:
    run = queue.gpuq(QUICK, "status", "--all", "--json")
    assert run.returncode == 0 and run.stdout == "[]\n" and "click" in run.modules


def test_host_limits_are_written_alike_where_the_daemon_recorded_the_controllers(queue: Queue) -> None:
    """A daemon that could hand the cpu and memory controllers down recorded so in gpus.json: both paths
    write --cpus and --ram into the same request; recorded without them, both refuse in the same words."""
    gpus = [{"index": 0, "uuid": "GPU-0", "name": "fake", "total": 80 * GiB, "lost": False, "fence": "mps"}]
    for controllers, code in ((["cpu", "memory"], 0), ([], 2)):
        host = {"containment": {"kind": "cgroup", "controllers": controllers, "limits_why": "no memory here"}}
        (queue.home / "gpus.json").write_bytes(inventory_json(gpus, host))
        seen = {}
        for entry in (QUICK, CLICK):
            counter = queue.counter()
            run = queue.gpuq(entry, "submit", "--cpus", "2.5", "--ram", "4G", "true")
            assert run.returncode == code, run.stderr
            assert ("click" in run.modules) is (entry == CLICK)  # the quick path read the record itself
            spec = json.loads(queue.requests()[0].read_text())["spec"] if code == 0 else {}
            for request in queue.requests():
                request.unlink()
            (queue.home / "next_id").write_text(counter)
            seen[entry] = (spec.get("cpus"), spec.get("ram"), run.stdout, run.stderr)
        assert seen[QUICK] == seen[CLICK]
        if code == 0:
            assert seen[QUICK][:2] == (2.5, 4 * GiB)
        else:
            assert "--cpus cannot be enforced here" in seen[QUICK][3] and "no memory here" in seen[QUICK][3]
