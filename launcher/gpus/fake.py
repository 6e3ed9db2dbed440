"""The fake inventory of ``GPUQ_FAKE_GPUS``, for machines without GPUs: GPUs that hold memory, fill up and
get lost, like real ones. Either a spec (``4x80GiB``, ``2x24GiB,2x48GiB``) or the path of a JSON file
re-read at every snapshot, so a test can play a teammate filling a GPU or a GPU falling off the bus::

    {"gpus": [{"name": "A100", "total": "80GiB", "used": "30GiB", "util": 35}, {"total": "80GiB", "lost": true}]}

(``util``, optional: the GPU's utilisation in percent, as NVML would report it. ``processes``, optional: the
processes outside gpuq holding memory there, ``[{"pid": 4242, "used": "2GiB"}]``, listed as NVML lists them
while they live; their memory counts as used.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.units import parse_size
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot

_SPEC_PART = re.compile(r"^\s*(?:(\d+)\s*x\s*)?(\S+?)\s*$", re.IGNORECASE)


class FakeGpus:
    """GPUs that exist only on paper but behave: they hold memory, fill up, and get lost.

    ``usage`` (``GPUQ_FAKE_USAGE``), when given, is where fake CUDA programs (tests/fixtures/fake_cuda.py)
    say what they hold: ``<pid>.json`` = {"<gpu index>": bytes}. A snapshot lists each live one as NVML lists
    a process, so gpuq sees its jobs' peaks on fake GPUs as it does on real ones."""

    def __init__(self, spec: str, usage: str | None = None) -> None:
        self.spec = spec
        self._born = time.monotonic()  # its energy counters start here, as a driver's do when it loads
        self._usage = Path(usage) if usage else None
        self._path = Path(spec) if spec.endswith(".json") or os.path.sep in spec else None
        if self._path is None:
            self._fixed = parse_fake_spec(spec)
        else:
            self.snapshot()  # fail now, at start-up, if the file is unreadable

    def snapshot(self, *, energy: bool = False, process_utilization: bool = False) -> list[GpuSnapshot]:
        if self._path is None:
            gpus = list(self._fixed)
        else:
            try:
                data = json.loads(self._path.read_text())
            except (OSError, ValueError) as err:
                raise BadInput(f"GPUQ_FAKE_GPUS={self._path}: cannot read it ({err}); fix the JSON file") from None
            gpus = parse_fake_json(data, str(self._path))
        if energy:  # read only when asked, as from NVML, where it is dear
            used = round((time.monotonic() - self._born) * FAKE_WATTS * 1000)
            gpus = [gpu if gpu.lost else dataclasses.replace(gpu, energy=used) for gpu in gpus]
        return self._with_processes(gpus, process_utilization) if self._usage is not None else gpus

    def _with_processes(self, gpus: list[GpuSnapshot], shares: bool) -> list[GpuSnapshot]:
        assert self._usage is not None
        held: dict[int, dict[int, int]] = {}
        busy: dict[int, dict[int, int]] = {}
        for report in self._usage.glob("*.json"):
            try:
                pid = int(report.stem)
                if not _holds_memory(pid):  # a process that died without saying so holds nothing, as on a real GPU
                    continue
                said = json.loads(report.read_text())
                share = said.pop("busy", None)  # the process's share of its GPUs' time, percent
                for index, size in said.items():
                    held.setdefault(int(index), {})[pid] = int(size)
                    if share is not None:
                        busy.setdefault(int(index), {})[pid] = int(share)
            except (ValueError, OSError, AttributeError, TypeError):
                continue
        return [
            dataclasses.replace(
                gpu,
                used=min(gpu.total, gpu.used + sum(held[gpu.index].values())),
                processes={**(gpu.processes or {}), **held[gpu.index]},
                process_utilization=busy.get(gpu.index, {}) if shares else None,
            )
            if gpu.index in held and not gpu.lost
            else gpu
            for gpu in gpus
        ]

    def distance(self, a: int, b: int) -> int | None:
        return None

    def close(self) -> None:
        pass


FAKE_WATTS = 100  # what every fake GPU draws, steadily: its energy counter grows 100 J a second
TEAMMATE_PID = (1 << 22) + 1  # the fake's "used" memory: a process outside gpuq, past Linux's largest pid


def _fake(index: int, name: str, total: int, used: int = 0, lost: bool = False) -> GpuSnapshot:
    return GpuSnapshot(
        index=index,
        uuid=f"GPU-fake-{index:04d}",
        name=name,
        total=total,
        used=used,
        processes={TEAMMATE_PID: used} if used else {},
        lost=lost,
        error="GPU lost (fake inventory)" if lost else "",
    )


def parse_fake_spec(spec: str) -> list[GpuSnapshot]:
    gpus: list[GpuSnapshot] = []
    for part in spec.split(","):
        match = _SPEC_PART.match(part)
        if not match:
            raise BadInput(f"GPUQ_FAKE_GPUS={spec!r}: write it like 4x80GiB or 2x24GiB,2x48GiB")
        count = int(match.group(1) or 1)
        try:
            total = parse_size(match.group(2))
        except BadInput as err:
            raise BadInput(f"GPUQ_FAKE_GPUS={spec!r}: {err}; write it like 4x80GiB or 2x24GiB,2x48GiB") from None
        gpus.extend(_fake(len(gpus), "Fake GPU", total) for _ in range(count))
    return gpus


def parse_fake_json(data: Any, where: str) -> list[GpuSnapshot]:
    items = data.get("gpus") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise BadInput(f'GPUQ_FAKE_GPUS={where}: expected a list of GPUs or {{"gpus": [...]}}')
    gpus = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or "total" not in item:
            raise BadInput(f'GPUQ_FAKE_GPUS={where}: GPU {index} needs at least a total, like {{"total": "80GiB"}}')
        total, used = _bytes(item["total"], where), _bytes(item.get("used", 0), where)
        util = item.get("util")
        if util is not None and (not isinstance(util, int) or isinstance(util, bool) or not 0 <= util <= 100):
            raise BadInput(f"GPUQ_FAKE_GPUS={where}: GPU {index}'s util must be a whole percent from 0 to 100")
        gpu = _fake(index, str(item.get("name", "Fake GPU")), total, min(used, total), bool(item.get("lost")))
        listed = _listed(item.get("processes", []), index, where)
        if listed and not gpu.lost:
            held = min(total, used + sum(listed.values()))
            gpu = dataclasses.replace(gpu, used=held, processes={**(gpu.processes or {}), **listed})
        gpus.append(dataclasses.replace(gpu, utilization=util))
    return gpus


def _listed(processes: Any, index: int, where: str) -> dict[int, int]:
    """A GPU's ``processes``: pid -> bytes, those alive only (the driver lists no process that ended)."""
    if not isinstance(processes, list):
        raise BadInput(f'GPUQ_FAKE_GPUS={where}: GPU {index}\'s processes: a list like [{{"pid": 42, "used": "2GiB"}}]')
    found = {}
    for entry in processes:
        pid = entry.get("pid") if isinstance(entry, dict) else None
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise BadInput(f"GPUQ_FAKE_GPUS={where}: GPU {index}'s processes each need a pid, a positive number")
        if _holds_memory(pid):
            found[pid] = _bytes(entry.get("used", 0), where)
    return found


def _bytes(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            return 0 if value.strip() in ("0", "") else parse_size(value)
        except BadInput as err:
            raise BadInput(f"GPUQ_FAKE_GPUS={where}: {err}") from None
    raise BadInput(f"GPUQ_FAKE_GPUS={where}: {value!r} is not a size")


def _holds_memory(pid: int) -> bool:
    """Whether ``pid`` is a live process: a zombie (ended, not yet reaped: an orphan whose new parent is slow
    to reap it) holds no GPU memory, as the driver frees it at exit, though ``kill(pid, 0)`` still finds it."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False
