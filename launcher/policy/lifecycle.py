"""Pure rules for a job's life around its run: when its dependencies let it start, whether a failure
earns a retry (and with how much memory), and when an array should stop burning through the night.

No I/O: the scheduler gives these plain records and applies what they return.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.units import format_size

FAIL_FAST_MEMBERS = 3  # an array whose first three members to end all failed...
FAIL_FAST_SECONDS = 120.0  # ...each within two minutes of starting, is held
# Out of memory that more memory may cure: --oom-retry (and --mem auto) retry it with twice the share. Within
# its share the GPU was full (more would not have helped), and a victim is requeued by the daemon instead.
GROWS = (Cause.OOM, Cause.OOM_PAST_SHARE)


@dataclass(frozen=True)
class Waiting:
    reason: str


@dataclass(frozen=True)
class Never:
    reason: str


Readiness = Waiting | Never | None  # None: free to start


def dependencies(spec: JobSpec, ended: Mapping[int, Sequence[JobRecord]]) -> Readiness:
    """Whether a job's dependencies let it start. ``ended`` maps each dependency id (a job, or an array
    standing for its members) to its records; a dependency still pending or running makes it wait."""
    for dep in spec.after:
        records = ended.get(dep, ())
        active = [r for r in records if not r.state.finished]
        if active or not records:
            what = f"job {dep}" if len(records) <= 1 else f"array {dep} ({len(active)} of {len(records)} active)"
            goal = "end" if spec.after_any else "succeed"
            return Waiting(f"waiting for {what} to {goal}")
        if not spec.after_any:
            bad = [r for r in records if r.state is not JobState.SUCCEEDED]
            if bad:
                first = bad[0]
                why = first.reason or first.state.value
                return Never(f"not run: dependency {first.id} {first.state.value} ({why})")
    return None


@dataclass(frozen=True)
class Retry:
    spec: JobSpec  # what the next attempt runs with (more memory after an out-of-memory)
    delay: float
    reason: str


def retry(record: JobRecord, outcome: Outcome, *, backoff: float, biggest_gpu: int | None) -> Retry | None:
    """A retry for a failed attempt, or None. Cancelled and successful jobs never retry.

    Backoff doubles each attempt (``backoff`` seconds first), capped at 10 minutes. With --oom-retry, a
    run that died of CUDA out-of-memory retries with twice the memory, or a whole GPU once twice would
    not fit any GPU; --oom-retry alone allows one such retry. A --mem auto job stopped at its fence retries
    until its share holds: the share was gpuq's guess (a probe's early peak, issue 40), not the user's, and
    doubling reaches a whole GPU within a few attempts, where an out-of-memory is the job's own again.
    """
    if outcome.state not in (JobState.FAILED, JobState.TIMEOUT, JobState.LOST):
        return None
    spec = record.spec
    # --mem auto implies --oom-retry: a learned share is a guess, and a job that outgrows it comes back with more.
    oom = (spec.oom_retry or spec.mem_auto) and outcome.cause in GROWS
    allowed = max(spec.retries, 1) if oom else spec.retries
    if oom and spec.mem_auto and spec.gpus > 0 and spec.mem_per_gpu is not None:
        allowed = max(allowed, record.attempt)
    if record.attempt > allowed:
        return None
    delay = min(backoff * 2 ** (record.attempt - 1), 600.0)
    if oom and spec.mem_auto and outcome.cause is Cause.OOM_PAST_SHARE:
        # gpuq's guess was short, not the job: nothing to wait out, and a backoff per doubling would make a big
        # job's first run wait 10 + 20 + 40 + ... seconds on its way to the share it needs.
        delay = 0.0
    why = outcome.reason or outcome.state.value
    if oom and spec.gpus > 0 and spec.mem_per_gpu is not None:
        more = spec.mem_per_gpu * 2
        grown = None if biggest_gpu is None or more >= biggest_gpu else more
        what = "a whole GPU" if grown is None else f"{format_size(more)} per GPU"
        return Retry(
            dataclasses.replace(spec, mem_per_gpu=grown), delay, f"retry {record.attempt} with {what} after: {why}"
        )
    return Retry(spec, delay, f"retry {record.attempt} of {allowed} after: {why}")


def requeue_delay(cause: Cause, backoff: float) -> float:
    """Seconds before a job ended through no fault of its own (``Cause.not_its_fault``) may start again.

    A victim of another job's memory waits the first backoff: the culprit may still be on that GPU. A job
    preempted where it could not be suspended waits none: its preemptor holds its GPUs, and it keeps its
    place in queue order (priority, then submission), ahead of the jobs submitted after it, as a suspended
    victim resumes before them. A backoff would let those overtake it while it waited out the delay.
    """
    return 0.0 if cause is Cause.PREEMPTED else backoff


@dataclass(frozen=True)
class Decided:
    """The guard has decided for good (a member succeeded, or it can no longer hold the array), or it held
    the array already: its members start as any job does, and may be handed off (``daemon.handoff``)."""


@dataclass(frozen=True)
class Undecided:
    """No member has succeeded and the guard may still hold the array: its members are not handed off (a
    hand-off starts the next member the moment one ends, before the guard has seen that end). ``wait``: why
    its pending members do not start now, until ``until`` at the latest; None where they may."""

    wait: str | None = None
    until: float = 0.0


@dataclass(frozen=True)
class Hold:
    reason: str


Guard = Decided | Undecided | Hold


def guard(members: Sequence[JobRecord]) -> Guard:
    """The fail-fast guard over an array's members (``fail_fast`` says when it holds one), decided before
    its next wave starts. Once some of its first members failed fast and none succeeded, the members still
    running may be the failures that make up its mind: the pending ones wait for those, so that 8 members
    on 4 GPUs that all fail at once never run more than 4. A member that has run past FAIL_FAST_SECONDS
    can no longer fail fast, and is not waited for."""
    why = fail_fast(members)
    if why is not None:
        return Hold(why)
    ended = [m for m in members if m.state.finished and m.ended_at is not None]
    if len(members) <= 1 or any(m.state is JobState.SUCCEEDED for m in ended):
        return Decided()
    failed = [m for m in ended if m.state in (JobState.FAILED, JobState.TIMEOUT, JobState.LOST)]
    if len(failed) >= min(FAIL_FAST_MEMBERS, len(members)) or any(not _fast(m) for m in failed):
        return Decided()  # its first failures did not all come fast: it will never be held
    if not failed:
        return Undecided()
    young = [
        m.started_at
        for m in members
        if m.state is not JobState.PENDING and not m.state.finished and m.started_at is not None
    ]
    if not young:
        return Undecided()  # nothing runs that could decide: the next member starts and shows
    return Undecided(
        f"waiting for the array's running members: {len(failed)} failed within {FAIL_FAST_SECONDS:.0f}s of starting "
        f"and none succeeded yet, so it may be held (`gpuq status {members[0].array_id}`)",
        max(young) + FAIL_FAST_SECONDS,
    )


def _fast(member: JobRecord) -> bool:
    return member.started_at is not None and (member.ended_at or 0) - member.started_at <= FAIL_FAST_SECONDS


def fail_fast(members: Sequence[JobRecord]) -> str | None:
    """Why an array should be held: its first members to end all failed quickly and none succeeded."""
    ended = sorted((m for m in members if m.state.finished and m.ended_at is not None), key=lambda m: m.ended_at or 0)
    if any(m.state is JobState.SUCCEEDED for m in ended):
        return None
    failed = [m for m in ended if m.state in (JobState.FAILED, JobState.TIMEOUT, JobState.LOST)]
    needed = min(FAIL_FAST_MEMBERS, len(members))
    if len(failed) < needed or len(members) <= 1:
        return None
    first = failed[:needed]
    if any(m.started_at is None or (m.ended_at or 0) - m.started_at > FAIL_FAST_SECONDS for m in first):
        return None
    why = first[-1].reason or first[-1].state.value
    return (
        f"held: the first {needed} members failed within {FAIL_FAST_SECONDS:.0f}s ({why}); "
        f"fix the cause, then `gpuq release {members[0].array_id}`"
    )
