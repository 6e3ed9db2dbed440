"""Who holds GPU memory outside gpuq, named: per process the driver lists on a GPU (NVML's compute and
graphics processes; the fake inventory's alike) that is none of gpuq's, its user and command name from
/proc, as nvidia-smi and canhazgpu name them. A desktop's own processes (the X server, the compositor) are
told apart: they hold a little memory on a workstation's display GPU by design, and are nobody's to chase.

A pid the driver lists that /proc does not show (a process in another pid namespace, or the fake
inventory's anonymous "used" memory) is named "?": the memory is still counted, only its owner is unknown.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuq_scheduler.jobs.units import format_size
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot

# /proc/PID/comm of the display server and compositors (15 characters at most, as the kernel keeps it).
DESKTOP = frozenset(
    {
        "Xorg",
        "X",
        "Xwayland",
        "gnome-shell",
        "kwin_x11",
        "kwin_wayland",
        "plasmashell",
        "gdm-x-session",
        "mutter",
        "sddm-greeter",
        "xfwm4",
        "cinnamon",
        "compiz",
        "sway",
        "Hyprland",
        "weston",
        "gnome-remote-de",
        "kwin",
    }
)


@dataclass(frozen=True)
class Holder:
    gpu: int
    pid: int
    user: str
    name: str
    used: int

    @property
    def desktop(self) -> bool:
        return self.name in DESKTOP

    def words(self) -> str:
        return f"GPU {self.gpu}: {self.user} (pid {self.pid} {self.name}, {format_size(self.used)})"

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "pid": self.pid, "user": self.user, "name": self.name, "used": self.used}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Holder:
        return cls(int(data["gpu"]), int(data["pid"]), str(data["user"]), str(data["name"]), int(data["used"]))


def outside(snapshot: Sequence[GpuSnapshot], ours: set[int] | frozenset[int]) -> list[Holder]:
    """Every process holding memory on a GPU that is not one of ``ours`` (gpuq's jobs and fence), named."""
    found = []
    for gpu in snapshot:
        for pid, used in sorted((gpu.processes or {}).items()):
            if pid in ours or used <= 0:
                continue
            user, name = _named(pid)
            found.append(Holder(gpu.index, pid, user, name, used))
    return found


def lines(holders: Sequence[Holder]) -> list[str]:
    """'outside gpuq: GPU 0: bob (pid 4242 python, 2.0G); ...', and the desktop's apart: a line each, or none."""
    said = []
    others = [h.words() for h in holders if not h.desktop]
    desktop = [h.words() for h in holders if h.desktop]
    if others:
        said.append("outside gpuq: " + "; ".join(others))
    if desktop:
        said.append("desktop (outside gpuq): " + "; ".join(desktop))
    return said


def _named(pid: int) -> tuple[str, str]:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        with open(f"/proc/{pid}/comm", "rb") as handle:
            name = handle.read(64).decode(errors="replace").strip() or "?"
    except OSError:
        return "?", "?"
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return user, name
