"""The rules every job spec follows, checked on plain values.

``JobSpec`` (``jobs.model``) checks them when one is built; the quick ``gpuq submit`` path
(``launcher.cli.submit``) checks them on the spec it writes as a plain dict, without loading the model
(dataclasses, enum) at all. One function, so the two cannot disagree on what is allowed or on the words.
"""

from __future__ import annotations

from gpuq_scheduler.jobs.errors import BadInput

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

MAX_SWEEP_NAMES = 8  # names in one sweep (--array lr=... --array seed=...)
MAX_PRIORITY = 1_000_000  # priorities are compared, not counted: a bound keeps them inside the table's integers
MAX_GPUS = 1024  # more than any one machine holds; an int beyond it is a typo or an attack, not a request
MAX_RETRIES = 100  # each retry waits a backoff: more than this is a job that should be fixed, not rerun
MAX_TIME = 366 * 86400.0  # a year: a longer limit overflows the supervisor's timers and means "none" anyway
MAX_ARRAY = 10_000  # members of one array (indices or the product of named values): one transaction, and far
# below SQLite's limit on variables; one bound for every check
MAX_INDEX = (1 << 31) - 1  # an array index, as GPUQ_ARRAY_INDEX and Slurm's task ids hold one
MAX_AFTER = 1000  # ids one job may wait on
MAX_CPUS = 100_000  # --cpus: a bound before it becomes cpu.max's quota
MODES = ("single", "dataparallel", "torchrun")  # the values of jobs.model.Mode, in its order
_INFINITY = float("inf")  # not math.inf: loading math is ~0.2 ms of every quick `gpuq submit`


# What --preempt-signal may name (without SIG): signals a job can catch to save its work before it is requeued.
PREEMPT_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "ALRM", "URG", "WINCH")


def check_spec(
    *,
    command: Sequence[str],
    gpus: int,
    mem_per_gpu: int | None,
    mode: str,
    retries: int,
    priority: int,
    time_limit: float | None,
    after: Sequence[int],
    mem_auto: bool = False,
    sweep: Sequence[tuple[str, Sequence[str]]] = (),
    cpus: float | None = None,
    ram: int | None = None,
    preempt_signal: str | None = None,
) -> None:
    """Raise BadInput with a one-line message for the first rule these values break."""
    if preempt_signal is not None and preempt_signal not in PREEMPT_SIGNALS:
        raise BadInput(f"--preempt-signal {preempt_signal!r}: name one a job can catch: {', '.join(PREEMPT_SIGNALS)}")
    if sweep:
        check_sweep(sweep)
    if not command:
        raise BadInput("no command given: `gpuq submit [OPTIONS] COMMAND [ARGS]...`")
    if gpus < 0:
        raise BadInput(f"--gpus must be 0 or more, not {gpus}")
    if gpus == 0 and mem_per_gpu is not None:
        raise BadInput("--mem is memory per GPU; a --gpus 0 (CPU) job cannot ask for it")
    if gpus == 0 and mem_auto:
        raise BadInput("--mem auto learns memory per GPU; a --gpus 0 (CPU) job has none to learn")
    if mode == "torchrun" and gpus == 0:
        raise BadInput("--mode torchrun starts one process per GPU: give it --gpus 1 or more")
    if retries < 0:
        raise BadInput(f"--retries must be 0 or more, not {retries}")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise BadInput(f"--priority {priority}: give a number from -{MAX_PRIORITY} to {MAX_PRIORITY}")
    if mem_per_gpu is not None and not 0 < mem_per_gpu < 1 << 60:
        raise BadInput(f"--mem must be more than nothing and less than an exabyte, not {mem_per_gpu} bytes")
    if time_limit is not None and not 0 < time_limit < _INFINITY:  # NaN fails both
        raise BadInput(f"--time must be a positive, finite duration, not {time_limit}")
    if cpus is not None and not 0.01 <= cpus <= MAX_CPUS:  # NaN fails both
        raise BadInput(f"--cpus must be from 0.01 to {MAX_CPUS} (CPUs' worth of time), not {cpus}")
    if ram is not None and not 1 << 20 <= ram < 1 << 60:
        raise BadInput(f"--ram must be at least 1M and less than an exabyte, not {ram} bytes")
    if any(not 0 < dep < 1 << 63 for dep in after):
        raise BadInput("--after takes job ids, which are positive numbers")


def check_bounds(*, gpus: int, retries: int, time_limit: float | None, after: Sequence[int]) -> None:
    """The upper bounds of a new submit (the client's and the daemon's intake; not of rows already queued,
    which an older gpuq may have let past them and which must still be read)."""
    if gpus > MAX_GPUS:
        raise BadInput(f"--gpus {gpus}: give a number from 0 to {MAX_GPUS}")
    if retries > MAX_RETRIES:
        raise BadInput(f"--retries {retries}: give a number from 0 to {MAX_RETRIES} (each retry waits longer)")
    if time_limit is not None and time_limit > MAX_TIME:
        raise BadInput(f"--time {time_limit:g}s is more than a year; give at most {MAX_TIME / 3600:.0f}h, or no --time")
    if len(after) > MAX_AFTER:
        raise BadInput(f"--after names {len(after)} jobs; a job may wait on at most {MAX_AFTER}")


def check_sweep(sweep: Sequence[tuple[str, Sequence[str]]], command: Sequence[str] | None = None) -> None:
    """A sweep over named values (``--array lr=1e-4,1e-3 --array seed=1,2``): each name a word of letters,
    digits and ``_``, its values distinct and not empty, and the product within ``MAX_ARRAY``. Given the
    command as typed (at submit), each name must appear in it as ``{name}``."""
    if len(sweep) > MAX_SWEEP_NAMES:
        raise BadInput(f"--array: at most {MAX_SWEEP_NAMES} names in one sweep, not {len(sweep)}")
    size, seen = 1, set()
    for name, values in sweep:
        if not (name.replace("_", "a").isalnum() and name.isascii() and not name[0].isdigit()) or name == "index":
            raise BadInput(f"--array {name}=...: a name is letters, digits and _ (not index), like lr or seed")
        if name in seen:
            raise BadInput(f"--array {name}=...: {name} is given twice; list all its values once: {name}=a,b,c")
        seen.add(name)
        if not values or any(not value or "\0" in value for value in values):  # NUL: no argv can hold it
            raise BadInput(f"--array {name}=...: give its values separated by commas, like {name}=1e-4,3e-4")
        if len(set(values)) < len(values):
            raise BadInput(f"--array {name}=...: a value is given twice; each member runs one combination once")
        if command is not None and not any("{" + name + "}" in word for word in command):
            raise BadInput(f"--array {name}=...: write {{{name}}} in the command where each member's value goes")
        size *= len(values)
        if size > MAX_ARRAY:
            raise BadInput(f"--array: the sweep has more than {MAX_ARRAY} combinations; at most {MAX_ARRAY}")


def placeholders(text: str) -> list[str]:
    """The ``{name}`` words in ``text`` that an array would fill: a name of letters, digits and _ in braces,
    not after ``$`` (``${HOME}`` is the shell's). Read by hand: ``re`` costs the quick submit 4 ms."""
    found: list[str] = []
    at = text.find("{")
    while at >= 0:
        end = text.find("}", at)
        if end < 0:
            break
        name = text[at + 1 : end]
        if "{" in name:  # {{index}: look again from the inner brace
            at = text.find("{", at + 1)
            continue
        if name and name.replace("_", "a").isalnum() and name.isascii() and not (at and text[at - 1] == "$"):
            found.append(name)
        at = text.find("{", end)
    return found


def check_placeholders(command: Sequence[str], name: str, names: Sequence[str]) -> None:
    """An array's command and name may hold only the placeholders it fills: ``{index}`` and its sweep's
    ``names``. Any other (``{idx}``, ``{Index}``, ``{LR}``) would reach the job as text: refused, naming the
    known ones, with a hint where only the case differs."""
    known = ("index", *names)
    for where, word in (*(("the command", word) for word in command), ("--name", name)):
        for found in placeholders(word):
            if found in known:
                continue
            listed = ", ".join("{" + k + "}" for k in known)
            near = next((k for k in known if k.lower() == found.lower()), None)
            hint = (
                f"did you mean {{{near}}}? (names are case-sensitive)"
                if near
                else f"it fills {listed} (a shell variable is written ${{{found}}})"
            )
            raise BadInput(f"--array: {{{found}}} in {where} is no placeholder of this array; {hint}")


def check_array(indices: Sequence[int], throttle: int | None) -> None:
    """An array's shape: how many members, how many at once, which indices."""
    size = len(indices)
    if not 0 < size <= MAX_ARRAY:
        raise BadInput(f"--array: {size} members; an array holds 1 to {MAX_ARRAY} (split it, or ask the admin)")
    if throttle is not None and not 0 < throttle <= MAX_ARRAY:
        raise BadInput(f"--array: %N is how many members run at once, a number from 1 to {MAX_ARRAY}")
    if not 0 <= min(indices) <= max(indices) <= MAX_INDEX:
        raise BadInput(f"--array: indices go from 0 to {MAX_INDEX}")


def check_update(priority: int | None, time_limit: float | None) -> None:
    """`gpuq update`'s new values, by the rules a submit's follow."""
    if priority is not None and not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise BadInput(f"--priority {priority}: give a number from -{MAX_PRIORITY} to {MAX_PRIORITY}")
    if time_limit is not None and not 0 < time_limit <= MAX_TIME:  # NaN fails too
        raise BadInput(f"--time {time_limit:g}s: give a positive duration of at most {MAX_TIME / 3600:.0f}h")


def check_text(what: str, value: str) -> None:
    """A string a job carries (an argument, a name, an environment value): no NUL, valid UTF-8. The value
    is never echoed: it may hold a secret or a terminal's escape sequence."""
    if "\0" in value:
        raise BadInput(f"{what} holds a NUL byte, which no command line or environment can carry; remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(
            f"{what} holds bytes that are not UTF-8 text; gpuq keeps text as UTF-8: fix or remove them"
        ) from None


def check_texts(
    *, command: Sequence[str], cwd: str, env: Mapping[str, str], name: str, notify: str | None, python: str | None
) -> None:
    """Every string of a spec, by :func:`check_text`, naming the first one that fails as the user gave it. An
    ASCII string without NUL passes without a call or its name being made: a submit's environment is most of
    it, and the daemon checks every submit before an idle start."""
    for at, word in enumerate(command):
        if "\0" in word or not word.isascii():
            check_text("the command" if at == 0 else f"argument {at} of the command", word)
    check_text("--cwd", cwd)
    for key, value in env.items():
        if not key or "=" in key:
            raise BadInput("an environment variable's name must be non-empty and hold no '='; fix it with --env K=V")
        if "\0" in key or not key.isascii():
            check_text("an environment variable's name", key)
        if "\0" in value or not value.isascii():
            check_text(f"the environment variable {key}", value)
    check_text("--name", name)
    if notify is not None:
        check_text("--notify", notify)
    if python is not None:
        check_text("the Python interpreter's path", python)


def sweep_values(sweep: Sequence[tuple[str, Sequence[str]]], index: int) -> tuple[tuple[str, str], ...]:
    """Member ``index``'s combination of a sweep's values, in itertools.product's order (the last name varies
    fastest)."""
    picked = []
    for name, values in reversed(sweep):
        index, at = divmod(index, len(values))
        picked.append((name, values[at]))
    if index:
        raise BadInput(f"a sweep of {sweep_size(sweep)} combinations has no member {index}")
    return tuple(reversed(picked))


def sweep_size(sweep: Sequence[tuple[str, Sequence[str]]]) -> int:
    size = 1
    for _, values in sweep:
        size *= len(values)
    return size
