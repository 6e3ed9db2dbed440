# One module past 400 lines on purpose: every outside input gpuq reads, fuzzed the same way, side by side.
"""Fuzzing what gpuq reads from outside: spool files, command lines, and its own state files after damage.

Whatever arrives, gpuq answers with a value or a one-line error, never a traceback, and the daemon's
queue never stalls on it. Hypothesis runs derandomized (the same examples every run); the problems it
found are pinned as explicit regression tests below, named after what went wrong.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click.testing
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store import spool
from gpuq_scheduler.jobs.store.queue import expand
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.launcher.cli.app import main
from gpuq_scheduler.launcher.views import doctor
from tests.conftest import CLICK, Gpuq, make_env

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
REQUEST_TYPES = typing.get_args(spool.Request)
INT64 = 2**63

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=16,
)
numbers = st.integers() | st.floats() | st.sampled_from([0, 1, -1, INT64 - 1, INT64, 10**20])
specs = st.fixed_dictionaries(
    {"command": st.lists(st.text(max_size=6), min_size=1, max_size=3), "cwd": st.just("/tmp")},
    optional={
        "gpus": numbers,
        "mem_per_gpu": st.none() | numbers,
        "priority": numbers,
        "time_limit": st.none() | numbers,
        "mode": st.sampled_from(["single", "dataparallel", "torchrun", "bogus"]) | json_values,
        "name": st.text(max_size=6) | json_values,
        "python": st.none() | st.just("/usr/bin/python3"),
        "env": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2) | json_values,
    },
)
submits = st.fixed_dictionaries(
    {
        "schema": st.just(1),
        "kind": st.just("submit"),
        "id": numbers,
        "submitted_at": numbers,
        "spec": specs | json_values,
    }
)
cancels = st.fixed_dictionaries({"schema": st.just(1), "kind": st.just("cancel"), "ids": json_values})


def _request_file(directory: Path, body: Any) -> Path:
    job_id = body.get("id") if isinstance(body, dict) else None
    fits = isinstance(job_id, int) and not isinstance(job_id, bool) and job_id > 0
    name = f"submit-{job_id:012d}.json" if fits else "submit-000000000001.json"
    if isinstance(body, dict) and body.get("kind") == "cancel":
        name = "cancel-fuzz.json"
    path = directory / name
    path.write_text(json.dumps(body))
    return path


# -- (a) spool files ------------------------------------------------------------------------------------


@FUZZ
@given(raw=st.binary(max_size=4096), name=st.sampled_from(["submit-000000000001.json", "cancel-x.json", "x.json"]))
def test_any_bytes_in_the_spool_are_read_without_raising(tmp_path: Path, raw: bytes, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(raw)
    assert isinstance(spool.read_request(path), REQUEST_TYPES)


@FUZZ
@given(body=json_values | submits | cancels)
def test_any_json_in_the_spool_is_read_without_raising(tmp_path: Path, body: Any) -> None:
    path = _request_file(tmp_path, body)
    assert isinstance(spool.read_request(path), REQUEST_TYPES)


PARSER_BREAKERS = {
    "nested arrays": b"[" * 100_000,
    "nested objects": b'{"a":' * 100_000,
    "a submit time beyond floats": json.dumps(
        {"schema": 1, "kind": "submit", "id": 1, "submitted_at": 10**400, "spec": {"command": ["true"], "cwd": "/"}}
    ).encode(),
}


@pytest.mark.parametrize("raw", PARSER_BREAKERS.values(), ids=PARSER_BREAKERS.keys())
def test_a_request_that_breaks_the_parser_is_set_aside_not_raised(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "submit-000000000001.json"
    path.write_bytes(raw)
    assert isinstance(spool.read_request(path), spool.BadRequest)


@FUZZ
@example(
    body={
        "schema": 1,
        "kind": "submit",
        "id": 1,
        "submitted_at": 0,
        "spec": {"command": ["true"], "cwd": "/", "priority": 2**70},
    }
)
@example(
    body={"schema": 1, "kind": "submit", "id": INT64, "submitted_at": 0, "spec": {"command": ["true"], "cwd": "/"}}
)
@example(
    body={"schema": 1, "kind": "submit", "id": 1, "submitted_at": math.nan, "spec": {"command": ["true"], "cwd": "/"}}
)
@given(body=submits)
def test_every_request_the_spool_accepts_fits_in_the_job_table(tmp_path: Path, body: Any) -> None:
    request = spool.read_request(_request_file(tmp_path, body))
    if isinstance(request, spool.SubmitRequest):
        table = JobTable(tmp_path / "absent.db")  # an in-memory table with the real schema
        try:
            table.insert_pending(expand(StateDir(tmp_path), request))
        finally:
            table.close()


def test_an_absurd_priority_is_refused_at_submit(gpuq: Gpuq) -> None:
    result = gpuq.run("submit", "--gpus", "0", "--priority", "99999999999999999999", "true", check=False)
    assert result.returncode == 2 and result.stderr.startswith("gpuq: ") and "priority" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_request_the_table_cannot_store_does_not_stop_the_queue(gpuq: Gpuq) -> None:
    gpuq.run("daemon", "start")
    gpuq.run("daemon", "stop")
    bad = {
        "schema": 1,
        "kind": "submit",
        "id": 900,
        "submitted_at": 0.0,
        "spec": {"command": ["true"], "cwd": str(gpuq.cwd), "gpus": 0, "priority": 2**70},
    }
    (gpuq.home / "spool" / "submit-000000000900.json").write_text(json.dumps(bad))
    good = gpuq.submit("--gpus", "0", "true")
    assert gpuq.run("wait", str(good), check=False, timeout=10).returncode == 0


# -- (b) command lines ----------------------------------------------------------------------------------

COMMANDS = [
    ["submit"],
    ["status"],
    ["show"],
    ["logs"],
    ["cancel"],
    ["gpus"],
    ["daemon", "status"],
    ["daemon", "stop"],
    ["frobnicate"],
]
OPTIONS = ["--gpus", "--mem", "--name", "--priority", "--time", "--mode", "--env", "--cwd", "--json", "--all", "--help"]
VALUES = [
    "0",
    "1",
    "2",
    "4",
    "5",
    "-1",
    "99999999999999999999",
    "1G",
    "20",
    "20Q",
    "4GiB",
    "0.5G",
    "-3G",
    "1e400",
    "nan",
    "1h",
    "0s",
    "soon",
    "01:30:00",
    "single",
    "torchrun",
    "magic",
    "K=V",
    "NOEQUALS",
    "=x",
    "",
    " ",
    "true",
    "false",
    "sleep",
    "x.py",
    "./not-here.sh",
    "/no/such",
    ".",
    "'",
    '"',
    "$(id)",
    "--",
    "-",
    "\udcff",
    "é",
]
argv = st.tuples(st.sampled_from(COMMANDS), st.lists(st.sampled_from(OPTIONS + VALUES), max_size=6)).map(
    lambda parts: [*parts[0], *parts[1]]
)


@pytest.fixture
def cli_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The CLI in this process against a private state directory, with daemon start-up turned off."""
    home = tmp_path / "state"
    monkeypatch.setenv("GPUQ_HOME", str(home))
    monkeypatch.setenv("GPUQ_FAKE_GPUS", "4x80GiB")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("gpuq_scheduler.jobs.api.ensure_daemon", lambda state: False)  # requests wait in the spool
    return home


def run_main(args: list[str]) -> tuple[int, str, str]:
    """``gpuq ARGS`` in this process: exit code, stdout, stderr. Anything but SystemExit propagates."""
    with click.testing.CliRunner().isolation() as (out, err, _):
        try:
            main(args)
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else int(done.code is not None)
    return code, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")


def check_answer(args: list[str], code: int, stderr: str) -> None:
    assert code in (0, 1, 2), (args, code, stderr)
    assert "Traceback" not in stderr, (args, stderr)
    if code != 0:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuq: "), (args, stderr)


@FUZZ
@example(args=["show", "99999999999999999999"])
@given(args=argv)
def test_any_command_line_gets_an_answer_or_one_line_error(cli_home: Path, args: list[str]) -> None:
    code, _, stderr = run_main(args)
    check_answer(args, code, stderr)


@pytest.mark.parametrize("command", ["show", "logs", "cancel", "wait"])
def test_a_job_id_too_large_for_the_table_is_an_unknown_job(cli_home: Path, command: str) -> None:
    run_main(["submit", "--gpus", "0", "true"])
    code, _, stderr = run_main([command, "99999999999999999999"])
    assert code == 2 and stderr.startswith("gpuq: no job 99999999999999999999 in this queue"), stderr


@pytest.mark.parametrize("args", [[], ["daemon"]], ids=["gpuq", "gpuq daemon"])
def test_a_command_without_arguments_prints_its_help(cli_home: Path, args: list[str]) -> None:
    code, stdout, stderr = run_main(args)
    assert code == 0 and stdout.startswith("Usage: gpuq") and stderr == ""


SAMPLE = [
    ["submit", "--gpus", "5", "true"],
    ["submit", "--mem", "1e400", "true"],
    ["status", "--json", "--all"],
    ["show", "1", "--json"],
    ["cancel"],
    ["gpus", "--json"],
    ["frobnicate", "--gpus"],
    ["submit", "--", "--"],
]


@pytest.mark.parametrize("args", SAMPLE, ids=" ".join)
def test_the_real_command_answers_a_sample_in_one_line(gpuq: Gpuq, args: list[str]) -> None:
    result = gpuq.run(*args, check=False)
    check_answer(args, result.returncode, result.stderr)


# -- (c) damaged state files ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A state directory where a daemon ran three jobs and stopped."""
    root = tmp_path_factory.mktemp("pristine")
    work = root / "work"
    work.mkdir()
    client = Gpuq(root / "state", make_env(root / "state"), work)
    try:
        ids = [client.submit("--gpus", "0", "true"), client.submit("true"), client.submit("--gpus", "2", "false")]
        client.run("wait", *map(str, ids), check=False)
        client.run("daemon", "stop")
    finally:
        client.cleanup()
    yield root / "state"


@pytest.fixture
def damaged(pristine: Path, cli_home: Path) -> Path:
    """A copy of ``pristine`` at ``cli_home``, to damage."""
    shutil.copytree(pristine, cli_home, ignore=shutil.ignore_patterns("wake.fifo", "daemon.lock", "daemon.pid"))
    return cli_home


def _damage_table(home: Path, pristine: Path, how: tuple[str, int, bytes]) -> None:
    kind, where, junk = how
    data = (pristine / "jobs.db").read_bytes()
    if kind == "truncate":
        data = data[: where % (len(data) + 1)]
    elif kind == "overwrite":
        start = where % len(data)
        data = data[:start] + junk + data[start + len(junk) :]
    else:
        data = junk
    for side in ("jobs.db-wal", "jobs.db-shm"):
        (home / side).unlink(missing_ok=True)
    (home / "jobs.db").write_bytes(data)


table_damage = st.tuples(st.sampled_from(["truncate", "overwrite", "replace"]), st.integers(0, 1 << 20), st.binary())
READERS = [["status", "--all", "--json"], ["show", "1"], ["logs", "2"], ["cancel", "3"], ["gpus"]]


@FUZZ
@given(how=table_damage, counter=st.binary(max_size=24), inventory=st.binary(max_size=64) | json_values.map(json.dumps))
def test_the_doctor_reports_any_damage_to_the_state_files_and_never_raises(
    damaged: Path, pristine: Path, how: tuple[str, int, bytes], counter: bytes, inventory: str | bytes
) -> None:
    _damage_table(damaged, pristine, how)
    (damaged / "next_id").write_bytes(counter)
    (damaged / "gpus.json").write_bytes(inventory if isinstance(inventory, bytes) else inventory.encode())
    problems = doctor.check(StateDir(damaged))
    assert all("\n" not in p.message and p.severity in ("error", "warning") for p in problems)
    assert doctor.exit_code(problems) in (0, 1)


@FUZZ
@example(how=("truncate", 9000, b""))
@example(how=("replace", 0, b""))
@given(how=table_damage)
def test_readers_of_a_damaged_job_table_give_one_line_or_recover(
    damaged: Path, pristine: Path, how: tuple[str, int, bytes]
) -> None:
    _damage_table(damaged, pristine, how)
    for args in READERS:
        code, _, stderr = run_main(args)
        check_answer(args, code, stderr)


@FUZZ
@given(counter=st.binary(max_size=24))
def test_junk_in_next_id_does_not_stop_a_submit(damaged: Path, counter: bytes) -> None:
    (damaged / "next_id").write_bytes(counter)
    code, stdout, stderr = run_main(["submit", "--json", "--gpus", "0", "true"])
    assert code == 0, stderr
    job_id = json.loads(stdout)["id"]
    assert (damaged / "spool" / f"submit-{job_id:012d}.json").exists()


@pytest.mark.parametrize("counter", [None, b"", b"junk\n", b"\x00\x01"])
def test_a_lost_or_damaged_counter_never_hands_out_an_id_the_table_holds(damaged: Path, counter: bytes | None) -> None:
    if counter is None:
        (damaged / "next_id").unlink()
    else:
        (damaged / "next_id").write_bytes(counter)
    code, stdout, stderr = run_main(["submit", "--json", "--gpus", "0", "true"])
    assert code == 0, stderr
    assert json.loads(stdout)["id"] == 4


@FUZZ
@example(inventory=b'{"gpus": [{"total": 1e400}]}')
@example(inventory=b"[" * 100_000)
@given(inventory=st.binary(max_size=64) | json_values.map(lambda v: json.dumps({"gpus": v}).encode()))
def test_submit_survives_a_damaged_gpu_inventory(damaged: Path, inventory: bytes) -> None:
    (damaged / "gpus.json").write_bytes(inventory)
    args = ["submit", "--gpus", "1", "true"]
    code, _, stderr = run_main(args)
    check_answer(args, code, stderr)


def test_the_fixtures_state_directory_is_what_the_damage_tests_assume(pristine: Path) -> None:
    table = JobTable(pristine / "jobs.db")
    try:
        records: list[JobRecord] = table.records()
    finally:
        table.close()
    assert [r.id for r in records] == [1, 2, 3] and records[2].state is JobState.FAILED
    assert (pristine / "next_id").read_text().strip() == "4"
    assert (pristine / "gpus.json").exists()


TOML_WORDS = st.sampled_from(
    [
        "home",
        "shared",
        "clusters",
        "admins",
        "max_gpus_per_user",
        "max_queued_per_user",
        "fair_share_half_life",
        "priority",
        "lab",
        "backend",
        "partition",
        "account",
        "time",
        "sbatch_flags",
        "=",
        "[",
        "]",
        "[[",
        "]]",
        ".",
        '"/var/lib/gpuq"',
        '"slurm"',
        '"pbs"',
        '"24h"',
        '"-3h"',
        '"nonsense"',
        "0",
        "-1",
        "4",
        "1e999",
        "true",
        "[1, 2]",
        '["--qos=x"]',
        "{a = 1}",
        "\n",
        " ",
        '"',
        "#",
    ]
)


@FUZZ
@given(st.one_of(st.lists(TOML_WORDS, max_size=40).map(" ".join), st.binary(max_size=200).map(bytes.hex)))
@example("[shared]\nmax_gpus_per_user = 0")
@example('[clusters.lab]\nbackend = "pbs"')
@example('home = "relative/path"')
@example("[shared.priority]\nalice = 1e3")
def test_any_config_file_loads_or_gets_one_line_naming_the_file(tmp_path: Path, text: str) -> None:
    from gpuq_scheduler.jobs import config

    path = tmp_path / "config.toml"
    path.write_text(text)
    env = {"GPUQ_CONFIG": str(path), "GPUQ_SYSTEM_CONFIG": str(tmp_path / "none.toml")}
    try:
        loaded = config.load(env)
    except config.ConfigError as err:
        assert str(path) in str(err) and "\n" not in str(err)
    else:
        assert loaded.sources == (path,)


def test_a_broken_config_file_is_one_line_and_exit_2_for_every_command(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[shared]\nmax_gpus_per_user = -1\n")
    env = {**os.environ, "GPUQ_CONFIG": str(path), "GPUQ_SYSTEM_CONFIG": str(tmp_path / "none.toml")}
    env.pop("GPUQ_HOME", None)
    for args in (["status"], ["submit", "true"], ["daemon", "start", "--shared"]):
        result = subprocess.run([*CLICK, *args], env=env, capture_output=True, text=True)
        assert result.returncode == 2, result
        assert "max_gpus_per_user" in result.stderr and result.stderr.count("\n") == 1, result.stderr
