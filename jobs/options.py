"""The options of ``gpuq submit``, each declared once (``SUBMIT``); everything else reads them from here.

click's ``gpuq submit`` (``launcher.cli.own_jobs``) builds its options and help from this table, the quick
parser (``launcher.cli.submit``) its flags, kinds and defaults, ``api.submit`` the keywords it takes,
``capture_spec`` the options it keeps in the spec as given, and ``JobSpec`` their JSON (``to_json``,
``from_json``, and so the job table). An option the spec keeps as given (``field``) is the whole change:
declare it here with its check (``capture``), and read it with ``spec.value(OPTION)`` (typed), or give
``JobSpec`` a field of the same name to read it as an attribute.

Light on purpose, like everything the quick submit path loads: no dataclasses, typing or enum at run time.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Generic, TypeVar

    T = TypeVar("T")
else:
    T = None

    class Generic:  # ``Option[bool]`` at run time is Option: the parameter is the type checker's alone
        def __class_getitem__(cls, item: object) -> type:
            return cls


KINDS = ("flag", "int", "str", "mode", "dir", "list")
# What a kind's value is kept as in the spec's JSON, where ``stores`` does not say.
_STORES: dict[str, type] = {"flag": bool, "int": int, "str": str, "mode": str, "dir": str, "list": list}


class Option(Generic[T]):
    """One option of ``gpuq submit``.

    ``kind`` is how the command line reads it: "flag" takes no value; "int", "str", "mode" (one of
    ``MODES``) and "dir" (a directory: click.Path(file_okay=False)) take one; "list" takes one each time it
    is given. ``dest`` is its name in Python: click's parameter, the quick parser's key, ``api.submit``'s and
    ``capture_spec``'s keyword. ``spec``: ``capture_spec`` takes it; ``api``: ``api.submit`` does; ``quick``:
    the quick path may queue a submit that gives it (False sends it to click: it needs the job table, Slurm
    or a loop that waits).

    ``field`` names the key of the spec's JSON that keeps its value as given, after ``capture`` (which checks
    and converts a value, raising BadInput with a one-line message; the daemon's intake holds a request's
    stored value to it again, so it must take what it returns); "" for options ``capture_spec`` turns into
    other fields itself (``--mem``, ``--time``...) and those that are not the spec's (``--json``).
    ``stores`` is the type kept there (default: the kind's), which ``JobSpec.from_json`` holds a request to.
    """

    __slots__ = (
        "api",
        "capture",
        "default",
        "dest",
        "field",
        "flag",
        "help",
        "kind",
        "metavar",
        "quick",
        "show_default",
        "spec",
        "stores",
    )

    def __init__(
        self,
        flag: str,
        kind: str,
        default: T,
        help: str | None = None,
        *,
        dest: str = "",
        metavar: str | None = None,
        show_default: bool = False,
        spec: bool = True,
        api: bool | None = None,
        quick: bool = True,
        field: str = "",
        capture: Callable[[Any], Any] | None = None,
        stores: type | None = None,
    ) -> None:
        if kind not in KINDS or not flag.startswith("--"):
            raise ValueError(f"option {flag}: a long flag of a kind in {KINDS}, not {kind!r}")
        self.flag = flag
        self.dest = dest or flag[2:].replace("-", "_")
        self.kind = kind
        self.default = default
        self.help = help
        self.metavar = metavar
        self.show_default = show_default
        self.spec = spec
        self.api = spec if api is None else api
        self.quick = quick
        self.field = field
        self.capture = capture
        self.stores = stores or _STORES[kind]

    def __repr__(self) -> str:
        return f"Option({self.flag!r})"

    def kept(self, value: Any) -> Any:
        """``value`` as the spec keeps it: checked and converted by ``capture``."""
        return value if self.capture is None else self.capture(value)

    @property
    def kept_default(self) -> Any:
        """What the spec keeps when the option is not given."""
        return self.kept(self.default)


def _notify(value: str | None) -> str | None:
    return value or None  # --notify '' is no notification


OUTPUT_CODES = "jAax%"  # --output's %j (job id), %A (array id), %a (index), %x (name), %% (a %)


def _output(value: str | None) -> str | None:
    """--output's pattern as kept: checked (its % codes, no NUL); '' is none. ``jobs.naming.output_path``
    expands it for each job when it starts."""
    if not value:
        return None
    from gpuq_scheduler.jobs.errors import BadInput

    if "\0" in value or len(value) > 4096:
        raise BadInput("--output: give a file name (no NUL, at most 4096 characters)")
    at = value.find("%")
    while at >= 0:
        if value[at + 1 : at + 2] not in tuple(OUTPUT_CODES):
            raise BadInput(
                f"--output {value!r}: %{value[at + 1 : at + 2]} is not one of %j (job id), %A (array id), "
                "%a (array index), %x (job name), %% (a %)"
            )
        at = value.find("%", at + 2)
    return value


def _signal(value: str | None) -> str | None:
    """--preempt-signal's name as kept: USR1 for usr1, SIGUSR1 or USR1 (rules.check_spec holds it to the list)."""
    return value.upper().removeprefix("SIG") if value else None


MOST_GPUS = 1024  # GPU numbers --gpu-ids takes are below this (no machine has more)


def _gpu_ids(value: str | list[int] | None) -> list[int]:
    """--gpu-ids 2,3 as kept: the GPUs' numbers, ascending, each once ([]: any GPUs). The daemon's intake
    gives it the stored list again."""
    if value is None or value == "":
        return []
    words = value if isinstance(value, list) else str(value).split(",")
    found = []
    for word in words:
        text = str(word).strip() if not isinstance(word, bool) else ""
        if not (text.isascii() and text.isdigit() and int(text) < MOST_GPUS):
            from gpuq_scheduler.jobs.errors import BadInput

            shown = value if isinstance(value, str) else ",".join(map(str, value))
            raise BadInput(
                f"--gpu-ids {shown[:60]!r}: GPU numbers separated by commas, like 2,3 (`gpuq gpus` lists them)"
            )
        found.append(int(text))
    return sorted(set(found))


GPU_IDS: Option[Any] = Option(  # kept as list[int]; given as text (None: not given)
    "--gpu-ids",
    "str",
    None,
    "Run on these GPUs (2,3), as `gpuq gpus` numbers them; --gpus is their count.",
    metavar="IDS",
    field="gpu_ids",
    capture=_gpu_ids,
    stores=list,
)

MOST_PIDS = 4_194_304  # the kernel's PID_MAX_LIMIT: no cgroup can hold more tasks


def _pids(value: int | None) -> int | None:
    """--pids as kept: the most tasks (processes and threads) the job may hold at once (pids.max)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 16 <= value <= MOST_PIDS:
        from gpuq_scheduler.jobs.errors import BadInput

        raise BadInput(
            f"--pids {value!r}: give the most processes the job may hold at once, threads included, "
            f"from 16 to {MOST_PIDS}, like 8192"
        )
    return value


PIDS: Option[int | None] = Option(
    "--pids",
    "int",
    None,
    "Most processes (threads too) the job may hold at once; past it fork fails (default: a "
    "shared queue's default_pids). cgroup pids.max.",
    metavar="N",
    field="pids",
    capture=_pids,
)


def _reservation(value: str | None) -> str | None:
    """--reservation's name as kept (None: not given); a name gpuq could not have made is refused."""
    if not value:
        return None
    from gpuq_scheduler.jobs.reservations import check_name

    return check_name(value if isinstance(value, str) else "")


RESERVATION: Option[str | None] = Option(
    "--reservation",
    "str",
    None,
    "Run in this reservation of yours, on its GPUs (`gpuq reserve --list`).",
    metavar="NAME",
    field="reservation",
    capture=_reservation,
)

OUTPUT: Option[str | None] = Option(
    "--output",
    "str",
    None,
    "Also write the job's output to this file (relative to its cwd), as Slurm's -o: %j "
    "job id, %A array id, %a index, %x name. `gpuq logs` shows it too.",
    metavar="PATTERN",
    field="output",
    capture=_output,
)

SUBMIT: tuple[Option[Any], ...] = (
    Option("--gpus", "int", 1, "GPUs the job needs (0: a CPU job).", show_default=True, field="gpus"),
    GPU_IDS,
    Option(
        "--mem",
        "str",
        None,
        "Memory needed on each GPU (20G, 20GiB, 512M), or auto: learned from earlier runs "
        "of the same kind. Without it the job gets whole GPUs.",
    ),
    Option("--cpus", "str", None, "Host CPUs' worth of time the job may use (4, 0.5); cgroup cpu.max.", metavar="N"),
    Option("--ram", "str", None, "Host memory the job may use (32G); past it the kernel ends the job.", metavar="SIZE"),
    PIDS,
    Option(
        "--like",
        "int",
        None,
        "--mem auto, learned from this job's peak memory.",
        metavar="JOB_ID",
        api=False,
        quick=False,
    ),
    Option("--name", "str", "", "A name to show in status (default: the command).", field="name"),
    Option("--priority", "int", 0, "Higher runs first.", show_default=True, field="priority"),
    Option(
        "--time", "str", None, "Time limit (90s, 30m, 2h, 1h30m, 01:30:00); then SIGTERM, SIGKILL.", dest="time_limit"
    ),
    Option("--mode", "mode", "single", show_default=True),
    Option("--env", "list", (), "Set an environment variable for the job.", metavar="K=V"),
    Option("--cwd", "dir", None, "Run in this directory (default: the current one)."),
    Option(
        "--array",
        "list",
        (),
        "Queue members: indices 0-49, 1,3,7, 0-20:5; or values NAME=V1,V2,... for {NAME} "
        "in the command (again for a product); %N runs N at once.",
        dest="array_spec",
        metavar="SPEC",
        spec=False,
    ),
    Option("--after", "str", None, "Start after these jobs or arrays (1,2,...) succeeded.", metavar="IDS", quick=False),
    Option(
        "--after-any",
        "flag",
        False,
        "With --after: start once they ended, however they ended.",
        quick=False,
        field="after_any",
    ),
    Option("--retries", "int", 0, "Run again after a failure, with backoff.", show_default=True, field="retries"),
    Option(
        "--oom-retry",
        "flag",
        False,
        "After CUDA out of memory, retry with twice the memory or a whole GPU.",
        field="oom_retry",
    ),
    Option(
        "--preemptible",
        "flag",
        False,
        "A more urgent job may suspend this one to take its GPUs; it resumes after (docs/suspend.md).",
        field="preemptible",
    ),
    Option(
        "--preempt-signal",
        "str",
        None,
        "Where it cannot be suspended: the signal sent before it is requeued (default USR1).",
        metavar="SIG",
        field="preempt_signal",
        capture=_signal,
    ),
    RESERVATION,
    Option(
        "--notify",
        "str",
        None,
        "Shell command run when the job (or the whole array) ends.",
        metavar="CMD",
        field="notify",
        capture=_notify,
    ),
    OUTPUT,
    Option(
        "--wait",
        "flag",
        False,
        "Block until the job ends; exit with its exit code.",
        dest="wait_",
        spec=False,
        quick=False,
    ),
    Option("--json", "flag", False, 'Print {"id": N} (and "jobs" for an array).', dest="as_json", spec=False),
    Option(
        "--on",
        "str",
        None,
        "Send it to this cluster of your config (Slurm) instead.",
        metavar="CLUSTER",
        spec=False,
        api=True,
        quick=False,
    ),
)
"""Every option of ``gpuq submit``, in the order its help lists them."""


def kept_options() -> tuple[Option[Any], ...]:
    """The options the spec keeps as given (their ``field``), in the order its JSON lists them."""
    return tuple(option for option in SUBMIT if option.field)


def check_keywords(function: str, given: dict[str, Any], also: tuple[str, ...] = ()) -> None:
    """Refuse a keyword ``function`` does not take, as Python does: the API's keywords are the declared
    options its ``api`` marks (plus ``also``)."""
    known = {option.dest for option in SUBMIT if option.api}
    for key in given:
        if key not in known and key not in also:
            raise TypeError(f"{function}() got an unexpected keyword argument {key!r}")
