"""Why a job ended, as a typed fact: the cause an outcome carries, set where it is known (the daemon reading
an exit file, the limits step stopping a job, the watchdog), stored in the job table beside the state, and
the one thing --oom-retry, --mem auto and the report decide by. The reason sentence people read is
rendered from it here; nothing reads a reason's words back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpuq_scheduler.jobs.units import format_duration, format_size

GiB = 1 << 30


class Cause(str, enum.Enum):
    """One value per way a job can end; the table stores the value (``jobs.cause``)."""

    SUCCEEDED = "succeeded"
    EXIT_CODE = "exit-code"  # its main process exited non-zero
    SIGNAL = "signal"  # its main process was killed by a signal gpuq did not send
    FAILED_TO_SPAWN = "failed-to-spawn"  # its program could not be started
    REJECTED = "rejected"  # its request could not become a job that runs (its owner, its private part)
    OOM = "oom"  # CUDA out of memory with no fence: a whole GPU, or the fence turned off
    OOM_PAST_SHARE = "oom-past-share"  # stopped at its fence: it asked for more than its share
    OOM_WITHIN_SHARE = "oom-within-share"  # within its share, its GPU had no room left (use outside gpuq)
    OOM_VICTIM = "oom-victim"  # within its share, on a GPU where another job was past its own: the culprit
    HOST_OOM = "host-oom"  # the kernel (or Slurm) ended it at its host memory limit
    PROCESS_LIMIT = "process-limit"  # it failed after the kernel refused it a process at its --pids limit
    WATCHDOG = "watchdog"  # gpuq stopped it for taking what it was not given
    TIME_LIMIT = "time-limit"
    CANCELLED = "cancelled"  # by a user, an admin, or gpuq's idle limit (the reason says by whom)
    DEPENDENCY = "dependency"  # never run: a job it depended on did not succeed
    GPU_LOST = "gpu-lost"  # stopped because a GPU it held stopped answering
    LOST = "lost"  # its end was not seen: its supervisor was killed, the machine restarted
    DIED_SUSPENDED = "died-suspended"  # it ended while suspended to host memory (killed: it could not run)
    PREEMPTED = "preempted"  # signalled and ended for a more urgent job, where it could not be suspended

    @property
    def out_of_memory(self) -> bool:
        return self in _GPU_OOM

    @property
    def not_its_fault(self) -> bool:
        """It ran out because another job took its memory: requeued without counting against its retries,
        and --mem auto learns nothing from the run."""
        return self in (Cause.OOM_VICTIM, Cause.PREEMPTED)


_GPU_OOM = frozenset((Cause.OOM, Cause.OOM_PAST_SHARE, Cause.OOM_WITHIN_SHARE, Cause.OOM_VICTIM))


@dataclass(frozen=True)
class Culprit:
    """A job past its share on a GPU where another ran out of memory within its own."""

    job: int
    gpu: int
    held: int  # bytes its processes held on that GPU at the daemon's last sample
    share: int  # its share of that GPU (--mem), bytes


@dataclass(frozen=True)
class OutOfMemory:
    """What is known of a job's CUDA out of memory: which kind, and the facts its sentence names."""

    cause: Cause
    share: int | None = None  # its --mem, bytes
    asked: str = ""  # how it asked: "auto" or the size
    gpu: int | None = None
    culprit: Culprit | None = None
    free: int | None = None  # what its GPU had left at the last sample (within its share, no culprit)

    def __post_init__(self) -> None:
        if not self.cause.out_of_memory:
            raise ValueError(f"{self.cause.value} is not an out of memory cause")

    def sentence(self) -> str:
        share = format_size(self.share) if self.share is not None else "?"
        if self.cause is Cause.OOM:
            return "CUDA out of memory"
        if self.cause is Cause.OOM_PAST_SHARE:
            return f"CUDA out of memory at its {share} share (--mem {self.asked or share})"
        if self.cause is Cause.OOM_VICTIM:
            assert self.culprit is not None
            c = self.culprit
            return (
                f"CUDA out of memory: GPU {c.gpu} was full; job {c.job} held {c.held / GiB:.1f} GiB against its "
                f"{format_size(c.share)} share"
            )
        left = "" if self.free is None else f" ({format_size(self.free)} free)"
        return f"CUDA out of memory within its {share} share: GPU {self.gpu} was full{left}"


IDLE_BATCH = "no GPU work for"  # how a batch job's reason begins while its GPUs do nothing (``idle_batch``)


def idle_batch(seconds: float) -> str:
    """The reason of a running batch job whose GPUs did no work for ``seconds``: "no GPU work for 2h05m".
    Readers that decide by it (`gpuq doctor`) read the typed fact, ``jobs.store.notices.read_idle_batch``."""
    return f"{IDLE_BATCH} {format_duration(seconds)}"


def watchdog(what: str) -> str:
    """The reason of a job the watchdog stopped: "stopped by the watchdog: held 22.4 GiB on GPU 0 against
    its 4.0G share"."""
    return f"stopped by the watchdog: {what}"
