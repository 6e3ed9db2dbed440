"""Whether a suspend's copy of a job's GPU state fits in host memory (#40). Pure: the figures come in, a
reason to refuse goes out.

Both ways of suspending keep the copy in the job's own processes, charged to its cgroup: the fast path in
pinned buffers, the driver's checkpoint in memory of its own (measured on a lent H200: a job with 4 GiB on
its GPU and 1 GiB of room under its memory.max was killed by the kernel in the driver's checkpoint,
bench/results/h200-fastsuspend-2026-11-29b). So a copy that does not fit is refused, whichever way it
would go: the job is left running, never killed.
"""

from __future__ import annotations

from collections.abc import Mapping

GIB = 1 << 30


def refusal(copy: int, pool: int, available: int, spare: int, left: int | None) -> str:
    """Why a suspend moving ``copy`` bytes to host memory must not run ("" if it may). ``pool``: bytes of it
    the job holds pinned already (the fast path's pool), which the host's ``available`` memory already
    leaves out; what is left must fit there with ``spare`` to spare, and within ``left`` bytes, the room
    under the job's own limit (its --ram), if it has one."""
    need = max(0, copy - pool)
    if need + spare > available:
        return (
            f"its {need / GIB:.1f} GiB of GPU state would not fit in the host's {available / GIB:.1f} GiB of "
            f"available memory with {spare / GIB:.1f} GiB to spare"
        )
    if left is not None and need > left:
        return (
            f"its {need / GIB:.1f} GiB of GPU state would not fit in the {left / GIB:.1f} GiB left under its --ram "
            f"(the kernel would end it)"
        )
    return ""


def keeps(available: int, spare: int, others: int) -> bool:
    """Whether a job may keep its pool (the pinned host memory of its last suspend, held so that its next one
    copies at the link's speed rather than pin afresh at the VM's 3-5 GB/s). ``available``: the host's
    available memory, which leaves the pool out already (it is held); ``others``: what the suspends of the
    other running preemptible jobs would take (their GPU state less their own pools). Kept only while the
    host could still take all of those with ``spare`` to spare: a pool never makes another job's suspend
    wait, and never pushes the host toward swap."""
    return available >= spare + others


def give_back(need: int, available: int, spare: int, pools: Mapping[int, int]) -> list[int] | None:
    """The pools (job -> bytes held) to give back so that a suspend taking ``need`` bytes fits in the host's
    ``available`` memory with ``spare`` to spare: none where it fits already; else the largest first (the
    fewest jobs touched, ties by job id); None where even all of them would not make room."""
    short = need + spare - available
    chosen: list[int] = []
    for job, held in sorted(pools.items(), key=lambda item: (-item[1], item[0])):
        if short <= 0:
            break
        if held > 0:
            chosen.append(job)
            short -= held
    return chosen if short <= 0 else None
