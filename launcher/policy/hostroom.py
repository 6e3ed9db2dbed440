"""Whether a suspend's copy of a job's GPU state fits in host memory (#40). Pure: the figures come in, a
reason to refuse goes out.

Both ways of suspending keep the copy in the job's own processes, charged to its cgroup: the fast path in
pinned buffers, the driver's checkpoint in memory of its own (measured on a lent H200: a job with 4 GiB on
its GPU and 1 GiB of room under its memory.max was killed by the kernel in the driver's checkpoint,
bench/results/h200-fastsuspend-2026-11-29b). So a copy that does not fit is refused, whichever way it
would go: the job is left running, never killed.
"""

from __future__ import annotations

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
