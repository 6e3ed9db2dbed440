"""Learned memory (``--mem auto``): a job's reservation from the peaks of earlier jobs of its kind.

Pure: the peaks the daemon has seen come in as plain values, an estimate or a reason to wait goes out.

A job's kinds, most specific first: the job named by ``--like``, its array, its ``--name``, and its
command line with its working directory (``spec.kind``, fixed at submit time from the command as typed,
so an array's members and tomorrow's run of the same script share it). The first kind with a known peak
gives the reservation: that peak plus a margin. With none known and a fence to hold it, every job of the
kind starts at once on a *first share* (``first``: a sixteenth of its GPU by default), fenced: one that
outgrows it meets its own fence and comes back with twice as much, and its kind learns from every run
that ends. (A probe made the others wait for its peak, which cost a short sweep most of its run: measured on
an H200, its 12 s probe was mostly start-up, before the memory it would show.) Where nothing would hold a
first share (no fence, or ``first`` is None), one job of the kind runs as the *probe*
(on a whole GPU, or on ``probe_mem`` when configured) and the others of its kind wait for the probe's
peak: all of them running as probes would take every GPU whole, which is what ``auto`` is meant to avoid.
A running probe's peak counts once it has held still for ``steady`` seconds, or at the latest once the probe
has run ``settle`` seconds (``counts``), so an array waits seconds for its probe, not a whole run; the
others start fenced at that early peak plus the margin. A job whose memory grows later is stopped at its
fence (CUDA out of memory), comes back with twice its reservation (or the probe's larger peak since), and
the raised figure is what its kind learns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuq_scheduler.jobs.units import format_size

MARGIN = 0.20  # of the peak: NVML is sampled every 2 s and misses short spikes; allocators vary run to run
FLOOR = 256 << 20  # the least margin: a CUDA context alone moves by this much between driver versions
SETTLE = 20.0  # seconds a probe runs before its peak so far counts for the rest of its kind, still or not
# Seconds a probe's peak must hold still before it counts sooner: the daemon samples every 2 s, so three
# samples in a row showing the same peak (a training job's memory stops growing after its first steps).
STEADY = 4.0
FIRST_RUNS = 16  # the first share is a GPU's room over this many jobs: 5 doublings reach a whole GPU


@dataclass(frozen=True)
class Peak:
    """What a kind has shown: the most memory one of its jobs held on one GPU, and which job it was."""

    bytes: int
    job_id: int
    raised: bool = False  # a floor set after an out-of-memory, not a measured peak
    running: bool = False  # the job still runs (a probe that has settled)


@dataclass(frozen=True)
class Estimate:
    """The reservation per GPU (None: whole GPUs) and where it came from, in words for `gpuq show`."""

    mem: int | None
    note: str
    probe: bool = False  # no run of its kind is known: this job runs first and the others wait for it


@dataclass(frozen=True)
class Wait:
    reason: str


def kinds(*, like: int | None, array_id: int | None, name: str, kind: str, owner: int | None = None) -> list[str]:
    """The keys a job's history is filed under, most specific first. ``owner`` (a uid) files a name and a
    command per user: in a shared queue, one user's jobs named like another's must not set their reservation
    (a job and an array have one owner already)."""
    keys = [f"job:{like}"] if like is not None else []
    if array_id is not None:
        keys.append(f"array:{array_id}")
    mine = "" if owner is None else f"{owner}:"
    if name:
        keys.append(f"name:{mine}{name}")
    if kind:
        keys.append(f"cmd:{mine}{kind}")
    return keys


def reservation(peak: int, margin: float = MARGIN, floor: int = FLOOR) -> int:
    """The peak plus a margin, rounded up to a whole MiB."""
    wanted = peak + max(int(peak * margin), floor)
    return -(-wanted // (1 << 20)) << 20


def first_share(gpu_room: int, overhead: int, floor: int = FLOOR) -> int:
    """The share every job of a kind with no history starts on: ``gpu_room`` (a GPU's memory less the margin
    placement keeps free) over FIRST_RUNS jobs, less the ``overhead`` placement adds to each share."""
    return max(gpu_room // FIRST_RUNS - overhead, floor) >> 20 << 20


def estimate(
    job_id: int,
    keys: Sequence[str],
    peaks: Mapping[str, Peak],
    probes: Mapping[str, int],
    *,
    margin: float = MARGIN,
    floor: int = FLOOR,
    overhead: int = 0,
    probe_mem: int | None = None,
    biggest_gpu: int | None = None,
    first: int | None = None,
) -> Estimate | Wait:
    """How much ``job_id`` (filed under ``keys``) reserves on each GPU, or why it waits for a probe.

    ``peaks`` holds what each key has shown, ``probes`` the job probing each key now. A peak is all the
    process held (NVML counts its CUDA context too), while placement adds ``overhead`` to every share for
    the context: the share is the reservation less that overhead, so the context is not counted twice. A
    reservation that would not fit under ``biggest_gpu`` is a whole GPU. ``first``: the fenced first share of
    a kind with no history (None: a probe runs first, alone)."""
    for key in keys:
        peak = peaks.get(key)
        if peak is None:
            continue
        if peak.raised:  # a share already: twice the one the job ran out of memory at
            total, share = peak.bytes + overhead, peak.bytes
            note = f"{format_size(share)} learned: twice its share after job {peak.job_id} ran out of memory"
        else:
            total = reservation(peak.bytes, margin, floor)
            share = max(total - overhead, floor)
            running = " (running)" if peak.running else ""
            note = f"{format_size(total)} learned from job {peak.job_id}{running}: peak {format_size(peak.bytes)}"
        if biggest_gpu is not None and total >= biggest_gpu:
            return Estimate(None, f"whole GPU: learned {format_size(total)} from job {peak.job_id}, a GPU's worth")
        return Estimate(share, note)
    if first is not None:
        return Estimate(first, f"a first run on {format_size(first)}, fenced: no earlier run of its kind")
    for key in keys:
        prober = probes.get(key)
        if prober is not None and prober != job_id:
            return Wait(f"--mem auto: waiting for the peak memory of job {prober}, which runs first as a probe")
    where = "a whole GPU" if probe_mem is None else f"{format_size(probe_mem)} (auto.probe_mem)"
    return Estimate(probe_mem, f"a probe on {where}: no earlier run of its kind", probe=True)


def counts(ran: float, still: float | None, *, settle: float = SETTLE, steady: float | None = STEADY) -> bool:
    """Whether a running probe's peak so far counts for the rest of its kind. ``ran``: seconds the probe has
    run; ``still``: seconds since its peak last grew (None: no memory seen yet); ``steady`` None: only
    ``settle`` counts. A peak that held still early can still be the CUDA context alone, before the job's
    real work: the others are fenced at it, so one that needs more meets its fence, not a neighbour."""
    if still is None:
        return False
    return ran >= settle or (steady is not None and still >= steady)


def learn(peaks: Mapping[str, Peak], keys: Sequence[str], seen: Peak) -> dict[str, Peak]:
    """What ``peaks`` becomes once a job filed under ``keys`` has shown ``seen``. A measured peak replaces
    an earlier one only when larger, or when the earlier was a running probe's or a raised floor (those
    are provisional); the kind keeps its worst run, so one small run does not shrink every later share."""
    changed: dict[str, Peak] = {}
    for key in keys:
        old = peaks.get(key)
        if old == seen:
            continue
        if old is None or old.running or seen.bytes > old.bytes or (old.raised and not seen.running):
            if old is not None and not old.running and not old.raised and seen.running:
                continue  # a settled probe never overrides a finished run
            changed[key] = seen
    return changed
