"""ruff and mypy are part of the test suite, so a red lint is a red build."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.conftest import ROOT


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(ROOT / ".venv" / "bin")) or shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[dev]'"
    return found


def test_ruff_is_clean() -> None:
    result = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
