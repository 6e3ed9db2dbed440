"""The GPU watchdog's rules: pure, over one sample of NVML's per-process memory (docs/watchdog.md).

In: every process on every GPU (``Seen``: GPU, pid, bytes), the job each belongs to as containment
attributed it (pid -> job id; None: not one of this queue's jobs, such as a teammate's notebook or gpuq's
own MPS servers), what each running job was given (``Given``: its GPUs and, packed, its share), and the
settings. Out: ``Finding``s, each naming a job, the rule it broke and what to do about it. Three rules:

- ``OTHER_GPU``: a process of a running job on a GPU the job was not given (a launcher that set its own
  ``CUDA_VISIBLE_DEVICES``; a CPU job that found a GPU): it uses memory placement promised to another job.
- ``PAST_SHARE``: a packed job (``--mem``) holding more than its share on one of its GPUs, past its share
  plus ``overhead`` (the CUDA context placement reserves beside every share; the MPS limit counts it too)
  plus ``tolerance``. A job inside its fence can never get there (MPS refuses, PyTorch's cap refuses):
  only one outside it can (its fence variables dropped, a framework that ignores PyTorch's cap).
- ``LEFTOVER``: a process of a job that is not running (it ended, or was queued again) still on a GPU.

Each rule is ``STOP`` (the default: the job is stopped, or the leftover process ended) or ``WARN`` (said
in the daemon's log and the journal, nothing stopped).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuq_scheduler.jobs.units import format_size
from gpuq_scheduler.launcher.policy.blame import TOLERANCE  # one "past its share", the culprit's and the watchdog's

GiB = 1 << 30


class Rule(str, enum.Enum):
    OTHER_GPU = "other-gpu"
    PAST_SHARE = "past-share"
    LEFTOVER = "leftover"


class Action(str, enum.Enum):
    STOP = "stop"
    WARN = "warn"


@dataclass(frozen=True)
class Seen:
    """One row of NVML's per-process list: process ``pid`` holds ``used`` bytes on GPU ``gpu``."""

    gpu: int
    pid: int
    used: int


@dataclass(frozen=True)
class Given:
    """What a running job was given: its GPUs (indices) and its share of each (bytes; None: whole GPUs)."""

    gpus: tuple[int, ...]
    share: int | None = None


@dataclass(frozen=True)
class Settings:
    other_gpu: Action = Action.STOP
    past_share: Action = Action.STOP
    leftover: Action = Action.STOP
    tolerance: int = TOLERANCE
    overhead: int = 1 * GiB  # placement's per-process overhead (``Policy.overhead``)

    def action(self, rule: Rule) -> Action:
        if rule is Rule.OTHER_GPU:
            return self.other_gpu
        if rule is Rule.PAST_SHARE:
            return self.past_share
        if rule is Rule.LEFTOVER:
            return self.leftover
        raise ValueError(f"unknown watchdog rule {rule!r}")


@dataclass(frozen=True)
class Finding:
    """Job ``job`` broke ``rule`` on GPU ``gpu``: its processes ``pids`` there held ``held`` bytes."""

    job: int
    rule: Rule
    action: Action
    gpu: int
    pids: tuple[int, ...]
    held: int
    share: int | None = None

    def what(self) -> str:
        """What it did, for people: the reason of a job the watchdog stopped."""
        if self.rule is Rule.OTHER_GPU:
            return f"used GPU {self.gpu}, which it was not given"
        if self.rule is Rule.PAST_SHARE:
            assert self.share is not None
            return f"held {self.held / GiB:.1f} GiB on GPU {self.gpu} against its {format_size(self.share)} share"
        if self.rule is Rule.LEFTOVER:
            which = ", ".join(str(pid) for pid in self.pids)
            return f"process {which} was still on GPU {self.gpu} after the job ended"
        raise ValueError(f"unknown watchdog rule {self.rule!r}")


def past(share: int, held: int, settings: Settings) -> bool:
    """Whether ``held`` bytes on one GPU are past a ``share``: more than share, overhead and tolerance."""
    return held > share + settings.overhead + settings.tolerance


def check(
    seen: Sequence[Seen], owners: Mapping[int, int | None], running: Mapping[int, Given], settings: Settings
) -> list[Finding]:
    """Every rule broken in one sample, ordered by job, then rule, then GPU. A process ``owners`` does not
    name, or names as None, is no job's: the watchdog leaves it alone (placement counts it as outside use)."""
    held: dict[tuple[int, int], list[Seen]] = {}  # (job, GPU) -> its processes there
    for row in seen:
        job = owners.get(row.pid)
        if job is not None:
            held.setdefault((job, row.gpu), []).append(row)
    order = {rule: at for at, rule in enumerate(Rule)}
    found: list[Finding] = []
    for (job, gpu), rows in held.items():
        pids = tuple(sorted({row.pid for row in rows}))
        total = sum(row.used for row in rows)
        given = running.get(job)
        if given is None:
            rule: Rule | None = Rule.LEFTOVER
        elif gpu not in given.gpus:
            rule = Rule.OTHER_GPU
        elif given.share is not None and past(given.share, total, settings):
            rule = Rule.PAST_SHARE
        else:
            rule = None
        if rule is not None:
            share = given.share if given is not None else None
            found.append(Finding(job, rule, settings.action(rule), gpu, pids, total, share))
    found.sort(key=lambda f: (f.job, order[f.rule], f.gpu))
    return found


def to_stop(findings: Sequence[Finding]) -> dict[int, Finding]:
    """The running jobs to stop, each with the finding its reason names (the first of its own)."""
    stops: dict[int, Finding] = {}
    for finding in findings:
        if finding.action is Action.STOP and finding.rule is not Rule.LEFTOVER:
            stops.setdefault(finding.job, finding)
    return stops
