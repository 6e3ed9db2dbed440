"""Which GPUs gpuq looks at: the fake inventory when ``GPUQ_FAKE_GPUS`` is set, else real ones (NVML)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpuq_scheduler.launcher.gpus.snapshot import GpuSource


def open_source(environ: Mapping[str, str] | None = None) -> GpuSource:
    """The fake inventory when GPUQ_FAKE_GPUS is set, else NVML; no GPUs at all when NVML is absent."""
    environ = os.environ if environ is None else environ
    fake = environ.get("GPUQ_FAKE_GPUS", "").strip()
    if fake:
        from gpuq_scheduler.launcher.gpus.fake import FakeGpus

        return FakeGpus(fake, environ.get("GPUQ_FAKE_USAGE"))
    from gpuq_scheduler.launcher.gpus.nvml import NvmlGpus

    return NvmlGpus()


def usable_gpus(environ: Mapping[str, str] | None = None) -> int:
    """How many GPUs gpuq would place on now (lost ones left out): 0 on a machine without any."""
    source = open_source(environ)
    try:
        return sum(1 for gpu in source.snapshot() if not gpu.lost)
    finally:
        source.close()
