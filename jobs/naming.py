"""What a job is called when no --name says: its program, or the script a Python interpreter runs.

Light (no imports): the job model and the listings use it, and so may the quick submit path.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] or path


_PYTHON_VALUE_OPTIONS = ("-W", "-X", "--check-hash-based-pycs")  # options of python's that take the next word


def program_name(command: Sequence[str]) -> str:
    """What a job without a --name is called: its program's base name, or for ``python [OPTIONS] train.py``
    the script's (``train.py``) and for ``python -m pkg.mod`` the module: every Python job named "python"
    told a newcomer nothing."""
    program = _basename(command[0])
    if not ((program.startswith("python") and program[6:].replace(".", "").isdigit()) or program == "python"):
        return program
    words = iter(command[1:])
    for word in words:
        if word in ("-m", "-c") or word in _PYTHON_VALUE_OPTIONS:
            following = next(words, "")
            if word == "-m":
                return following or program
            if word == "-c":
                return program
        elif word == "-" or not word.startswith("-"):
            return _basename(word) if word != "-" else program
    return program


def output_path(pattern: str, cwd: str, job_id: int, array_id: int | None, index: int | None, name: str) -> str:
    """Where a job's ``--output PATTERN`` goes: its % codes filled as Slurm's -o fills them (%j the job's id,
    %A its array's id, or its own outside an array, %a its index, empty outside an array, %x its name with
    "/" as "_", %% a %), relative to the job's cwd. The pattern was checked at submit (``options._output``)."""
    codes = {
        "j": str(job_id),
        "A": str(job_id if array_id is None else array_id),
        "a": "" if index is None else str(index),
        "x": name.replace("/", "_"),
        "%": "%",
    }
    parts, at = [], 0
    while True:
        found = pattern.find("%", at)
        if found < 0 or found + 1 >= len(pattern):
            parts.append(pattern[at:])
            break
        parts += [pattern[at:found], codes.get(pattern[found + 1], "%" + pattern[found + 1])]
        at = found + 2
    filled = "".join(parts)
    return filled if filled.startswith("/") else cwd.rstrip("/") + "/" + filled
