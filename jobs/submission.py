"""Turning what a user typed into a job spec: parse, resolve, check, capture. Refuses before anything is written.

Light on purpose (no dataclasses, enum or typing at run time): the quick ``gpuq submit`` path
(``launcher.cli.submit``) captures a spec here as the plain dict ``JobSpec.to_json()`` produces and writes
it as it is; the Python API and the click command turn the same dict into a JobSpec with
``JobSpec.from_json``. One capture, one set of checks, whichever way a job comes in.
"""

from __future__ import annotations

import os

from gpuq_scheduler.jobs import jsontext, options
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.rules import (
    MODES,
    check_bounds,
    check_placeholders,
    check_spec,
    check_sweep,
    check_texts,
)
from gpuq_scheduler.jobs.units import format_size, parse_duration, parse_size

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path
    from typing import Any

    from gpuq_scheduler.jobs.model import JobSpec

_TOTALS = b'{"totals": ['


def inventory_json(gpus: Sequence[Mapping[str, Any]], host: Mapping[str, Any] | None = None) -> bytes:
    """``gpus.json``'s text: each GPU's total memory first, as ``Inventory.read`` reads it without json, then
    the GPUs in full (index, uuid, name, total, lost, fence) for everyone else, then what ``host`` says of
    the machine (its ``containment``: ``host_limits`` reads it)."""
    return jsontext.encode({"totals": [int(gpu["total"]) for gpu in gpus], "gpus": list(gpus), **(host or {})})


class Inventory:
    """What the submitter can check a request against: the total memory of each GPU, by index."""

    __slots__ = ("totals",)

    def __init__(self, totals: tuple[int, ...]) -> None:
        self.totals = totals

    def __repr__(self) -> str:
        return f"Inventory(totals={self.totals!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Inventory) and other.totals == self.totals

    def __hash__(self) -> int:
        return hash(self.totals)

    @classmethod
    def read(cls, path: str | Path) -> Inventory | None:
        """The GPUs the daemon last saw (``gpus.json``, ``StateDir.inventory``), or None if it never ran here."""
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
            # The daemon writes the totals first, as a list of plain integers (``inventory_json``): read so,
            # they cost no json (and re) import on the quick submit path. Any other file is parsed in full.
            if raw.startswith(_TOTALS):
                listed = raw[len(_TOTALS) : raw.index(b"]")].split(b",")
                if all(item.strip().isdigit() for item in listed):
                    return cls(tuple(int(item) for item in listed))
            import json

            data = json.loads(raw)
            return cls(tuple(int(gpu["total"]) for gpu in data["gpus"]))
        except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError):
            return None  # damaged: the daemon rewrites it at its next look at the GPUs

    def check(self, spec: JobSpec) -> None:
        self.check_request(spec.gpus, spec.mem_per_gpu)
        self.check_pinned(spec.value(options.GPU_IDS))

    def check_pinned(self, gpu_ids: Sequence[int]) -> None:
        """Refuse --gpu-ids that name a GPU this machine does not have."""
        count = len(self.totals)
        missing = [i for i in gpu_ids if i >= count]
        if missing:
            raise BadInput(
                f"--gpu-ids {','.join(map(str, gpu_ids))}: no GPU {missing[0]} here; GPUs are numbered 0 to "
                f"{count - 1} (`gpuq gpus` lists them)"
            )

    def check_request(self, gpus: int, mem_per_gpu: int | None) -> None:
        """Refuse a request no GPU here could ever hold (it would wait forever)."""
        count = len(self.totals)
        if gpus > count:
            raise BadInput(
                f"--gpus {gpus} asks for more GPUs than this machine has ({count}); "
                f"ask for at most {count}, or --gpus 0 for a CPU job"
            )
        if mem_per_gpu is not None and gpus:
            fitting = sum(1 for total in self.totals if total >= mem_per_gpu)
            if fitting < gpus:
                largest = format_size(max(self.totals))
                if not fitting:
                    raise BadInput(
                        f"--mem {format_size(mem_per_gpu)} per GPU: no GPU here has that much (the largest has "
                        f"{largest}); ask for at most {largest}"
                    )
                raise BadInput(
                    f"--mem {format_size(mem_per_gpu)} on each of {gpus} GPUs: only {fitting} here have that much "
                    f"(the largest has {largest}); ask for less memory or at most {fitting} GPUs"
                )


def capture_spec(
    command: Sequence[str],
    *,
    environ: Mapping[str, str],
    python: str | None = None,
    sweep: Sequence[tuple[str, Sequence[str]]] = (),
    array: bool = False,
    from_script: Sequence[str] = (),
    **given: Any,
) -> dict[str, Any]:
    """Capture a submission as ``JobSpec.to_json()`` would write it: the caller's cwd and environment
    (plus ``env`` overrides), the interpreter for a ``*.py`` command (``python``, else the one the
    environment points at), and parsed limits. ``given`` are submit's options (``jobs.options``) by their
    ``dest``, of the kinds the CLI or the API gives (``mem``: a size, "auto" or bytes; ``time_limit``: a
    duration or seconds; ``env``: K=V words or a mapping; ``after``: ids); the rest have their defaults.
    ``array``: it is an array's (``sweep`` is a named one's), whose placeholders are checked;
    ``from_script``: the option words its script's ``#GPUQ`` lines gave (``jobs.directives``). Raises
    BadInput with a one-line message on anything wrong."""
    values = {option.dest: option.default for option in options.SUBMIT if option.spec}
    for key in given:
        if key not in values:
            raise TypeError(f"capture_spec() got an unexpected keyword argument {key!r}")
    values.update(given)
    cwd, gpus, mem, like, mode = values["cwd"], values["gpus"], values["mem"], values["like"], values["mode"]
    after = values["after"] or ()
    workdir = os.path.abspath(cwd if cwd is not None else os.getcwd())
    if not os.path.isdir(workdir):
        raise BadInput(f"--cwd {workdir}: no such directory")
    captured = dict(environ)
    captured.update(env_pairs(values["env"]))
    mode_name = next((known for known in MODES if known == mode), None)  # a jobs.model.Mode equals its value
    if mode_name is None:
        raise BadInput(f"--mode {mode!r}: choose single, dataparallel or torchrun")
    if not command or not command[0]:
        raise BadInput("no command given: `gpuq submit [OPTIONS] COMMAND [ARGS]...`")
    program = command[0]
    _refuse_a_quoted_command(command, workdir, captured.get("PATH", os.defpath))
    interpreter = None
    if program.endswith(".py"):
        if "{" not in program:  # a per-member script ({index}, {name}) is checked when that member starts
            _require_file(program, workdir)
        interpreter = python or find_python(captured)
    elif mode_name == "torchrun":
        raise BadInput(f"--mode torchrun runs a Python script (*.py), not {program!r}")
    else:
        _require_program(program, workdir, captured.get("PATH", os.defpath))
    mem_auto = like is not None or (isinstance(mem, str) and mem.strip().lower() == "auto")
    mem_per_gpu = None if mem_auto else parse_size(mem) if isinstance(mem, str) else mem
    if like is not None and not 0 < like < 1 << 63:
        raise BadInput(f"--like takes a job id, which is a positive number, not {like}")
    time_limit = values["time_limit"]
    seconds = parse_duration(time_limit) if isinstance(time_limit, str) else time_limit
    seconds = None if seconds is None else float(seconds)  # as JobSpec.from_json reads it back
    cpu_share = _cpus(values["cpus"])
    try:
        ram = values["ram"]
        ram_bytes = parse_size(ram) if isinstance(ram, str) else ram
    except BadInput as err:
        raise BadInput(f"--ram: {err}") from None
    kept = {option.field: option.kept(values[option.dest]) for option in options.kept_options()}
    pinned = kept[options.GPU_IDS.field]
    if pinned:  # --gpu-ids names the GPUs, so also how many; a --gpus that says otherwise is a mistake
        if gpus not in (1, len(pinned)):
            listed = ",".join(map(str, pinned))
            raise BadInput(
                f"--gpus {gpus} --gpu-ids {listed}: the job runs on the {len(pinned)} GPU(s) listed; leave --gpus out"
            )
        gpus = kept["gpus"] = len(pinned)
    output = kept["output"]
    if output and os.path.isdir(os.path.join(workdir, output)):  # most likely the job's own --output DIR
        raise BadInput(
            f"--output {output}: is a directory; name a file (out/%j.log), or if --output is "
            f"{program}'s own, give it after --"
        )
    retries, priority = values["retries"], values["priority"]
    check_spec(
        command=command,
        gpus=gpus,
        mem_per_gpu=mem_per_gpu,
        mode=mode_name,
        retries=retries,
        priority=priority,
        time_limit=seconds,
        after=after,
        mem_auto=mem_auto,
        sweep=sweep,
        cpus=cpu_share,
        ram=ram_bytes,
        preempt_signal=kept["preempt_signal"],
    )
    if array or sweep:  # no {word} reaches a member as text, and each {name} is where its value goes
        check_placeholders(command, values["name"], [name for name, _ in sweep])
    if sweep:
        check_sweep(sweep, command)
    check_bounds(gpus=gpus, retries=retries, time_limit=seconds, after=after)
    check_texts(
        command=command, cwd=workdir, env=captured, name=values["name"], notify=values["notify"], python=interpreter
    )
    return {  # the keys and their order of JobSpec.to_json(): the daemon reads this as a request's spec
        "command": list(command),
        "cwd": workdir,
        "env": captured,
        "mem_per_gpu": mem_per_gpu,
        "time_limit": seconds,
        "mode": mode_name,
        "python": interpreter,
        "after": list(after),
        "mem_auto": mem_auto,
        "like": like,
        "kind": kind_of(command, workdir),
        "mem_from": "",
        "client": None,
        "sweep": [[name, list(choices)] for name, choices in sweep],
        "values": [],
        "cpus": cpu_share,
        "ram": ram_bytes,
        "from_script": list(from_script),
        **kept,  # the options kept as given, in their declared order
    }


def _cpus(value: float | str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise BadInput(f"--cpus {value!r}: give a number of CPUs, like 4 or 0.5") from None


# Each host limit's flag, its controller, and its key in a spec's JSON.
HOST_LIMITS = (("--cpus", "cpu", "cpus"), ("--ram", "memory", "ram"), ("--pids", "pids", "pids"))


def host_limits(inventory: str | Path) -> tuple[tuple[str, ...], str] | None:
    """The host limits this queue's jobs can have (of "cpu", "memory", "pids") and, for the others, why not, as the
    daemon recorded them in ``gpus.json`` (``launcher.supervisor.containment``); None if no daemon has yet."""
    import json  # only for a submit with --cpus, --ram or --pids

    try:
        with open(inventory, "rb") as handle:
            found = json.loads(handle.read())["containment"]
        have = tuple(str(name) for name in found["controllers"])
        return have, str(found.get("limits_why") or found.get("text") or "")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_host_limits(spec: Mapping[str, Any], inventory: str | Path) -> None:
    """Refuse --cpus, --ram or --pids where this queue's daemon cannot enforce it (nothing is queued then)."""
    asked = [(flag, controller) for flag, controller, key in HOST_LIMITS if spec.get(key) is not None]
    if not asked:
        return
    recorded = host_limits(inventory)
    if recorded is None:
        raise BadInput(
            f"{asked[0][0]}: no gpuq daemon has run here yet to say whether it can be enforced; "
            "`gpuq daemon start`, then submit again"
        )
    have, why = recorded
    for flag, controller in asked:
        if controller not in have:
            raise BadInput(
                f"{flag} cannot be enforced here: the {controller} controller is not delegated to gpuq ({why}); "
                "submit without it, or see docs/containment.md"
            )


def kind_of(command: Sequence[str], cwd: str) -> str:
    """What ``--mem auto`` files a job's peak under: the command as typed and where it runs. An array's
    members share it ({index} is still in the command here), and so does tomorrow's run of the same script."""
    # Two 32-bit checksums, not hashlib: importing hashlib (OpenSSL) cost 2 ms of a 24 ms `gpuq submit`,
    # and a key that tells a user's few scripts apart needs no cryptography.
    import zlib

    data = "\0".join([cwd, *command]).encode()
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def find_python(environ: Mapping[str, str]) -> str:
    """The interpreter the submitter would get by typing ``python``: the active venv's, conda's, or PATH's.

    Not ``sys.executable``: gpuq may be installed with pipx, apart from the packages the script needs.
    """
    for prefix in (environ.get("VIRTUAL_ENV"), environ.get("CONDA_PREFIX")):
        if prefix:
            candidate = os.path.join(prefix, "bin", "python")
            if os.access(candidate, os.X_OK):
                return candidate
    path = environ.get("PATH", os.defpath)
    found = _which("python3", path) or _which("python", path)
    if found is None:
        raise BadInput("no python found on PATH to run the script: activate an environment or give its full path")
    return found


def _which(program: str, path: str) -> str | None:
    """``shutil.which`` for a name without a slash: importing shutil (and the bz2 and lzma it loads) cost
    2 ms of every `gpuq submit`."""
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or os.curdir, program)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def env_pairs(env: Mapping[str, str] | Sequence[str]) -> dict[str, str]:
    if hasattr(env, "keys"):  # a mapping, as dict() tells one (collections.abc costs ~1 ms to import)
        return dict(env)
    pairs = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput(f"--env {item!r}: write it as KEY=VALUE")
        pairs[key] = value
    return pairs


def _refuse_a_quoted_command(command: Sequence[str], workdir: str, path: str) -> None:
    """``gpuq submit "python train.py --lr 1"``: a whole command in one quoted word names no program. Said
    so, with the command unquoted, where its first word is a program or script (a file whose name holds a
    space is run as it is)."""
    program = command[0]
    words = program.split()
    if len(words) < 2 or os.path.exists(os.path.join(workdir, program)):
        return
    first = words[0]
    if os.path.isfile(os.path.join(workdir, first)) or ("/" not in first and _which(first, path) is not None):
        unquoted = " ".join([*words, *command[1:]])
        raise BadInput(
            f"no program named {program!r}: the whole command is one quoted word; unquote it: "
            f"{unquoted} (a shell line runs as bash -c '...')"
        )


def _require_file(script: str, workdir: str) -> None:
    path = os.path.join(workdir, script)
    if not os.path.isfile(path):
        raise BadInput(f"no such script: {script} (looked in {workdir}); check the path")


def _require_program(program: str, workdir: str, path: str) -> None:
    if "/" in program:
        full = os.path.join(workdir, program)
        if not (os.path.isfile(full) and os.access(full, os.X_OK)):
            raise BadInput(f"{program} is not an executable file (looked in {workdir}); check the path or chmod +x it")
    elif _which(program, path) is None:
        raise BadInput(f"command not found: {program}; check the name or give its full path")


def parse_ids(text: str, option: str = "--after") -> tuple[int, ...]:
    """``12,13`` -> (12, 13): job or array ids for --after (or status's -j)."""
    try:
        if not text.isascii():
            raise ValueError(text)  # int() reads Unicode's digits too
        ids = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise BadInput(f"{option} {text!r}: give job ids separated by commas, like 12,13") from None
    if not ids or any(i <= 0 for i in ids):
        raise BadInput(f"{option} {text!r}: give job ids separated by commas, like 12,13")
    return ids
