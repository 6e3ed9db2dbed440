"""The job-side view of what gpuq gave this process.

A training script calls `current()` to learn its GPUs, device and memory budget from the environment
gpuq sets for every job (`GPUQ_*`, `CUDA_VISIBLE_DEVICES`); the same calls work outside gpuq, where they
fall back to what plain PyTorch would do. Nothing here imports torch until a method needs it, so reading
an allocation costs nothing in a job that never touches CUDA.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TORCHRUN = "torchrun"


@dataclass(frozen=True)
class Allocation:
    """What gpuq allocated to this job, read from its environment.

    `gpus` are physical indices (in PCI bus order); inside the job they appear as cuda:0, cuda:1, ...
    `mem_per_gpu` is the number of bytes the job asked for with --mem, or None when it got whole GPUs.
    `mode` is "single", "dataparallel" or "torchrun". `local_rank` is torchrun's LOCAL_RANK, if any.
    """

    job_id: int | None
    name: str | None
    gpus: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    mem_per_gpu: int | None
    mode: str
    local_rank: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Allocation:
        """Read the allocation from `env` (default: os.environ).

        Outside gpuq, job_id and name are None, gpus come from CUDA_VISIBLE_DEVICES when it holds
        indices, and mode is "torchrun" when torchrun's LOCAL_RANK is set, else "single".
        Raises ValueError naming the variable when a value gpuq sets is malformed.
        """
        env = os.environ if env is None else env
        if "GPUQ_GPUS" in env:
            gpus = _indices(env["GPUQ_GPUS"], "GPUQ_GPUS", strict=True)
        else:
            gpus = _indices(env.get("CUDA_VISIBLE_DEVICES", ""), "CUDA_VISIBLE_DEVICES", strict=False)
        local_rank = _optional_int(env, "LOCAL_RANK")
        mode = env.get("GPUQ_MODE") or (TORCHRUN if local_rank is not None else "single")
        mem_per_gpu = _optional_int(env, "GPUQ_MEM_PER_GPU")
        if mem_per_gpu is not None and mem_per_gpu <= 0:
            raise ValueError(f"GPUQ_MEM_PER_GPU must be a positive number of bytes, not {mem_per_gpu}")
        return cls(
            job_id=_optional_int(env, "GPUQ_JOB_ID"),
            name=env.get("GPUQ_JOB_NAME") or None,
            gpus=gpus,
            gpu_uuids=tuple(uuid for uuid in env.get("GPUQ_GPU_UUIDS", "").split(",") if uuid),
            mem_per_gpu=mem_per_gpu,
            mode=mode,
            local_rank=local_rank,
        )

    @property
    def under_gpuq(self) -> bool:
        """True when gpuq launched this process."""
        return self.job_id is not None

    @property
    def under_torchrun(self) -> bool:
        """True when this is one of several processes, one per GPU, that torchrun started."""
        return self.mode == TORCHRUN or self.local_rank is not None

    def device(self, disable_cuda: bool = False) -> torch.device:
        """The device this process should compute on.

        cuda:<LOCAL_RANK> under torchrun, else cuda:0; cpu when CUDA is unavailable or disabled.
        """
        import torch

        if disable_cuda or not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", self.local_rank or 0)

    def wrap(self, model: torch.nn.Module, disable_cuda: bool = False) -> torch.nn.Module:
        """Move `model` to `device()`, in nn.DataParallel when it has several GPUs to itself.

        Under torchrun the model is only moved: wrapping it in DistributedDataParallel needs the
        process group, which the script owns.
        """
        import torch

        device = self.device(disable_cuda)
        model = model.to(device)
        if device.type == "cuda" and not self.under_torchrun and torch.cuda.device_count() > 1:
            return torch.nn.DataParallel(model)
        return model

    def cap_memory(self) -> float | None:
        """Cap PyTorch's CUDA memory at the --mem the job asked for, on each GPU it uses.

        Returns the fraction of this process's device now allowed, or None when there was nothing to
        cap (whole GPUs, or no CUDA). Memory outside PyTorch's allocator (the CUDA context, about
        0.5 GiB, NCCL buffers) is not counted by the cap.
        """
        if self.mem_per_gpu is None:
            return None
        import torch

        if not torch.cuda.is_available():
            return None
        # gpuq placed this job next to others on the strength of its --mem; PyTorch's caching allocator
        # would otherwise keep growing into the headroom a neighbour was promised. With the cap it
        # raises OutOfMemoryError in this job, at its own limit, instead of in someone else's job.
        own = self.device()
        # Under torchrun each rank caps only its own GPU: touching the others would put a CUDA
        # context on every GPU from every rank.
        indices = [own.index or 0] if self.under_torchrun else list(range(torch.cuda.device_count()))
        applied: float | None = None
        for index in indices:
            total = torch.cuda.get_device_properties(index).total_memory
            fraction = min(1.0, self.mem_per_gpu / total)
            torch.cuda.set_per_process_memory_fraction(fraction, index)
            if index == own.index:
                applied = fraction
        return applied


def current() -> Allocation:
    """The allocation of this process, read from os.environ."""
    return Allocation.from_env()


def _optional_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {value!r}") from None


def _indices(value: str, name: str, strict: bool) -> tuple[int, ...]:
    """Parse a comma-separated list of GPU indices.

    strict: every entry must be an index (gpuq wrote it). Otherwise read it the way CUDA does for
    CUDA_VISIBLE_DEVICES and stop at the first entry that is not a valid index ("-1" hides the rest);
    UUID entries are not indices, so they give no index either.
    """
    indices: list[int] = []
    entries = [part.strip() for part in value.split(",")] if value.strip() else []
    for entry in entries:
        if entry.isdecimal():
            indices.append(int(entry))
        elif strict:
            raise ValueError(f"{name} must list GPU indices like '2,3', not {value!r}")
        else:
            break
    return tuple(indices)
