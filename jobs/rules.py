"""The rules every job spec follows, checked on plain values.

``JobSpec`` (``jobs.model``) checks them when one is built; the quick ``gpuq submit`` path
(``launcher.cli.submit``) checks them on the spec it writes as a plain dict, without loading the model
(dataclasses, enum) at all. One function, so the two cannot disagree on what is allowed or on the words.
"""

from __future__ import annotations

from gpuq_scheduler.jobs.errors import BadInput

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Sequence

MAX_PRIORITY = 1_000_000  # priorities are compared, not counted: a bound keeps them inside the table's integers
MAX_CPUS = 100_000  # --cpus: a bound before it becomes cpu.max's quota
MODES = ("single", "dataparallel", "torchrun")  # the values of jobs.model.Mode, in its order
_INFINITY = float("inf")  # not math.inf: loading math is ~0.2 ms of every quick `gpuq submit`


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
    cpus: float | None = None,
    ram: int | None = None,
) -> None:
    """Raise BadInput with a one-line message for the first rule these values break."""
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
