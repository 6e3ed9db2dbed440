"""ruff, mypy and the import contract are part of the test suite, so a red lint is a red build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.installed import installed_tree, source_path


def _tool(name: str) -> str:
    """The tool installed beside the interpreter running the tests (any venv, not only .venv), else on PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed beside {sys.executable} nor on PATH: pip install -e '.[dev]'"
    return found


def test_ruff_is_clean() -> None:
    result = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    """Issue 41: 643 `# fmt: skip` markers stood in for a formatter nobody ran; now the formatter's output is the
    house layout, so a diff is about what changed, not how it was wrapped (ruff is pinned: its style moves
    between releases)."""
    result = subprocess.run([_tool("ruff"), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    tree = installed_tree()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "-p",
            "gpuq_scheduler",
        ],
        cwd=tree,
        env={**os.environ, "MYPYPATH": str(tree)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, source_path(result.stdout + result.stderr)


def test_imports_follow_the_contract() -> None:
    """The contracts in pyproject.toml's [tool.importlinter]: jobs never imports launcher, pure policy does
    no I/O, the rooms of launcher are layered, no package has an import cycle among its modules, and the
    quick submit reaches neither the daemon nor click, NVML or psutil. No exception is listed."""
    tree = installed_tree()
    result = subprocess.run(
        [_tool("lint-imports"), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, source_path(result.stdout + result.stderr)


def test_tools_are_found_beside_the_interpreter_in_a_venv_not_named_dot_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The linters were looked for only in ROOT/.venv/bin and on PATH, so the suite failed in a venv of
    another name (CI's, a developer's `venv/`) unless that venv's bin was on PATH."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "ruff"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))

    assert _tool("ruff") == str(bin_dir / "ruff")
