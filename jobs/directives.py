"""``#GPUQ`` lines at the top of a job's script: submit's options written where the script is, as Slurm's
``#SBATCH`` lines are.

    #!/usr/bin/env python
    # Train the small model.
    #GPUQ --gpus 2 --mem 20G
    #GPUQ --time 2h --name small
    import torch

Read from the script's head only: lines before its first line of code (blank lines and any comment that
starts with ``#``, a shebang included, may come before and among them). Options given on the command line
win: an option the command line gives replaces all of the script's for it (``--env`` and ``--array`` too).
``--cwd``, ``--json``, ``--wait`` and ``--on`` say how to submit, not what the job is, and stay on the command
line. A directive gpuq cannot read is refused naming the script and its line.

Light on purpose, like everything the quick submit path loads: plain file reads; ``shlex`` only for a
script that has directives.
"""

from __future__ import annotations

import os

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.options import SUBMIT

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Sequence

PREFIX = "#GPUQ"
HEAD_BYTES = 64 << 10  # directives come before the code; a script's head is far less
NOT_IN_SCRIPTS = ("--cwd", "--json", "--wait", "--on")
# Programs that run the script named after them (and their options): their script's directives count.
INTERPRETERS = ("python", "python3", "bash", "sh", "zsh")
_KINDS = {option.flag: option.kind for option in SUBMIT if option.flag not in NOT_IN_SCRIPTS}
_CAPTURES = {option.flag: option.capture for option in SUBMIT}  # a kept option's own check (--output's)


def script_of(command: Sequence[str], workdir: str) -> str | None:
    """The script file a command runs, relative to ``workdir`` or absolute: its program where that is a file
    (``train.py``, ``./run.sh``), or the script an interpreter is given (``python -u train.py``); None for a
    program from PATH, ``python -m pkg`` or ``-c CODE``."""
    if not command:
        return None
    program = command[0]
    name = os.path.basename(program)
    if name in INTERPRETERS or name.startswith("python3."):
        rest = [word for word in command[1:] if word[:1] != "-" or word in ("-m", "-c")]
        if not rest or rest[0] in ("-m", "-c"):
            return None
        program = rest[0]
    elif "/" not in program and not program.endswith((".py", ".sh")):
        return None  # a program found on PATH: not a script of the user's to read
    return program if os.path.isfile(os.path.join(workdir, program)) else None


def read(script: str, workdir: str) -> list[tuple[int, str]]:
    """The ``#GPUQ`` lines of the script's head: (line number, what follows ``#GPUQ``)."""
    try:
        with open(os.path.join(workdir, script), "rb") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError:
        return []  # unreadable: the submit's own checks say why, where it matters
    if b"\0" in head or PREFIX.encode() not in head:
        return []  # a binary, or no directive at all: the common case costs one read
    found = []
    for number, raw in enumerate(head.decode(errors="replace").splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line[:1] != "#":
            break  # the first line of code: directives after it are the code's business
        if raw.startswith(PREFIX) and raw[len(PREFIX) : len(PREFIX) + 1] in ("", " ", "\t"):
            found.append((number, raw[len(PREFIX) :].strip()))
    return found


def words(script: str, lines: Sequence[tuple[int, str]], takes_value: dict[str, bool]) -> list[tuple[int, list[str]]]:
    """Each directive line's options as words (``--gpus 2``, ``--mem=20G``), checked: a name submit has that
    a script may give, its value where it takes one, each value of a kind it can be. Raises BadInput naming
    the script and the line."""
    import shlex  # only for a script that has directives

    parsed = []
    for number, text in lines:
        where = f"{script} line {number}: {PREFIX} {text}"
        try:
            items = shlex.split(text, comments=True)
        except ValueError as err:
            raise BadInput(f"{where}: {err}; quote as a shell would") from None
        taken: list[str] = []
        at = 0
        while at < len(items):
            flag, has_value, value = items[at].partition("=")
            at += 1
            kind = _KINDS.get(flag)
            if kind is None or flag not in takes_value:
                why = "stays on the command line" if flag in NOT_IN_SCRIPTS else "is not an option of gpuq submit"
                raise BadInput(f"{where}: {flag} {why} (`gpuq submit --help` lists them)")
            if kind == "flag":
                if has_value:
                    raise BadInput(f"{where}: {flag} takes no value")
                taken.append(flag)
                continue
            if not has_value:
                if at == len(items):
                    raise BadInput(f"{where}: {flag} needs a value")
                value = items[at]
                at += 1
            _check(where, flag, kind, value)
            taken += [flag, value]
        parsed.append((number, taken))
    return parsed


def _check(where: str, flag: str, kind: str, value: str) -> None:
    """A directive's value, held to what the command line's parsers hold it to, saying where it was."""
    from gpuq_scheduler.jobs import arrays, submission
    from gpuq_scheduler.jobs.rules import MODES
    from gpuq_scheduler.jobs.units import parse_duration, parse_size

    try:
        if kind == "int" and not (value.isascii() and value.lstrip("-").isdigit()):
            raise BadInput(f"{value!r} is not a whole number")
        if kind == "mode" and value not in MODES:
            raise BadInput(f"{value!r} is not one of {', '.join(MODES)}")
        if flag in ("--mem", "--ram") and value.strip().lower() != "auto":
            parse_size(value)
        elif flag == "--time":
            parse_duration(value)
        elif flag == "--env":
            submission.env_pairs([value])
        elif flag == "--array":
            arrays.parse_arrays([value])
        elif (capture := _CAPTURES.get(flag)) is not None:
            capture(value)
    except BadInput as err:
        raise BadInput(f"{where}: {flag}: {err}") from None


def merged(own: list[str], command: Sequence[str], takes_value: dict[str, bool]) -> tuple[list[str], list[str]]:
    """gpuq's own words (``own``, as ``launcher.cli.submit.split`` gives them) with the script's directives
    before them, leaving out each option the command line gives; and the words taken from the script, for
    the spec (``gpuq show`` says which came from there). ``own`` unchanged where the script has none."""
    workdir = _given(own, "--cwd", takes_value) or os.getcwd()
    script = script_of(command, workdir)
    lines = read(script, workdir) if script is not None else []
    if script is None or not lines:
        return own, []
    given = {word.partition("=")[0] for word in _flags(own, takes_value)}
    taken: list[str] = []
    for _, line in words(script, lines, takes_value):
        at = 0
        while at < len(line):
            flag = line[at].partition("=")[0]
            step = 2 if takes_value.get(flag) and "=" not in line[at] else 1
            if flag not in given:
                taken += line[at : at + step]
            at += step
    return [*taken, *own], taken


def _flags(own: Sequence[str], takes_value: dict[str, bool]) -> list[str]:
    """The option words of ``own`` (their values left out)."""
    flags, at = [], 0
    while at < len(own):
        word = own[at]
        flags.append(word)
        at += 2 if takes_value.get(word.partition("=")[0]) and "=" not in word else 1
    return flags


def _given(own: Sequence[str], flag: str, takes_value: dict[str, bool]) -> str | None:
    """The last value ``own`` gives ``flag``, or None."""
    found, at = None, 0
    while at < len(own):
        word = own[at]
        name, has_value, value = word.partition("=")
        step = 2 if takes_value.get(name) and not has_value else 1
        if name == flag:
            found = value if has_value else own[at + 1] if at + 1 < len(own) else None
        at += step
    return found
