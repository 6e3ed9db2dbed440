"""The quick ``gpuq submit``: a plain submit runs here without click (``launcher.cli.entry`` sends it
here; everything else goes to ``launcher.cli.app``).

``gpuq submit`` runs in loops (a sweep of 50 seeds), so its start-up is what users wait for, and click,
dataclasses, the job model and SQLite together cost several times Python's own start. Here a submit is
parsed over submit's options as ``jobs.options`` declares them (click's are built from the same table),
split from the job's command by the rule click's commands follow too (``split``), then captured, checked
and written by the same light functions the click command uses (``jobs.submission``, ``jobs.store.outbox``),
so both write the same request and refuse bad input in the same words.

Whatever is unusual goes to click, which prints the canonical help or usage error: help, an option it
does not know, a missing or malformed value. So do the submits that need heavy modules anyway: ``--on``
(Slurm), ``--wait``, ``--after`` (the job table), a shared queue (its config's per-user caps; its daemon
gives the id, which that path waits for), and a
state directory whose daemon has not recorded the GPUs yet (click's path looks at them through NVML).
"""

from __future__ import annotations

import os
import sys
import time

from gpuq_scheduler.jobs import directives
from gpuq_scheduler.jobs.errors import GpuqError
from gpuq_scheduler.jobs.options import SUBMIT
from gpuq_scheduler.jobs.rules import MODES

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

# Submit's options as jobs.options declares them (click's command is built from the same table):
# flag -> (dest, kind, default).
OPTIONS: dict[str, tuple[str, str, object]] = {opt.flag: (opt.dest, opt.kind, opt.default) for opt in SUBMIT}
# Given at all, these send a submit to click: they need the job table, Slurm, or a loop that waits.
FOR_CLICK = tuple(option.flag for option in SUBMIT if not option.quick)


FROM_SCRIPT = "from_script"  # parse()'s key for the words the script's #GPUQ lines gave (no option's dest)

# Whether each of submit's options takes a value: what ``split`` needs to tell gpuq's words from the job's.
TAKES_VALUE = {flag: kind != "flag" for flag, (_, kind, _) in OPTIONS.items()}


def split(args: Sequence[str], takes_value: Mapping[str, bool]) -> tuple[list[str], list[str]]:
    """``gpuq submit/run ARGS`` split into gpuq's own options (with their values, in order) and the job's
    command. The rule, for the quick parser and click's commands alike: an option of gpuq's (``takes_value``
    names them) is gpuq's wherever it stands before ``--``, after the command too; everything after the first
    ``--`` is the job's, and that ``--`` is dropped. Any other word from the command on is the job's: its
    script, its arguments, options gpuq does not know. An unknown option before the command stays with
    gpuq's (a misspelt option of gpuq's: click says which). An option of gpuq's that lacks its value is left
    last and the command dropped, so that click says the value is missing."""
    own: list[str] = []
    command: list[str] = []
    at, count = 0, len(args)
    while at < count:
        arg = args[at]
        at += 1
        if arg == "--":
            command += args[at:]
            break
        value = takes_value.get(arg.partition("=")[0]) if arg[:1] == "-" else None
        if value is None:
            if command and arg[:2] == "--":
                _refuse_a_stray(arg, command[0], takes_value)
            (command if command or arg[:1] != "-" or arg == "-" else own).append(arg)
            continue
        own.append(arg)
        if value and "=" not in arg:
            if at == count:
                return own, []  # --gpus with nothing after it
            own.append(args[at])  # whatever it looks like, as click takes it: --name --json names the job "--json"
            at += 1
    return own, command


def _refuse_a_stray(arg: str, program: str, takes_value: Mapping[str, bool]) -> None:
    """An option after the command, before ``--``, that is the start of exactly one of gpuq's (``--prio``
    for ``--priority``), or one letter short of one (``--gpu`` for ``--gpus``), is a typo that would go to the
    job unseen: refused, saying how to give it to the job on purpose. Only a start of a name: a job's ``--model`` is not
    ``--mode``'s typo."""
    flag = arg.partition("=")[0]
    if len(flag) < 3:  # "--" alone is the separator, handled before this
        return
    near = [known for known in takes_value if known[:2] == "--" and known != "--help" and known.startswith(flag)]
    if len(near) > 1:  # --gpu starts --gpus and --gpu-ids: one letter short of a name is still a typo of it
        near = [known for known in near if len(known) == len(flag) + 1]
    if len(near) == 1:
        from gpuq_scheduler.jobs.errors import BadInput

        raise BadInput(
            f"{flag} is no option of gpuq's: did you mean {near[0]}? If {flag} is {program}'s own, give it after "
            f"--, as in `{program} -- {arg} ...`"
        )


def parse(args: Sequence[str]) -> tuple[dict[str, Any], list[str]] | None:
    """``gpuq submit ARGS`` read as click's submit reads them: (options by dest, command), or None for
    anything left to click. Which words are gpuq's and which the job's is ``split``'s rule."""
    try:
        own, command = split(args, TAKES_VALUE)
    except GpuqError:
        return None  # a typo of one of gpuq's options after the command: click's split says which
    if not command:
        return None  # no command (click's "Missing argument"), or an option without its value
    own, from_script = directives.merged(own, command, TAKES_VALUE)  # the script's #GPUQ lines, then ours
    values: dict[str, Any] = {dest: default for dest, _, default in OPTIONS.values()}
    values[FROM_SCRIPT] = from_script
    at = 0
    while at < len(own):
        flag, has_value, value = own[at].partition("=")
        at += 1
        known = OPTIONS.get(flag)
        if known is None:
            return None  # -h, --help, a misspelt or unknown option: click says which
        dest, kind, _ = known
        if kind == "flag":
            if has_value:
                return None  # --json=yes: click says a flag takes no value
            values[dest] = True
            continue
        if not has_value:
            value = own[at]  # split() gave every option that takes a value its value
            at += 1
        if kind == "int":
            if not value.isascii():
                return None  # int() reads Unicode's digits too; click's NUMBER refuses them, saying so
            try:
                values[dest] = int(value)  # click's NUMBER is int() too, over 0-9
            except ValueError:
                return None
        elif kind == "mode" and value not in MODES:
            return None
        elif kind == "dir" and os.path.exists(value) and not (os.path.isdir(value) and os.access(value, os.R_OK)):
            return None  # click.Path refuses a file or an unreadable directory; a missing one is ours to refuse
        elif kind == "list":
            values[dest] = (*values[dest], value)
        else:
            values[dest] = value
    return values, command


def needs_click(values: dict[str, Any]) -> bool:
    return any(values[OPTIONS[flag][0]] != OPTIONS[flag][2] for flag in FOR_CLICK)


def submit(options: dict[str, Any], command: list[str]) -> bool:
    """Queue the job and print what click's submit prints. False, having written nothing, where it must be
    click's: a shared queue, or no GPU inventory recorded yet."""
    from gpuq_scheduler.jobs.arrays import parse_arrays
    from gpuq_scheduler.jobs.store.outbox import ensure_daemon, post_submit
    from gpuq_scheduler.jobs.store.statedir import INVENTORY, StateDir
    from gpuq_scheduler.jobs.submission import Inventory, capture_spec

    state = StateDir.from_env()
    if state.is_shared():  # its daemon gives the id, which click's path waits for
        return False
    inventory = Inventory.read(state.at(INVENTORY))
    if inventory is None:
        return False
    # The order of launcher.cli.app's submit and Queue.submit, so that the first problem found is the same one.
    indices, throttle, sweep = parse_arrays(options["array_spec"])
    array = (indices, throttle) if indices else None
    given = {option.dest: options[option.dest] for option in SUBMIT if option.spec}
    spec = capture_spec(
        command, environ=os.environ, sweep=sweep, array=array is not None, from_script=options[FROM_SCRIPT], **given
    )
    state.ensure()
    inventory.check_request(spec["gpus"], spec["mem_per_gpu"])
    inventory.check_pinned(spec["gpu_ids"])
    if spec["cpus"] is not None or spec["ram"] is not None or spec["pids"] is not None:
        from gpuq_scheduler.jobs.submission import check_host_limits

        check_host_limits(spec, state.at(INVENTORY))
    job_id = post_submit(state, spec, array, submitted_at=time.time())
    ensure_daemon(state)
    members = range(job_id + 1, job_id + 1 + len(array[0])) if array else range(0)
    if options["as_json"]:
        from gpuq_scheduler.jobs import jsontext

        _print(jsontext.dumps({"id": job_id, "jobs": list(members)} if array else {"id": job_id}))
    elif array:
        _print(f"submitted array {job_id} ({len(members)} jobs, {members[0]}-{members[-1]})")
    else:
        _print(f"submitted job {job_id}")
    return True


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
