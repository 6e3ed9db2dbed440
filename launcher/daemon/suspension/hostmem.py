"""The host's memory as a suspend needs it: what is available (``/proc/meminfo``, or the fake host beside the
fake inventory), the margin a suspend leaves free, and what a process holds resident. Read by the daemon's
checks (``suspending``, ``preempting``) and by the suspend helper's check of the fast path (``fastpath``)."""

from __future__ import annotations

import glob
import json
import os

from gpuq_scheduler.jobs.units import parse_size

MARGIN = 2 << 30  # bytes of host memory left free beyond a job's GPU state, at the least...
MARGIN_SHARE = 0.05  # ...or this share of the host's memory: a suspend never pushes the box into swap


def host_memory(fake: bool = False) -> tuple[int, int]:
    """The host's available and total memory, bytes (/proc/meminfo). Beside the fake inventory, a fake host:
    GPUQ_FAKE_HOST_MEMORY (a size, its total), where set, less what the live fake CUDA processes hold in host
    memory, as a real host's available memory leaves out a checkpoint's copy and pinned buffers."""
    if fake and os.environ.get("GPUQ_FAKE_HOST_MEMORY"):
        size = parse_size(os.environ["GPUQ_FAKE_HOST_MEMORY"])
        return max(0, size - _fake_held(os.environ.get("GPUQ_FAKE_USAGE"))), size
    found: dict[str, int] = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("MemAvailable", "MemTotal"):
                found[key] = int(value.split()[0]) * 1024
    return found.get("MemAvailable", 0), found.get("MemTotal", 0)


def _fake_held(usage: str | None) -> int:
    """Host memory the live fake CUDA processes in ``usage`` hold: the fake driver's checkpoints
    (``<pid>.host``: GPU -> bytes, ``gpus.checkpoint.FakeCheckpoint``) and the fake fast path's pinned
    buffers, its pool included (``<pid>.pinned``, ``jobs.fastmove_fake``)."""
    if not usage:
        return 0
    held = 0
    for kind in ("host", "pinned"):
        for path in glob.glob(os.path.join(glob.escape(usage), f"*.{kind}")):
            pid = os.path.basename(path).partition(".")[0]
            if not pid.isdigit() or not os.path.exists(f"/proc/{pid}"):
                continue  # gone: what it held went with it
            try:
                with open(path) as handle:
                    found = json.load(handle)
            except (OSError, ValueError):
                continue
            if isinstance(found, dict):
                values = [found.get("bytes")] if kind == "pinned" else [v for k, v in found.items() if k != "busy"]
                held += sum(v for v in values if isinstance(v, int) and not isinstance(v, bool))
    return held


def margin(total: int) -> int:
    """Bytes a suspend leaves free on a host of ``total`` bytes."""
    return max(MARGIN, int(total * MARGIN_SHARE))


def room(cgroup: str | None) -> int | None:
    """Host memory a job may still take under its limit (``--ram``): its cgroup's ``memory.max`` less what it
    holds that cannot be reclaimed (``memory.current`` less its file pages, which the kernel gives back
    first; there is no swap for it: gpuq sets ``memory.swap.max`` 0). None where it has no limit (no
    cgroup, or no memory controller there); a job with --ram always has one."""
    if cgroup is None:
        return None
    try:
        with open(f"{cgroup}/memory.max") as limit, open(f"{cgroup}/memory.current") as current:
            most, used = limit.read().strip(), int(current.read())
        if most == "max":
            return None
        with open(f"{cgroup}/memory.stat") as stat:
            files = sum(int(line.split()[1]) for line in stat if line.split()[0] in ("active_file", "inactive_file"))
        return max(0, int(most) - used + files)
    except (OSError, ValueError, IndexError):
        return None


def resident(pid: int) -> int:
    """Bytes process ``pid`` holds resident (its RSS: pinned host memory included); 0 if it is gone."""
    import psutil  # the daemon's already; here only when a pool is weighed

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0
