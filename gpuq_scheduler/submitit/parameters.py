"""submitit's executor parameters read as gpuq submit's options: plain values in, options and notes out.

submitit takes generic names (``timeout_min``, ``gpus_per_node``...) and, prefixed by an executor's name,
that executor's own (``slurm_partition``, ``local_visible_gpus``); a prefixed generic (``slurm_timeout_min``)
overrides the generic one on that executor only. gpuq reads them the same way, ``where`` being the executor
the jobs go to: ``local`` (this workstation's queue) or ``slurm`` (a cluster of the config). ``gpuq_<option>``
passes any of ``gpuq submit``'s options (``gpuq_mem="20G"``, ``gpuq_priority=5``).

A name no executor knows is refused, as submitit refuses it. A known parameter that means nothing where the
jobs go comes back in ``unused`` with the reason, for the executor to say once: never dropped in silence.
What would make a job run wrongly (several tasks or nodes, each expecting its own share) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.options import SUBMIT

GENERIC = (
    "name",
    "timeout_min",
    "mem_gb",
    "nodes",
    "cpus_per_task",
    "gpus_per_node",
    "tasks_per_node",
    "stderr_to_stdout",
)
_SLURM_ONLY_GIVEN = "set it in the cluster's config: [clusters.{cluster}] partition, account or sbatch_flags"
_NO_SIGNAL = "gpuq sends no signal before a time limit: checkpoint() is called on preemption alone"
_SHAPE = "gpuq shapes a job by cpus_per_task, gpus_per_node and mem_gb"
# Slurm's own parameters (submitit's SlurmExecutor) and why each does nothing when gpuq sends the job to Slurm;
# those read as options here are in _SLURM_READ.
SLURM: Mapping[str, str] = {
    **dict.fromkeys(
        (
            "partition",
            "account",
            "qos",
            "constraint",
            "exclude",
            "nodelist",
            "gres",
            "exclusive",
            "mail_type",
            "mail_user",
            "wckey",
            "additional_parameters",
        ),
        _SLURM_ONLY_GIVEN,
    ),
    "comment": "gpuq's sbatch --comment names the gpuq job it is",
    **dict.fromkeys(("setup", "srun_args", "use_srun"), "gpuq runs the function itself, with no srun or setup lines"),
    "signal_delay_s": _NO_SIGNAL,
    **dict.fromkeys(("cpus_per_gpu", "gpus_per_task", "mem_per_gpu", "mem_per_cpu"), _SHAPE),
    "dependency": "use gpuq_after='ID,ID' (gpuq's --after)",
}
_SLURM_READ = {
    "job_name": "name",
    "time": "timeout_min",
    "ntasks_per_node": "tasks_per_node",
    "num_gpus": "gpus_per_node",
    "mem": "mem",
}
LOCAL: Mapping[str, str] = {
    "visible_gpus": "",  # read: gpuq's --gpu-ids
    "setup": "gpuq runs no shell lines before the function: put them in the function or the environment",
    "signal_delay_s": _NO_SIGNAL,
}
GPUQ = frozenset(option.dest for option in SUBMIT if option.api) - {"on"}  # the cluster is the executor's
_VALID = {"slurm": {*SLURM, *_SLURM_READ, "array_parallelism"}, "local": set(LOCAL), "debug": set(), "gpuq": set(GPUQ)}
_INT = ("nodes", "cpus_per_task", "gpus_per_node", "tasks_per_node")


@dataclass(frozen=True)
class Reading:
    """What the parameters say where the jobs go: ``gpuq submit``'s keywords, the array's throttle, and each
    parameter that does nothing there, with why."""

    options: dict[str, Any]
    throttle: int | None = None
    unused: dict[str, str] = field(default_factory=dict)


class UnknownParameter(BadInput, NameError):
    """A parameter no executor takes: a NameError, as submitit raises, and gpuq's one-line BadInput."""


def check_names(given: Mapping[str, Any]) -> None:
    """Refuse a name that is neither generic nor an executor's own (``slurm_foo``), as submitit does."""
    bad = []
    for key in given:
        if key in GENERIC:
            continue
        prefix, _, arg = key.partition("_")
        valid = _VALID.get(prefix)
        if valid is None or not arg or (arg not in valid and arg not in GENERIC):
            bad.append(key)
    if bad:
        raise UnknownParameter(
            f"update_parameters: unknown parameter(s) {', '.join(sorted(bad))}: use submitit's generic names "
            f"({', '.join(GENERIC)}), an executor's own prefixed by slurm_ or local_, or gpuq_<gpuq submit option>"
        )


def read(given: Mapping[str, Any], where: str) -> Reading:
    """The parameters as gpuq's options for jobs sent ``where`` ("local" or "slurm")."""
    params = {key: value for key, value in given.items() if value is not None}  # None: not set, as in submitit
    check_names(params)
    generic: dict[str, Any] = {key: params[key] for key in GENERIC if key in params}
    given_as = {key: key for key in generic}  # a generic name -> the name it was given by (slurm_timeout_min)
    own: dict[str, Any] = {}  # gpuq_<option>: gpuq's options as given, over what the generic names say
    unused: dict[str, str] = {}
    throttle, visible = None, None
    for key, value in params.items():
        prefix, _, arg = key.partition("_")
        if key in GENERIC:
            continue
        if prefix == "gpuq":
            own[arg] = value
        elif prefix == "slurm" and arg == "array_parallelism":
            throttle = _count(key, value)  # a throttle means the same here: how many run at once
        elif prefix != where:
            unused[key] = f"it is the {prefix} executor's, and these jobs go to {_place(where)}"
        elif arg in GENERIC:
            generic[arg], given_as[arg] = value, key
        elif where == "slurm" and arg in _SLURM_READ:
            generic[_SLURM_READ[arg]], given_as[_SLURM_READ[arg]] = (
                _minutes(key, value) if arg == "time" else value,
                key,
            )
        elif where == "slurm":
            unused[key] = SLURM[arg]
        elif arg == "visible_gpus":
            visible = value
        else:
            unused[key] = LOCAL[arg]
    options = _generic(generic, unused, given_as)
    if visible is not None and options["gpus"]:
        options["gpu_ids"] = _visible("local_visible_gpus", visible, options["gpus"])
    elif visible is not None:
        unused["local_visible_gpus"] = "it picks the job's GPUs among those listed, and gpus_per_node asks for none"
    return Reading({**options, **own}, throttle, unused)


def _generic(generic: dict[str, Any], unused: dict[str, str], given_as: dict[str, str]) -> dict[str, Any]:
    for key in _INT:
        if key in generic:
            _count(key, generic[key], least=0 if key == "gpus_per_node" else 1)
    if generic.get("nodes", 1) > 1:
        raise BadInput(
            f"nodes={generic['nodes']}: gpuq runs a job on one machine; a job over several nodes is not supported "
            "(send it to Slurm with submitit itself)"
        )
    if generic.get("tasks_per_node", 1) > 1:
        raise BadInput(
            f"tasks_per_node={generic['tasks_per_node']}: gpuq runs the function once per job and returns one result; "
            "for one process per GPU, run a script with gpuq submit --mode torchrun"
        )
    options: dict[str, Any] = {"gpus": generic.get("gpus_per_node", 0)}  # submitit's default: no GPU
    if "name" in generic:
        if not isinstance(generic["name"], str):
            raise BadInput(f"name={generic['name']!r}: give the job's name as a string")
        options["name"] = generic["name"]
    if "timeout_min" in generic:
        options["time_limit"] = _minutes("timeout_min", generic["timeout_min"]) * 60.0
    if "cpus_per_task" in generic:
        options["cpus"] = str(generic["cpus_per_task"])
    if "mem" in generic:
        options["ram"] = _slurm_size("slurm_mem", generic["mem"])
    if "mem_gb" in generic:
        options["ram"] = round(_number("mem_gb", generic["mem_gb"]) * (1 << 30))  # Slurm's GB are GiB
    if generic.get("stderr_to_stdout") is False:
        unused[given_as["stderr_to_stdout"]] = (
            "gpuq's log holds both streams, so job.stdout() has stderr too (job.stderr() has Python's stderr alone)"
        )
    return options


def _place(where: str) -> str:
    return "a Slurm cluster through gpuq" if where == "slurm" else "this workstation's gpuq queue"


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise BadInput(f"{key}={value!r}: give a positive number")
    return float(value)


def _minutes(key: str, value: Any) -> float:
    return _number(key, value)


def _count(key: str, value: Any, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BadInput(f"{key}={value!r}: give a whole number, at least {least}")
    return value


def _slurm_size(key: str, value: Any) -> str:
    """Slurm's --mem as gpuq reads a size: a bare number is megabytes, and K, M, G, T (with or without a B,
    as submitit writes "16GB") are binary units."""
    text = str(value).strip().upper()
    number = text.rstrip("KMGTB")
    unit = text[len(number) :].rstrip("B") or "M"
    if not number.replace(".", "", 1).isdigit() or unit not in ("K", "M", "G", "T"):
        raise BadInput(f"{key}={value!r}: give Slurm's --mem, like 16G or 16000 (megabytes)")
    return number + unit


def _visible(key: str, value: Any, gpus: int) -> list[int]:
    """submitit's visible_gpus: the GPUs a job may use, the first gpus_per_node of them used: gpuq's --gpu-ids."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise BadInput(f"{key}={value!r}: give a sequence of GPU numbers, like (0, 1)")
    if gpus > len(value):
        raise BadInput(f"{key}={tuple(value)}: {gpus} GPUs asked for (gpus_per_node), only {len(value)} listed")
    return list(value[:gpus])
