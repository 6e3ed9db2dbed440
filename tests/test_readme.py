"""The front page's commands work as written: every one is run, in order, on a fresh queue with fake GPUs.

README.md's code blocks are fenced and tagged: ``sh`` blocks are run line by line (a trailing backslash
joins lines), ``console`` blocks are ``$ command`` lines each followed by exactly what it prints, and
``python`` blocks are run as scripts. A block after ``<!-- readme-test: setup -->`` is one of the two
set-up commands, checked against what CI runs (``.ci/run``) rather than installing anything again; one after
``<!-- readme-test: root -->`` changes the machine (/opt, /etc, systemd), so each of its gpuq commands is
checked to exist with the options it uses. ``train.py`` stands for the reader's script: the test writes
one that prints what it was given.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, Gpuq, make_env

README = ROOT / "README.md"
BLOCK = re.compile(r"(?:<!-- readme-test: (\w+) -->\n)?```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
TRAIN = """import os, sys, time
time.sleep(0.2)
print("train.py", sys.argv[1:], "on GPUs", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
"""


def blocks(kind: str, mark: str | None = None) -> list[str]:
    return [
        body
        for found_mark, found_kind, body in BLOCK.findall(README.read_text())
        if found_kind == kind and (found_mark or None) == mark
    ]


def commands(body: str) -> list[str]:
    """The block's command lines, continuation lines joined."""
    return [line.strip() for line in body.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_front_page_is_read_in_ten_minutes_and_links_pages_that_exist() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for target in re.findall(r"\]\(((?:docs/)[^)#]+)(?:#[^)]*)?\)", text):
        if target != "docs/security.md":  # written beside this page by the security work (#25)
            assert (ROOT / target).exists(), f"the front page links {target}, which does not exist"
    for page in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([\w.-]+\.(?:md|png))(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists() or target == "security.md", f"{page.name} links {target}"


def test_the_two_set_up_commands_are_what_ci_runs() -> None:
    ensemble, tests = (commands(body) for body in blocks("sh", "setup"))
    ci = [
        line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set "))
    ]
    assert tests == [ci[-1]], "the front page's test command must be exactly .ci/run's"
    assert ci[-2] == 'cd "$(dirname "$0")/.."'
    # The main job: a venv, an install with the extras the page names, and the example ensemble.
    assert ensemble == [
        "python3 -m venv .venv && .venv/bin/pip install '.[torch,top,serve]' && "
        ".venv/bin/python examples/ensemble.py --members 8"
    ]
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"torch", "top", "serve"} <= set(extras)
    assert (ROOT / "examples" / "ensemble.py").exists()


def test_the_team_set_up_uses_commands_and_options_that_exist(tmp_path: Path) -> None:
    (block,) = blocks("sh", "root")
    lines = commands(block)
    assert len(lines) == 3, "the team set-up is three commands"
    env = make_env(tmp_path / "home")
    gpuq = [sys.executable, "-m", "gpuq_scheduler"]
    used = [found.split() for line in lines for found in re.findall(r"\bgpuq((?: [\w-]+)+)", line)]
    assert [words[:2] for words in used] == [["daemon", "setup"], ["daemon", "start"]]  # (the second: to try)
    for words in used:
        subcommand, options = words[:2], [w for w in words if w.startswith("--")]
        shown = subprocess.run([*gpuq, *subcommand, "--help"], env=env, capture_output=True, text=True)
        assert shown.returncode == 0, f"gpuq {' '.join(words)}: {shown.stderr}"
        for option in options:
            assert option in shown.stdout, f"gpuq {' '.join(subcommand)} has no {option}"
    assert "pip install ." in lines[0] and "systemctl enable --now gpuq" in lines[2]
    unit = subprocess.run([*gpuq, "daemon", "unit"], env=env, capture_output=True, text=True)
    assert unit.returncode == 0 and "[Service]" in unit.stdout, unit.stderr


@pytest.fixture
def fresh(tmp_path: Path) -> Gpuq:
    home, work = tmp_path / "state dir", tmp_path / "work dir"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    env = make_env(home, "4x80GiB")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]  # as after activating the venv
    env.pop("COLUMNS", None)
    return Gpuq(home, env, work)


def run(queue: Gpuq, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command),
        env=queue.env,
        cwd=queue.cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )


def test_every_command_on_the_front_page_works_as_written(fresh: Gpuq) -> None:
    """In the page's order, on one queue, as a newcomer would type them (ids are the page's: a fresh queue)."""
    ran = 0
    try:
        for mark, kind, body in BLOCK.findall(README.read_text()):
            if mark:
                continue  # set-up and root: the two tests above
            if kind == "sh":
                for line in commands(body):
                    done = run(fresh, "bash", "-c", line)
                    assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
                    ran += 1
            elif kind == "console":
                for command, expected in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", body, re.MULTILINE):
                    done = run(fresh, "bash", "-c", command)
                    assert (done.stdout + done.stderr).strip() == expected.strip(), command
                    ran += 1
            elif kind == "python":
                script = fresh.cwd / f"readme-{ran}.py"
                script.write_text(body)
                done = run(fresh, sys.executable, str(script))
                assert done.returncode == 0, f"{body}\n{done.stdout}{done.stderr}"
                ran += 1
        # What the page says the commands did, on the queue itself.
        jobs = {job["id"]: job for job in fresh.status()}
        assert jobs[1]["gpus"] == [0, 1] and jobs[1]["state"] == "succeeded"
        assert "train.py ['--lr', '0.1'] on GPUs 0,1" in fresh.run("logs", "1").stdout
        assert [jobs[i]["array_id"] for i in range(3, 11)] == [2] * 8 and jobs[11]["name"] == "vote"
        assert all(job["state"] == "succeeded" for job in jobs.values()), jobs
    finally:
        fresh.cleanup()
    assert ran >= 15
