"""The fast suspend's mechanism for the fake inventory (tests: no GPU), loaded by ``jobs.fastsuspend`` in place
of ``fastmove`` in a fake CUDA process that allocates as PyTorch would (``$GPUQ_FAKE_USAGE/<pid>.torch``
beside what it holds, ``<pid>.json``: tests/fixtures/fake_cuda.py). As the real one, it needs PyTorch's
expandable segments, moves all the process holds but its context (CONTEXT bytes, left to the driver's
checkpoint) and what its ``<pid>.torch`` says PyTorch does not hold (bytes per GPU, if any) into host memory
it holds itself (a real buffer of that size, scaled down by SCALE: the fake's
gigabytes are not this machine's), gives that GPU memory back, and puts it all back at the restore; with
``keep`` the host memory stays held for the next suspend (a pool). Its state lives in the process alone, as
the real one's: a daemon's death does not touch it. What it holds in host memory, unscaled, it says in
``<pid>.pinned`` beside its usage: the fake host's available memory leaves that out (``hostmem``), as a real
host's leaves out pinned memory.
"""

from __future__ import annotations

import json
import mmap
import os
import pathlib
import threading
from typing import Any

CONTEXT = 512 << 20  # what a fake CUDA process holds for its context (tests/fixtures/fake_cuda.py)
SCALE = 1 << 10  # host bytes held per byte moved: 1 KiB per MiB, so 60 GiB of fake GPU memory holds 60 MiB


class NotApplicable(Exception):
    """As ``fastmove.NotApplicable``."""


def applies() -> bool:
    """Whether this process is a fake CUDA process that allocates through (fake) PyTorch."""
    usage = os.environ.get("GPUQ_FAKE_USAGE")
    return bool(usage) and (pathlib.Path(str(usage)) / f"{os.getpid()}.torch").exists()


class Mover:
    """``fastmove.Mover``'s interface over the fake process's usage file."""

    def __init__(self, keep: bool = False) -> None:
        self.keep = keep
        self.moved = 0
        self.steps: dict[str, float] = {}
        self.pool: list[mmap.mmap] = []
        self.held: tuple[dict[str, Any], mmap.mmap, int] | None = None
        self.unpinning: threading.Thread | None = None
        self.usage = pathlib.Path(os.environ["GPUQ_FAKE_USAGE"]) / f"{os.getpid()}.json"

    @property
    def kept(self) -> int:
        return sum(len(buffer) for buffer in self.pool) * SCALE

    def _pinned(self) -> None:
        held = len(self.held[1]) * SCALE if self.held is not None else 0
        temp = self.usage.with_suffix(".pinning")
        temp.write_text(json.dumps({"bytes": held + self.kept}))
        temp.replace(self.usage.with_suffix(".pinned"))

    def unpin_all(self, hosts: list[mmap.mmap]) -> None:
        for host in hosts:
            host.close()  # unmapped: the process's resident memory falls
        hosts.clear()
        self._pinned()

    def drop(self) -> None:
        pool, self.pool = self.pool, []
        self.unpin_all(pool)

    def _write(self, data: dict[str, Any]) -> None:
        temp = self.usage.with_suffix(".fastmove")
        temp.write_text(json.dumps(data))
        temp.replace(self.usage)

    def release(self) -> int:
        if self.held is not None:
            return self.held[2]  # released already (a second request)
        if self.unpinning is not None:
            self.unpinning.join()
        if "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            raise NotApplicable("PyTorch's memory is not in expandable segments (PYTORCH_CUDA_ALLOC_CONF)")
        data = json.loads(self.usage.read_text())
        stays = CONTEXT + int(self.usage.with_suffix(".torch").read_text() or 0)  # and what PyTorch does not hold
        moved = sum(max(0, int(v) - stays) for k, v in data.items() if k != "busy")
        if self.pool and len(self.pool[-1]) * SCALE >= moved:
            host = self.pool.pop()
        else:
            host = mmap.mmap(-1, max(1, moved // SCALE))
            for at in range(0, len(host), mmap.PAGESIZE):
                host[at] = 1  # touched: resident, as pinned memory is
        self._write({k: (min(int(v), stays) if k != "busy" else v) for k, v in data.items()})
        self.held = (data, host, moved)
        self._pinned()
        return moved

    def restore(self) -> int:
        if self.held is None:
            return 0
        data, host, moved = self.held
        self._write(data)
        self.held = None
        if self.keep:
            self.pool.append(host)
        else:  # nothing kept, a pool larger than this copy needed included
            host.close()
            for spare in self.pool:
                spare.close()
            self.pool = []
        self._pinned()
        return moved
