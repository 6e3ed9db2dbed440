"""The tools the harness compares: task-spooler, simple_gpu_scheduler, Slurm and gpuq."""

from __future__ import annotations

from bench.peers.base import Tool, ToolError
from bench.peers.gpuq import Gpuq
from bench.peers.sgs import SimpleGpuScheduler
from bench.peers.slurm import Slurm
from bench.peers.tsp import TaskSpooler

TOOLS: dict[str, type[Tool]] = {"tsp": TaskSpooler, "sgs": SimpleGpuScheduler, "slurm": Slurm, "gpuq": Gpuq}

__all__ = ["TOOLS", "Gpuq", "SimpleGpuScheduler", "Slurm", "TaskSpooler", "Tool", "ToolError"]
