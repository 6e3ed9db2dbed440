"""Whose fault a CUDA out of memory was: pure, over the daemon's last per-process memory sample.

A packed job that runs out of GPU memory either asked for more than its share (its fence stopped it: its
own fault), or was still within its share when its GPU ran out. Then, if another job on that GPU held more
than its own share (it dropped its fence, or its framework ignores the cooperative one), that job is the
culprit and this one its victim; with no such job, the GPU was full of use outside gpuq.

"Within" and "past" allow for the CUDA context, which the daemon's placement reserves beside each share
(``overhead``), plus ``TOLERANCE`` for the noise of a sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuq_scheduler.jobs.causes import Cause, Culprit, OutOfMemory

TOLERANCE = 256 << 20  # bytes past share + overhead before a job counts as past its share


@dataclass(frozen=True)
class Sampled:
    """One running job as the last sample saw it: its share (None: whole GPUs) and what it held, by GPU."""

    job: int
    share: int | None
    held: Mapping[int, int]


def past(share: int | None, held: int, overhead: int) -> bool:
    """Whether ``held`` bytes on one GPU are past a share (a job with whole GPUs has none to pass)."""
    return share is not None and held > share + overhead + TOLERANCE


def out_of_memory(
    job: Sampled,
    gpus: Sequence[int],
    others: Sequence[Sampled],
    *,
    overhead: int,
    fenced: bool,
    asked: str,
    free: Mapping[int, int],
) -> OutOfMemory:
    """The kind of a CUDA out of memory of ``job`` (on ``gpus``), given the other running jobs and each GPU's
    free memory at the last sample. A whole-GPU job, or one with no fence, just ran out (Cause.OOM).

    Within its share means it held no more than its share on each GPU and some GPU of its had less free than
    the rest of its share, or another job there was past its own: the GPU could not give it what it was
    promised. The culprit named is the one past its share by the most."""
    share = job.share
    if share is None:
        return OutOfMemory(Cause.OOM)
    within = all(not past(share, job.held.get(gpu, 0), overhead) for gpu in gpus)
    if within:
        worst: Culprit | None = None
        for other in others:
            for gpu in gpus:
                held = other.held.get(gpu, 0)
                if other.job != job.job and other.share is not None and past(other.share, held, overhead):
                    over = held - other.share
                    if worst is None or over > worst.held - worst.share:
                        worst = Culprit(other.job, gpu, held, other.share)
        if worst is not None:
            return OutOfMemory(Cause.OOM_VICTIM, share=share, asked=asked, gpu=worst.gpu, culprit=worst)
        for gpu in gpus:
            room = free.get(gpu)
            if room is not None and room + job.held.get(gpu, 0) < share:
                return OutOfMemory(Cause.OOM_WITHIN_SHARE, share=share, asked=asked, gpu=gpu, free=room)
    return OutOfMemory(Cause.OOM_PAST_SHARE if fenced else Cause.OOM, share=share, asked=asked)
