"""What each setting of gpuq's config files is, and its default: one frozen dataclass per table
(``[shared]``, ``[watchdog]``, ``[status]``, each ``[clusters.NAME]``) and the words a setting may take.

``jobs.config`` reads the files into these and says what is wrong with a file; the daemon, the CLI and the
Slurm backend read them. Plain values: no disk, no TOML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

BACKENDS = ("slurm",)
PREEMPTION_BY = ("priority", "fair_share")


@dataclass(frozen=True)
class Cluster:
    name: str
    backend: str = "slurm"
    partition: str | None = None
    account: str | None = None
    time: float | None = None  # seconds: the default time limit of jobs sent there
    sbatch_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shared:
    admins: str | None = None  # a group name
    max_gpus_per_user: int | None = None
    max_queued_per_user: int | None = None
    fair_share_half_life: float = 24 * 3600.0
    priority: Mapping[str, int] = field(default_factory=dict)
    idle_limit: float | None = 4 * 3600.0  # seconds an interactive job's GPUs may do no work; None: no limit
    default_cpus: float | None = None  # a job's --cpus when it gives none; None: no limit
    default_ram: int | None = None  # bytes: a job's --ram when it gives none
    # pids.max of a job that gives no --pids, and the most --pids may be: a fork bomb stops in its own job.
    default_pids: int | None = 4096
    max_pids: int | None = 32768
    default_time: float | None = None  # seconds: the time limit of a job submitted without one
    max_time: float | None = 7 * 86400.0  # seconds: the longest time limit a job may have; None: no maximum
    idle_report: float | None = 2 * 3600.0  # seconds a batch job's GPUs may do no work before status says so
    # Preemption (docs/suspend.md): off unless set; how long a job runs first; what beyond --preemptible
    # makes a job preemptible ("priority": any lower priority; "fair_share": a user over their share).
    preemption: bool = False
    preemption_min_runtime: float = 600.0
    preemption_by: tuple[str, ...] = ()
    preemption_grace: float = 60.0  # seconds a job requeued instead of suspended has to save its work
    # Reservations (docs/shared-queue.md): an unused one is released after this idle time (None: never); a
    # user's reservations not yet over hold at most this many GPU-hours (None: no quota; admins have none).
    reservation_idle: float | None = 3600.0
    reservation_quota: float | None = 24.0
    outside_notify: str | None = None  # run for each new process holding GPU memory outside gpuq (#42)


@dataclass(frozen=True)
class Watchdog:
    """The GPU watchdog's rules: each "stop" or "warn" (``launcher.policy.watchdog_rules``)."""

    other_gpu: str = "stop"
    past_share: str = "stop"
    leftover: str = "stop"
    tolerance: int = 256 << 20  # bytes


WATCHDOG_ACTIONS = ("stop", "warn")


@dataclass(frozen=True)
class Status:
    """`gpuq status`'s defaults: ``format``, its columns as --format takes them (checked by the command,
    which knows the columns), and the file that set them, for its message."""

    format: str | None = None
    source: Path | None = None
