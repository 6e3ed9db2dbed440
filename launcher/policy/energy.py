"""Which job used a GPU's energy: pure, over one sampling interval of one GPU (docs/watchdog.md, "What a
job cost").

NVML measures a GPU's energy, not a process's. So the energy a GPU used between two samples is split among
the jobs that were given that GPU, in proportion to the memory each held there at the sample: a job alone
on its GPUs gets all of its GPUs' energy; packed jobs share it as they share the memory. Processes outside
gpuq (a teammate's notebook) take their part by the same rule, charged to nobody. Memory is what gpuq can
measure for every process, MPS clients included (NVML files their compute under the MPS server), and it is
what a packed job was given. When no one holds any memory there (jobs starting, before their CUDA context
exists), the jobs given the GPU share it equally.
"""

from __future__ import annotations

from collections.abc import Mapping


def split(joules: float, held: Mapping[int, int], outside: int = 0) -> dict[int, float]:
    """``joules`` a GPU used over one interval, split among the jobs given it (``held``: job -> the bytes its
    processes held there at the sample) and the processes outside gpuq (``outside`` bytes, charged to none)."""
    if joules <= 0 or not held:
        return {}
    weight = sum(held.values()) + max(outside, 0)
    if weight <= 0:
        return {job: joules / len(held) for job in held}
    return {job: joules * max(used, 0) / weight for job, used in held.items()}
