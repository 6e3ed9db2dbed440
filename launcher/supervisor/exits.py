"""What a shim says in a job's exit file (``run/<id>.exit``) about how the job's process ended: one definition
for the shim that writes it (``supervisor.shim``) and the daemon that reads it (``daemon.outcomes``). A field
missing, unknown or of the wrong type is an error, never a default: the file is written whole, by the shim
of this same installation."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class Stop(str, enum.Enum):
    """Whether the shim stopped the job, and why; stored as its value in the exit file's ``reason``."""

    NONE = ""  # the shim sent no signal: the job ended by itself (or by a signal from elsewhere)
    CANCEL = "cancel"  # a cancel came (down the pipe, or as a SIGTERM to the shim)
    TIMEOUT = "timeout"  # its time limit passed


class BadExitFile(ValueError):
    """An exit file that is there, whole JSON, and not what a shim writes."""


@dataclasses.dataclass(frozen=True)
class ExitFile:
    """How one job's process ended, as its shim saw it."""

    job: int
    ended_at: float  # wall clock, for the record
    started: bool  # False: the job never started (dropped while staged): it may be placed again
    dropped: bool = False  # the shim gave back a job staged behind the one it ran
    spawn_error: str | None = None  # the program could not be started: why
    exit_code: int | None = None  # None when a signal ended it (or it never started)
    signal: int | None = None
    reason: Stop = Stop.NONE
    # What the job's containment saw (``launcher.supervisor.containment.end``): oom_kills, ram_limit, pids_limit,
    # pids_refused, outlived, cpu_seconds, peak_ram, each there only when known.
    contained: dict[str, object] = dataclasses.field(default_factory=dict)
    next: int | None = None  # the job staged behind this one, which its shim started as this one ended

    def to_json(self) -> dict[str, Any]:
        # Field by field, not dataclasses.asdict (a deep copy, 23 us against 3): the shim writes this between
        # one job's end and the next one's start.
        data = {field.name: getattr(self, field.name) for field in _FIELDS}
        data["reason"], data["contained"] = self.reason.value, dict(self.contained)
        return data

    @classmethod
    def from_json(cls, data: object) -> ExitFile:
        if not isinstance(data, dict):
            raise BadExitFile("it is not a JSON object")
        names = {field.name for field in dataclasses.fields(cls)}
        unknown, missing = sorted(set(data) - names), sorted(names - set(data))
        if unknown or missing:
            raise BadExitFile(f"unknown fields {unknown}, missing fields {missing}")
        for name, kinds in _KINDS.items():
            value = data[name]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise BadExitFile(f"its {name} is {value!r}")
        try:
            reason = Stop(data["reason"])
        except ValueError:
            raise BadExitFile(f"it names an ending gpuq does not know: {data['reason']!r}") from None
        return cls(**{**data, "ended_at": float(data["ended_at"]), "reason": reason})


_FIELDS = dataclasses.fields(ExitFile)
_KINDS: dict[str, tuple[type, ...]] = {
    "job": (int,),
    "ended_at": (int, float),
    "started": (bool,),
    "dropped": (bool,),
    "spawn_error": (str, type(None)),
    "exit_code": (int, type(None)),
    "signal": (int, type(None)),
    "reason": (str,),
    "contained": (dict,),
    "next": (int, type(None)),
}
