"""What ``gpuq doctor`` finds: a problem of a state directory, said in one line with what to do about it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Severity = Literal["error", "warning"]
ERROR: Severity = "error"
WARNING: Severity = "warning"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the state directory: ``message`` says what, and what to do about it."""

    severity: Severity
    message: str

    def to_json(self) -> dict[str, str]:
        return {"severity": self.severity, "message": self.message}


def quote(path: Path | str) -> str:
    """A path as a shell command the message suggests takes it."""
    return shlex.quote(str(path))
