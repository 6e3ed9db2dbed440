"""`gpuq top` in a real terminal: tmux runs it at 80x24 against a real daemon on fake GPUs; the test types
keys with send-keys and reads the screen with capture-pane."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import THREE_GPUS, Gpuq, fake_cuda_queue, wait_for

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(
    TMUX is None and not os.environ.get("CI"), reason="needs tmux (CI installs it: .ci/run)"
)


class Terminal:
    """One tmux server of our own (its own socket), with one 80x24 window running a command."""

    def __init__(self, socket: Path, command: str, env: dict[str, str], columns: int = 80) -> None:
        assert TMUX, "CI runs the terminal tests, but tmux is missing: apt-get install tmux"
        self.base = [TMUX, "-S", str(socket)]
        size = ["-x", str(columns), "-y", "24"]
        subprocess.run([*self.base, "new-session", "-d", *size, command], env=env, check=True)

    def screen(self, escapes: bool = False) -> str:
        flags = ["-p", "-e"] if escapes else ["-p"]
        done = subprocess.run([*self.base, "capture-pane", *flags], capture_output=True, text=True)
        return done.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", *keys], check=True)

    def shows(self, pattern: str, timeout: float = 20) -> str:
        return str(wait_for(lambda: re.search(pattern, self.screen()) and self.screen(), timeout, f"{pattern!r}"))

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True)


@pytest.fixture
def box(tmp_path: Path) -> Iterator[tuple[Gpuq, dict[str, int]]]:
    """Three GPUs (one with a teammate's 10 GiB on it, one lost), a packed job holding 3 GiB, a 2-GPU job
    that cannot start, and an array."""
    gpuq = fake_cuda_queue(tmp_path, THREE_GPUS, TERM="xterm-256color", COLUMNS="80", LINES="24")
    jobs = {
        "packed": gpuq.submit("--mem", "8G", "--name", "packed", "fake_cuda.py", "3", "300", "--busy", "60"),
        "big": gpuq.submit("--gpus", "2", "--name", "big", "sleep", "300"),
    }
    array = json.loads(
        gpuq.run(
            "submit", "--json", "--array", "0-3", "--gpus", "0", "--name", "seeds", "--time", "10m", "sleep", "300"
        ).stdout
    )["id"]
    jobs["array"] = int(array)
    gpuq.wait_state(jobs["packed"], "running")
    yield gpuq, jobs
    gpuq.cleanup()


def _top(gpuq: Gpuq, tmp_path: Path, *env: str, columns: int = 80) -> Terminal:
    command = " ".join([*env, "python", "-m", "gpuq_scheduler", "top", "--interval", "0.5"])
    return Terminal(tmp_path / "tmux.sock", f"{command}; sleep 60", gpuq.env, columns)


def test_top_counts_jobs_not_rows_and_uses_a_wide_terminals_width(
    box: tuple[Gpuq, dict[str, int]], tmp_path: Path
) -> None:
    """An array of 4 folded into one row was counted as one job; the bars stayed 30 wide in 200 columns."""
    gpuq, _ = box
    term = _top(gpuq, tmp_path, "COLUMNS=200", columns=200)
    try:
        screen = term.shows(r"USES\s+UTIL\s+RUNTIME")

        def counted() -> tuple[int, int] | None:
            found = re.search(r"(\d+) running  (\d+) waiting", term.screen())
            return (int(found[1]), int(found[2])) if found else None

        # The packed job, the 2-GPU job and the array's 4 members: 6 jobs in at most 4 rows.
        wait_for(lambda: (shown := counted()) is not None and sum(shown) == 6, 30, "6 jobs counted")
        bar = next(line for line in screen.splitlines() if line.startswith("[") and "] jobs " in line)
        assert len(bar.split("]")[0]) > 100, bar
    finally:
        term.close()


def test_top_shows_the_gpus_and_the_jobs_in_80_columns(box: tuple[Gpuq, dict[str, int]], tmp_path: Path) -> None:
    gpuq, jobs = box
    term = _top(gpuq, tmp_path)
    try:
        screen = term.shows(r"USES\s+UTIL\s+RUNTIME")
        screen = term.shows(r"jobs 3\.5G")  # the packed job's memory, as fake NVML sees it, once sampled
        lines = screen.splitlines()
        assert len(lines) <= 24 and max(len(line) for line in lines) <= 80
        assert re.search(r"GPU 0 H100 +util +35% +free .* fence \S+ +ok", screen)
        assert re.search(r"GPU 1 H100 +util +80% .* ok", screen) and re.search(r"GPU 2 .* LOST", screen)
        bars = {int(lines[i].split()[1]): lines[i + 1] for i, line in enumerate(lines) if line.startswith("GPU ")}
        placed = gpuq.job(jobs["packed"])["gpus"][0]
        assert "█" in bars[placed] and "▒" in bars[placed] and "jobs 3.5G res 9.0G" in bars[placed]  # use, share
        assert "░" in bars[0] and "out 10.0G" in bars[0]  # the teammate's 10 GiB on GPU 0
        # GPUS is how many it asked for (1), ON which GPU it holds (issue #39, friction 8)
        assert re.search(rf"^ {jobs['packed']} +\S+ +packed +1 +{placed} +9\.0G +3\.5G +60% ", screen, re.MULTILINE)
        assert re.search(rf"^ {jobs['big']} +\S+ +big +2 +whole .* waiting for 2 GPUs", screen, re.MULTILINE)
        # The array is folded: one line in each table it has members in (2 cores: some wait for a CPU slot).
        assert len(re.findall(rf"seeds \[\+\d of array {jobs['array']}\]", screen)) in (1, 2)
        term.keys("e")
        screen = wait_for(lambda: (s := term.screen()).count(" seeds ") == 4 and s, 20, "4 lines of seeds")
        assert "of array" not in screen and re.search(r" (10m|9m\d\ds)\n", screen)  # time left of --time 10m
        term.keys("s")
        term.shows("sort: user")
        term.keys("m")
        term.shows("mine only")
    finally:
        term.close()


def test_top_cancels_and_holds_ones_own_jobs_after_a_yes(box: tuple[Gpuq, dict[str, int]], tmp_path: Path) -> None:
    gpuq, jobs = box
    term = _top(gpuq, tmp_path)
    try:
        term.shows(r"USES\s+UTIL\s+RUNTIME")
        term.keys("c")  # the cursor starts on the first running job: the packed one
        term.shows(rf"cancel job {jobs['packed']} \(packed\)\?  \[y/n\]")
        term.keys("n")
        term.shows("nothing done")
        assert gpuq.job(jobs["packed"])["state"] == "running"
        term.keys("c")
        term.shows(r"\[y/n\]")
        term.keys("y")
        term.shows(f"cancelling job {jobs['packed']}")
        gpuq.wait_state(jobs["packed"], "cancelled")
        term.keys("Tab")  # to the waiting table: the 2-GPU job
        term.keys("h")
        term.shows(rf"hold job {jobs['big']} \(big\)\?")
        term.keys("y")
        wait_for(lambda: gpuq.job(jobs["big"])["held"], 20, "the job to be held")
        term.shows(r"held: ")
        term.keys("l")
        term.shows(rf"log of job {jobs['big']} \(big\)")
        term.keys("q")
        term.shows(r"USES\s+UTIL\s+RUNTIME")
    finally:
        term.close()


def test_top_without_colour_draws_in_greys_and_means_the_same(box: tuple[Gpuq, dict[str, int]], tmp_path: Path) -> None:
    gpuq, _ = box
    term = _top(gpuq, tmp_path, "NO_COLOR=1")
    try:
        term.shows(r"jobs 3\.5G")
        colours = {int(n) for n in re.findall(r"\x1b\[[34]8;5;(\d+)m", term.screen(escapes=True))}
        assert colours and colours <= {16, *range(232, 256)}  # black and the grey ramp: no hue anywhere
        assert not re.search(r"\x1b\[[34]8;2;", term.screen(escapes=True))  # no true colour either
    finally:
        term.close()


def test_top_without_a_terminal_says_what_to_use_instead(gpuq: Gpuq) -> None:
    result = gpuq.run("top", check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "gpuq: gpuq top needs a terminal; `gpuq status` and `gpuq gpus --json` print the same for scripts"
    )


def test_tops_log_view_shows_a_redrawn_progress_line_without_leftovers(gpuq: Gpuq, tmp_path: Path) -> None:
    """A job's progress line redrawn with a carriage return (as tqdm does) showed what the longer drawing
    before it left behind (issue #39)."""
    gpuq.env.update(TERM="xterm-256color", COLUMNS="80", LINES="24")
    draws = r"printf 'epoch 1/9 loss 0.912345678\rep 2/9\nready\n'; sleep 300"
    job = gpuq.submit("--gpus", "1", "--name", "progress", "sh", "-c", draws)
    gpuq.wait_state(job, "running")
    wait_for(lambda: "ready" in gpuq.run("logs", str(job)).stdout, 20, "the job's lines")
    term = _top(gpuq, tmp_path)
    try:
        term.shows(r"USES\s+UTIL\s+RUNTIME")
        term.keys("l")  # the cursor starts on the first running job: the only one
        screen = term.shows(r"(?s)log of job \d+ \(progress\).*ready")
        assert re.search(r"^\s*ep 2/9\s*$", screen, re.M), screen
        assert "0.912345678" not in screen and "loss" not in screen, screen
    finally:
        term.close()
