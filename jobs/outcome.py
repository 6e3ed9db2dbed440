"""How a job stands and how it ended: its state, and the outcome of a job that ended, with its typed cause
(``jobs.causes``) and the reason rendered from it for people. Plain data; ``jobs.model`` holds the rest of
what a job is.
"""

from __future__ import annotations

import enum
import signal as _signal
from dataclasses import dataclass

from gpuq_scheduler.jobs import causes
from gpuq_scheduler.jobs.causes import Cause, OutOfMemory


class JobState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"  # alive, its GPU state in host memory, its GPUs back in the pool
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    LOST = "lost"

    @property
    def finished(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)


class Step(str, enum.Enum):
    """A suspend or resume in progress, recorded before its first act so that a daemon restarted in the
    middle of it knows which to finish or undo (``launcher.daemon.suspension.suspending``). None: none in progress."""

    SUSPENDING = "suspending"  # running -> suspended: freezing, locking, checkpointing
    RESUMING = "resuming"  # suspended -> running: restoring, unlocking, thawing


def in_host_memory(size: int) -> str:
    """What a suspended job holds, for people: "38.2 GiB in host memory"."""
    return f"{size / 2**30:.1f} GiB in host memory"


@dataclass(frozen=True)
class Outcome:
    """How a job ended: its state, its typed cause (``jobs.causes``) and the reason rendered from it for
    people. Build one with the constructors below, never by hand."""

    state: JobState
    cause: Cause
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    culprit: int | None = None  # the job that took its memory (Cause.OOM_VICTIM)
    outlived: int = 0  # processes that outlived its first one and were ended with it (its containment saw)

    def ended_with(self) -> str:
        """What its end had to end ("2 processes outlived the job and were ended"), or ""."""
        if not self.outlived:
            return ""
        if self.outlived == 1:
            return "1 process outlived the job and was ended"
        return f"{self.outlived} processes outlived the job and were ended"

    def recorded_reason(self) -> str:
        """The reason as the job's record keeps it: with what its end had to end, if anything."""
        return "; ".join(part for part in (self.reason, self.ended_with()) if part)

    @classmethod
    def succeeded(cls) -> Outcome:
        return cls(JobState.SUCCEEDED, Cause.SUCCEEDED, exit_code=0)

    @classmethod
    def failed(cls, exit_code: int, detail: str = "") -> Outcome:
        """Exited ``exit_code``; ``detail``: what its log says (its last exception), for people."""
        why = f"{detail} (exit code {exit_code})" if detail else f"exit code {exit_code}"
        return cls(JobState.FAILED, Cause.EXIT_CODE, exit_code=exit_code, reason=why)

    @classmethod
    def failed_to_spawn(cls, reason: str) -> Outcome:
        return cls(JobState.FAILED, Cause.FAILED_TO_SPAWN, reason=f"could not start: {reason}")

    @classmethod
    def rejected(cls, problem: str) -> Outcome:
        return cls(JobState.FAILED, Cause.REJECTED, reason=problem)

    @classmethod
    def killed(cls, signum: int, detail: str = "") -> Outcome:
        what = f"killed by {signal_name(signum)}"
        return cls(JobState.FAILED, Cause.SIGNAL, signal=signum, reason=f"{detail} ({what})" if detail else what)

    @classmethod
    def out_of_memory(cls, oom: OutOfMemory, exit_code: int | None, signum: int | None) -> Outcome:
        """CUDA out of memory, of the kind ``oom`` says; a victim names its culprit."""
        end = f"killed by {signal_name(signum)}" if signum is not None else f"exit code {exit_code}"
        return cls(
            JobState.FAILED,
            oom.cause,
            exit_code=exit_code,
            signal=signum,
            reason=f"{oom.sentence()} ({end})",
            culprit=oom.culprit.job if oom.culprit is not None else None,
        )

    @classmethod
    def out_of_host_memory(cls, detail: str, exit_code: int | None = None, signum: int | None = None) -> Outcome:
        return cls(JobState.FAILED, Cause.HOST_OOM, exit_code=exit_code, signal=signum, reason=detail)

    @classmethod
    def process_limit(cls, limit: int, ended: Outcome) -> Outcome:
        """It failed as ``ended`` says after the kernel refused it a fork at its limit of ``limit`` tasks."""
        why = (
            f"reached its limit of {limit} processes; {ended.reason}"
            if ended.reason
            else f"reached its limit of {limit} processes"
        )
        return cls(JobState.FAILED, Cause.PROCESS_LIMIT, exit_code=ended.exit_code, signal=ended.signal, reason=why)

    @classmethod
    def stopped_by_watchdog(cls, what: str, signum: int | None = None) -> Outcome:
        """The watchdog stopped it: ``what`` it took ("held 22.4 GiB on GPU 0 against its 4.0G share")."""
        return cls(JobState.FAILED, Cause.WATCHDOG, signal=signum, reason=causes.watchdog(what))

    @classmethod
    def timeout(cls, limit: float | None, signum: int | None) -> Outcome:
        """Its time limit (None: a cluster's own limit) was reached."""
        why = "the cluster's time limit was reached" if limit is None else f"time limit of {limit:g}s reached"
        return cls(JobState.TIMEOUT, Cause.TIME_LIMIT, signal=signum, reason=why)

    @classmethod
    def cancelled(cls, by: str, signum: int | None = None) -> Outcome:
        return cls(JobState.CANCELLED, Cause.CANCELLED, signal=signum, reason=f"cancelled by {by}")

    @classmethod
    def not_run(cls, why: str) -> Outcome:
        """It never ran, and never will: a dependency did not succeed (``why`` says which)."""
        return cls(JobState.CANCELLED, Cause.DEPENDENCY, reason=why)

    @classmethod
    def gpu_lost(cls, why: str) -> Outcome:
        return cls(JobState.LOST, Cause.GPU_LOST, reason=why)

    @classmethod
    def withdrawn(cls, reason: str) -> Outcome:
        """A job that never ran and never will: recorded cancelled, saying why."""
        return cls(JobState.CANCELLED, Cause.CANCELLED, reason=f"withdrawn: {reason}")

    @classmethod
    def died_suspended(cls, ended: Outcome) -> Outcome:
        """It ended while suspended to host memory, as ``ended`` says (a suspended job cannot run: something
        killed it); its exit code and signal kept."""
        return cls(
            JobState.FAILED,
            Cause.DIED_SUSPENDED,
            exit_code=ended.exit_code,
            signal=ended.signal,
            reason=f"died while suspended ({ended.reason})" if ended.reason else "died while suspended",
        )

    @classmethod
    def preempted(cls, preemptor: int, why: str) -> Outcome:
        """It was signalled and ended to give its GPUs to job ``preemptor`` (it could not be suspended, as
        ``why`` says): requeued, not counted against its retries, whatever it exited with."""
        return cls(JobState.FAILED, Cause.PREEMPTED, reason=f"preempted for job {preemptor} ({why})", culprit=preemptor)

    @classmethod
    def lost(cls, reason: str) -> Outcome:
        return cls(JobState.LOST, Cause.LOST, reason=reason)


def signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
